"""The plan as users apply it: `apply_plan` and its helpers, copied verbatim into
fp32_plan.py (torch and functools only, no trtbisect), so the verified plan and the shipped
code cannot drift apart."""

from __future__ import annotations

import functools

import torch


def apply_plan(model, fp32_modules, mode="half", dtype=torch.float16):
    """Keep `fp32_modules` (dotted paths, as named_modules() lists them) in FP32.

    mode "half": stores every other parameter and buffer in `dtype` (what model.to(dtype) does);
    each listed module gets FP32 weights, runs on FP32 copies of its inputs and casts its
    outputs back to its inputs' dtype. Feed the model inputs of `dtype`.
    mode "autocast": weights stay FP32; each listed module runs with autocast disabled on FP32
    inputs and returns FP32. Call the model under torch.autocast(...).
    Changes `model` in place (apply it to a copy to keep the original) and returns it.
    """
    names = list(fp32_modules)
    modules = {name: model.get_submodule(name) for name in names}  # fails early on a typo
    if mode == "half":
        for path, module in model.named_modules():
            if not any(path == n or path.startswith(n + ".") for n in names):
                _convert_own_tensors(module, dtype)
            else:
                _convert_own_tensors(module, torch.float32)
    for module in modules.values():
        module.forward = _fp32_forward(module.forward, restore=(mode == "half"))
    return model


def _convert_own_tensors(module, dtype):
    for param in module.parameters(recurse=False):
        if param.is_floating_point():
            param.data = param.data.to(dtype)
    for name, buf in list(module.named_buffers(recurse=False)):
        if buf.is_floating_point():
            setattr(module, name, buf.to(dtype))


def _fp32_forward(forward, restore):
    """`forward` run in FP32: autocast off, float inputs as float32; with `restore`, float
    outputs cast back to the dtype of the first float input."""

    @functools.wraps(forward)
    def fp32_forward(*args, **kwargs):
        dtype = _first_float_dtype((args, kwargs))
        with torch.autocast(_device_type((args, kwargs)), enabled=False):
            out = forward(*_to_dtype(args, torch.float32), **_to_dtype(kwargs, torch.float32))
        if restore and dtype is not None and dtype != torch.float32:
            out = _to_dtype(out, dtype)
        return out

    return fp32_forward


def _to_dtype(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_to_dtype(v, dtype) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_dtype(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _to_dtype(v, dtype) for k, v in value.items()}
    return value


def _first_float_dtype(value):
    if isinstance(value, torch.Tensor):
        return value.dtype if value.is_floating_point() else None
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, (list, tuple, dict)):
        for v in items:
            found = _first_float_dtype(v)
            if found is not None:
                return found
    return None


def _device_type(value):
    if isinstance(value, torch.Tensor):
        return value.device.type
    if isinstance(value, (list, tuple, dict)):
        for v in (value.values() if isinstance(value, dict) else value):
            if isinstance(v, (torch.Tensor, list, tuple, dict)):
                found = _device_type(v)
                if found != "cpu":
                    return found
    return "cpu"


SNIPPET_FUNCTIONS = (apply_plan, _convert_own_tensors, _fp32_forward, _to_dtype,
                     _first_float_dtype, _device_type)

"""Initializers held by reference: a store (`Weights`) that memory-maps external data and
takes large embedded data out of the proto, and `structure`, a model's copy without weight
data (for shape inference and session protos)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import TrtBisectError, first_line

STORE_LOCATION = "trtbisect:store"  # marks an initializer whose data a Weights store holds
SMALL_BYTES = 1024  # initializers up to this size stay inside session protos


def initializer_array(t: TensorProto) -> np.ndarray:
    """An embedded tensor's values; data that disagrees with its shape (raw data longer or
    shorter than the shape needs: a damaged or hand-edited file) is a one-line error."""
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError) as exc:
        shape = "x".join(map(str, t.dims)) or "scalar"
        held = f" holds {len(t.raw_data)} bytes of raw data;" if t.raw_data else ""
        raise TrtBisectError(f"initializer {t.name!r} does not match its shape {shape}:{held} "
                             f"{first_line(exc)} (a damaged or hand-edited model?)") from None


class Weights:
    """Initializer arrays by name: read once, shared by every session, never copied into a proto.

    External data is memory-mapped from its file; embedded data is taken out of the proto when
    the graph owns it (`Graph.from_path`), so the weights are held once.
    """

    def __init__(self, model: onnx.ModelProto, base_dir: Path | None, own: bool,
                 parent: Weights | None = None) -> None:
        self.base_dir = base_dir
        self.parent = parent  # holds what this model's store-marked initializers name
        self._protos = {t.name: t for t in model.graph.initializer}
        self._raw: dict[str, np.ndarray] = {}
        self._float: dict[str, np.ndarray] = {}
        if own:
            for t in model.graph.initializer:
                if t.data_location != TensorProto.EXTERNAL and _payload_bytes(t) > SMALL_BYTES:
                    from ..base.spill import spill
                    self._raw[t.name] = spill(initializer_array(t))  # on disk, not twice
                    _mark_stored(t)

    def __contains__(self, name: str) -> bool:
        return name in self._protos

    def raw(self, name: str) -> np.ndarray:
        """The initializer's values in its own dtype (memory-mapped when external)."""
        if name not in self._raw:
            t = self._protos[name]
            if self.parent is not None and _is_stored(t) and name in self.parent:
                return self.parent.raw(name)  # held once, by the graph this one derives from
            self._raw[name] = self._map(t) if t.data_location == TensorProto.EXTERNAL \
                else initializer_array(t)
        return self._raw[name]

    def array(self, name: str) -> np.ndarray:
        """The initializer's values; float16/bfloat16 come back as (exact) float32."""
        if self.parent is not None and name not in self._raw and _is_stored(self._protos[name]) \
                and name in self.parent:
            return self.parent.array(name)
        arr = self.raw(name)
        if arr.dtype == np.float16 or arr.dtype.name == "bfloat16":
            if name not in self._float:
                from ..base.spill import release_pages, spill
                self._float[name] = spill(arr.astype(np.float32))
                release_pages([arr])
            return self._float[name]
        return arr

    def _map(self, t: TensorProto) -> np.ndarray:
        info = {e.key: e.value for e in t.external_data}
        if info.get("location") == STORE_LOCATION or self.base_dir is None:
            raise TrtBisectError(f"the data of initializer {t.name!r} is not available")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        shape = tuple(t.dims)
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.zeros(shape, dtype)
        return np.memmap(self.base_dir / info["location"], dtype=dtype.newbyteorder("<"),
                         mode="c", offset=int(info.get("offset", 0) or 0), shape=shape)

    def nbytes(self, name: str) -> int:
        t = self._protos[name]
        count = int(np.prod(tuple(t.dims), dtype=np.int64))
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize

    def total_bytes(self) -> int:
        return sum(self.nbytes(n) for n in self._protos)


def _payload_bytes(t: TensorProto) -> int:
    return len(t.raw_data) if t.raw_data else 4 * int(np.prod(tuple(t.dims), dtype=np.int64))


def _is_stored(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == STORE_LOCATION for e in t.external_data)


def _mark_stored(t: TensorProto) -> None:
    """Drop a tensor's data from the proto; the store holds it."""
    for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
              "uint64_data", "string_data"):
        t.ClearField(f)
    del t.external_data[:]
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=STORE_LOCATION)


def structure(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model without weight data (for shape inference and session protos)."""
    out = onnx.ModelProto()
    g = model.graph
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(out, f, getattr(model, f))
    out.doc_string = model.doc_string
    out.opset_import.extend(model.opset_import)
    out.metadata_props.extend(model.metadata_props)
    out.functions.extend(model.functions)
    og = out.graph
    og.name = g.name
    og.node.extend(g.node)
    og.input.extend(g.input)
    og.output.extend(g.output)
    og.value_info.extend(g.value_info)
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL or _payload_bytes(t) > SMALL_BYTES:
            light = og.initializer.add()
            light.name, light.data_type = t.name, t.data_type
            light.dims.extend(t.dims)
            _mark_stored(light)
        else:
            og.initializer.append(t)
    return out


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a Constant node (None for sparse, string or external values)."""
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return None if a.t.data_location == TensorProto.EXTERNAL else initializer_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), np.float32)
    return None

"""The module-level AMP product (`trtbisect torch`): run an nn.Module in FP32 and in reduced
precision with chosen submodules kept FP32, compare it module by module through forward hooks,
and search for the smallest set of submodules to keep FP32 with the same search (and the same
`search.Oracle`) as `trtbisect run`. Not a backend: it plans modules, not ONNX nodes, so it
lives outside `backends/`.

A plan is a set of dotted module paths (as `named_modules()` names them). It means what
`apply_plan` does, and `apply_plan` is also what the user pastes (rendered verbatim into
fp32_plan.py), so the verified plan and the shipped code cannot drift apart:

* mode "half" (`model.half()`): every parameter and buffer outside the plan is stored in the
  reduced dtype; each planned module gets FP32 weights, runs on FP32 copies of its inputs, and
  casts its outputs back to its inputs' dtype (the CLIP `LayerNorm` idiom);
* mode "autocast" (AMP): weights stay FP32; each planned module runs with autocast disabled on
  FP32 inputs and returns FP32.

Kernels: on CUDA the real ones. On CPU, by default, an emulation that does what a GPU kernel
does with FP16 data: FP32 math on values stored in FP16, every aten op's result rounded to the
dtype the real op returns (`ReducedStorage`): the ORT emulator's semantics, per op. CPU
autocast's op lists (which ops it runs in FP16) differ from CUDA's: see docs/pytorch.md.
"""

"""SliceGPT (Ashkboos et al., ICLR 2024): slice the residual stream of a decoder-only LM.

Public API (import from the modules; this package import stays torch-free so that the HTTP side
can use `families` and `param_count` without loading torch):

- `core.families`: `family_from_config`, `refusal_reason`, `UnsupportedArchitectureError`
  (torch-free; for submit-time checks).
- `core.param_count`: `sliced_width`, `predict_dense_param_count`,
  `predict_sliced_param_count` (torch-free).
- `workers.architectures`: `FamilyAdapter`, `detect_family`, `adapter_for_family`.
- `workers.slicing.engine`: `slice_model`, `SlicingStopped` (the per-layer layout); its docstring
  lists SliceGPT's steps 1-6 and the module that does each.
- `workers.slicing.report`: `SlicingReport` and `SlicedWidths`, what both layouts return.
- `workers.slicing.stock`: `slice_model_stock`, the stock layout (one shared basis; the model stays
  the family's own architecture at hidden_size d).
- `workers.slicing.artifacts`: `save_sliced`, `load_sliced` (both layouts).
- `workers.slicing.portable`: the code per-layer checkpoints carry for `trust_remote_code` loading,
  which the engine imports too (the skip-connected modules, the weight accessors, the rebuild).
- `workers.slicing.fusion.fuse_model` and `workers.slicing.rotation.rotate_fused_model`:
  the computational-invariance steps on their own, for checks.
"""

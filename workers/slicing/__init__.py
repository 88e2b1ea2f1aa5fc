"""SliceGPT (Ashkboos et al., ICLR 2024): slice the residual stream of a decoder-only LM.

Public API (import from the modules; this package import stays torch-free so that the HTTP side
can use `families` and `param_count` without loading torch):

- `core.families`: `family_from_config`, `refusal_reason`, `UnsupportedArchitectureError`
  (torch-free; for submit-time checks).
- `core.param_count`: `sliced_width`, `predict_dense_param_count`,
  `predict_sliced_param_count` (torch-free).
- `workers.slicing.adapters`: `FamilyAdapter`, `detect_family`, `adapter_for_family`.
- `workers.slicing.engine`: `slice_model` -> `SlicingReport`, `SlicingStopped`.
- `workers.slicing.artifacts`: `save_sliced`, `load_sliced`.
- `workers.slicing.fusion.fuse_model` and `workers.slicing.rotation.rotate_fused_model`:
  the computational-invariance steps on their own, for checks.
"""

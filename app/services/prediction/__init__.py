"""Prediction as the API serves it: what POST /v1/predictions answers and what a curve draws, read from
the store (docs/science.md §2, "One answer per sparsity"); the arithmetic is in `core.prediction`.

- `answer`: one answer per metric and sparsity, from the best rung that can give it;
- `rungs`: each rung's estimate at one sparsity (measured, simulated, profile, law), with its band
  and the verdict of its own record;
- `series`: the measured series every law is fitted to, from the store or the caller;
- `law_values`: the calibrated and strict laws of a series;
- `simulated`: the stored simulations, and the simulated rung's record;
- `profile_rung`: the profile's feature law (chosen on other models, judged nested), before pruning;
- `scored_curves`: the store's measured curves with their profile features, and their backtests;
- `records`: backtest records as the API shows them;
- `curves`: one model's curve (points, laws, the answer) on a grid;
- `missing_jobs`: the jobs a better answer needs;
- `store_state`: the store's state in one read, so records are computed when it changes.
"""

"""Prediction's torch-free core: one answer per sparsity from the best rung that can give it, each
rung's honest record, and the bands they state (docs/science.md §2, "One answer per sparsity").

- `rungs`: what a rung is and the order they are preferred in (measured > simulated > profile > law);
- `records`: held-out misses scored by |ln(predicted / measured)|, pooled model -> curve -> point,
  and the verdict a record earns;
- `bands`: log-normal bands that never reach below the dense perplexity;
- `registry`: the predictor each rung uses per method, fixed in code with its reason.
"""

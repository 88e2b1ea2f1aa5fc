"""Simulated curves: a method's perplexity at every sparsity from passes over the dense model,
without pruning it (docs/science.md §2, "Simulated curves").

`simulate_curve` runs the evaluation windows once per requested sparsity, block by block (one block
on the device at a time, so offloaded models work), with the residual signals projected
(`projection`: SliceGPT) or the weights masked for one forward (`masking`: the intra-layer methods),
and scores them as the perplexity protocol does (`streams`). Anchors run the method itself through the
same passes. Which engine a method uses is its registry entry's `simulation` (`core.methods`).

Importing this package loads torch and transformers (the HTTP side never imports it).
"""

from workers.simulation.curve import (
    SimulatedPoint,
    SimulationOptions,
    SimulationReport,
    SimulationStopped,
    simulate_curve,
)
from workers.simulation.tracks import ANCHOR, SIMULATED

__all__ = [
    "ANCHOR",
    "SIMULATED",
    "SimulatedPoint",
    "SimulationOptions",
    "SimulationReport",
    "SimulationStopped",
    "simulate_curve",
]

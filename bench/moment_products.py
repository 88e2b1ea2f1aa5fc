"""What a basis stream's second moment costs with float64 and with float32 chunk products, side by
side, and how far apart the two moments and their kept spans are (issue 41, "cheaper bases").

A simulated SliceGPT curve's calibration streams run in bfloat16 where the device computes it
natively; each signal's moment C = sum x^T x is summed in float64 (`workers.slicing.pca`). This
times `SecondMoment.add` on one stream's signal (bfloat16, `--windows` x `--seqlen` positions of a
packaged model's width) both ways, interleaved `--repeats` times, and reports the seconds, their
ratio, the largest entry difference relative to C's largest entry, and what the float32 moment's
top-d span keeps of C against the exact one's, at d = (1 - s) D for s = 0.1..0.5: the energy it
misses as a share of the energy slicing drops (what a basis is for; angles inside near-equal
eigenvalues would say nothing). The signal is a real one: the dense model's residual stream after
block `--block` on WikiText-2 windows.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/moment_products.py --model smollm2-135m
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import harness
import torch

from workers.slicing.pca import SecondMoment, principal_basis

SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5)


def signal_of(args: Any) -> torch.Tensor:
    """The dense residual stream after block `args.block` on the first windows, in bfloat16."""
    settings = harness.settings_for(args)
    loaded = harness.load_dense(args.model, settings)
    ids = harness.wikitext_ids(loaded, settings)[: args.windows * args.seqlen].reshape(args.windows, -1)
    with torch.no_grad():
        out = loaded.model(ids, output_hidden_states=True)
    return out.hidden_states[args.block + 1].to(torch.bfloat16)


def moment(signal: torch.Tensor, products: torch.dtype) -> tuple[torch.Tensor, float]:
    keep = torch.ones(signal.shape[:2], dtype=torch.bool)
    made = SecondMoment(signal.shape[-1], torch.device("cpu"), products)
    started = time.perf_counter()
    made.add(signal, keep)
    return made.matrix, time.perf_counter() - started


def shortfall(exact: torch.Tensor, exact_basis: torch.Tensor, cheap_basis: torch.Tensor, kept: int) -> float:
    """(energy the exact top-`kept` span keeps - the cheap one's) / energy the exact span drops."""

    def energy(basis: torch.Tensor) -> float:
        return float(torch.trace(basis[:, :kept].T @ exact @ basis[:, :kept]))

    dropped = float(torch.trace(exact)) - energy(exact_basis)
    return (energy(exact_basis) - energy(cheap_basis)) / dropped


def main() -> None:
    made = harness.parser(__doc__, "moment_products")
    harness.add_store_args(made)
    harness.add_model_args(made)
    made.add_argument("--windows", type=int, default=24, help="a stream's windows (3/4 of 32)")
    made.add_argument("--seqlen", type=int, default=512)
    made.add_argument("--block", type=int, default=10)
    made.add_argument("--repeats", type=int, default=5)
    args = made.parse_args()
    harness.use_threads(args.threads)
    signal = signal_of(args)
    seconds: dict[str, list[float]] = {"float64": [], "float32": []}
    matrices = {}
    for _ in range(args.repeats):
        for name in seconds:
            matrices[name], elapsed = moment(signal, getattr(torch, name))
            seconds[name].append(elapsed)
    exact, cheap = matrices["float64"], matrices["float32"]
    width = exact.shape[0]
    _, exact_basis = principal_basis(exact)
    _, cheap_basis = principal_basis(cheap)
    shortfalls = {}
    for sparsity in SPARSITIES:
        kept = int((1 - sparsity) * width) // 8 * 8
        shortfalls[f"{sparsity:g}"] = shortfall(exact, exact_basis, cheap_basis, kept)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    report: dict[str, Any] = harness.start_report(
        model=args.model,
        positions=signal.shape[0] * signal.shape[1],
        width=width,
        seconds=seconds,
        median_seconds=medians,
        float32_over_float64=medians["float32"] / medians["float64"],
        max_entry_difference=float((cheap - exact).abs().max() / exact.abs().max()),
        energy_shortfall_over_dropped=shortfalls,
    )
    harness.finish_report(args.out, report)
    print(report)


if __name__ == "__main__":
    main()

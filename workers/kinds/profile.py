"""`profile` jobs: one dense pass that measures what slicing, and each unstructured mask rule, would
discard (workers.profiling).

Stages and the share of the job's progress each one covers:

    loading model  0.00-0.05
    calibration    0.05-0.10  the seeded windows a SliceGPT prune with the same spec would draw
                              (and the `measured_on` windows, when given)
    profiling      0.10-1.00  detail "block i/L"

Stored: one `profiles` row (calibration record, widths, timings, versions) with one
`profile_signals` row per residual signal (spectrum, token energies, lens readings) and one
`profile_linears` row per block linear (each mask rule's output error per sparsity). What a profile
costs against a dense pass and a slicing run is measured by `bench/predict_smollm2.py`.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from core.specs.profile import PROFILED_METHOD, ProfileJobCreate
from core.tables import Profile, ProfileLinear, ProfileSignal
from workers.context import JobContext, JobFailure
from workers.environment import run_environment
from workers.kinds.prune_steps import draw_calibration, lap
from workers.kinds.steps import load_for_job, step_reporter
from workers.offload import suspended
from workers.profiling import ProfileReport, ProfileStopped, profile_model

LOAD_END = 0.05
CALIBRATION_END = 0.10


HELD_OUT_SEED_OFFSET = 1_000_003
"""`measured_on` windows without a seed of their own draw with the job's seed plus this (a prime, so
no small seed of another job lands on it), never with the calibration's."""


def held_out_seed(job_seed: int) -> int:
    return (job_seed + HELD_OUT_SEED_OFFSET) % 2**31


def run(context: JobContext) -> None:
    spec = ProfileJobCreate.model_validate(context.request)
    started = time.perf_counter()
    context.report("loading model", 0.0, spec.model)
    source, loaded = load_for_job(context, spec)
    environment = run_environment(loaded.device, loaded.memory_plan)
    context.set_environment(environment)
    timings = {"load_s": lap(started)}

    context.report("calibration", LOAD_END, spec.calibration.corpus)
    calibration, record = draw_calibration(context, loaded, spec.calibration, spec.seed, PROFILED_METHOD)
    assert calibration is not None and record is not None  # slicing always calibrates
    measured, measured_record = None, None
    if spec.measured_on is not None:
        measured, measured_record = draw_calibration(
            context, loaded, spec.measured_on, held_out_seed(spec.seed), PROFILED_METHOD, avoid=calibration
        )
        assert measured is not None
    timings["calibration_s"] = lap(started) - timings["load_s"]

    progress = step_reporter(context, "profiling", CALIBRATION_END, 1.0, "block")
    profile_started = time.perf_counter()
    try:
        with suspended(loaded.model):  # the profile streams blocks itself
            report = profile_model(
                loaded.model,
                calibration.input_ids,
                calibration.attention_mask,
                spec.sparsities,
                round_to=spec.round_to,
                batch_size=spec.calibration.batch_size,
                lens_tokens=spec.lens_tokens,
                measured_ids=None if measured is None else measured.input_ids,
                measured_mask=None if measured is None else measured.attention_mask,
                device=loaded.device,
                progress=progress,
                should_stop=context.should_stop,
            )
    except ProfileStopped:
        context.check_stop()
        raise
    except ValueError as error:  # UnsupportedArchitectureError included
        raise JobFailure(f"profiling: {error}") from error
    timings["profile_s"] = lap(profile_started)
    timings["total_s"] = lap(started)

    protocol = {
        "calibration": {**record, "batch_size": spec.calibration.batch_size},
        "measured_on": measured_record,  # null: the calibration windows
        "measured_tokens": report.measured_tokens,
        "round_to": spec.round_to,
        "lens_tokens": report.lens_tokens,
        "mask_rules": report.mask_rules,
        "slicing_refusal": report.slicing_refusal,  # null: sliceable; else only block outputs profiled
        "calibration_tokens": report.calibration_tokens,
        "dtype": report.dtype,
        "device": report.device,
        "engine_timings_s": _engine_timings(report),
        "timings": timings,
        "environment": environment,
    }
    profile = Profile(
        model_id=source.model_id,
        model_revision=loaded.revision,
        family=report.family,
        hidden_size=report.hidden_size,
        num_layers=report.num_layers,
        protocol=protocol,
        sparsities=report.sparsities,
        widths=report.widths,
        signals=[
            ProfileSignal(
                job_id=context.job_id,
                position=signal.index,
                kind=signal.kind,
                layer=signal.layer,
                eigenvalues=signal.eigenvalues,
                energy=signal.energy,
                token_energy=signal.token_energy,
                lens=[asdict(reading) for reading in signal.lens],
            )
            for signal in report.signals
        ],
        linears=[ProfileLinear(job_id=context.job_id, **asdict(linear)) for linear in report.linears],
    )
    context.add_profiles([profile])
    context.log.info(
        "profile finished", signals=len(report.signals), widths=report.widths, profile_s=timings["profile_s"]
    )


def _engine_timings(report: ProfileReport) -> dict[str, float]:
    blocks = report.timings.get("blocks", [])
    return {
        "capture": round(float(report.timings.get("capture", 0.0)), 3),
        "blocks": round(float(sum(blocks)), 3),
        "lens": round(float(report.timings.get("lens", 0.0)), 3),
        "masks": round(float(report.timings.get("masks", 0.0)), 3),
        "total": round(float(report.timings.get("total", 0.0)), 3),
    }

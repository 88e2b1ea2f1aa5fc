"""`probe` jobs: where a pruning bends the model, measured against its dense model (docs/science.md §3).

Stages and the share of the job's progress each one covers:

    loading model    0.00-0.05  the dense model
    pruning          0.05-0.35  a second copy pruned in the job (`method` + `sparsity`, with its
                                calibration windows), or an earlier prune job's artifact read back
    model            0.35-0.40  full forwards of both models on the prompts
    counterfactual   0.40-0.70  per layer and sublayer, on the dense input; detail "prompt-layer i/N"
                                (N = prompts x layers); under the `released-code` convention only at
                                the last token of each decoding step, the dense model sampling
                                (skipped for sliced models without kept bases: their width differs)
    generation       0.70-0.95  greedy then sampled, both models; detail "prompt-step i/N"; with
                                `generation.counterfactual_steps`, then the pruned model teacher-forced
                                on the dense greedy text and the counterfactual at those decoding steps
    multiple choice  0.95-1.00  the option-token subspace of the multiple-choice prompts

Stored: the probe points (`GET /v1/jobs/{id}/probes`), each with the job's convention
(`core.probe_conventions`), and one result `probe_cost_multiple`: the time of all probes as a
multiple of one dense pass over the same prompts; its protocol has each probe's multiple
(`cost_multiples`, e.g. the per-layer counterfactual's), the convention and its rules, the pruning,
prompts, temperature, timings, and which probes were skipped and why.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from core.probe_conventions import ProbeConvention, convention_named
from core.specs.probe import ProbeJobCreate
from core.tables import ProbePoint, Result
from workers.context import JobContext, JobFailure
from workers.environment import run_environment
from workers.kinds.probe_pruned import PRUNE_END, PrunedModel, pruned_from_artifact, pruned_in_job
from workers.kinds.prune_steps import lap
from workers.kinds.rows import NO_DATASET
from workers.kinds.steps import load_for_job, step_reporter
from workers.loading import LoadedModel
from workers.probing import (
    BUILTIN_PROMPTS,
    MEASURING_POINTS,
    SLICED_SUBLAYERS_REASON,
    ProbePrompt,
    ProbeRecord,
    ProbeStopped,
    counterfactual_probe,
    counterfactual_unavailable,
    generation_probe,
    mc_subspace_probe,
    model_probe,
    option_token_ids,
)
from workers.probing.decoding import decoding_counterfactual_probe, teacher_forced_probe
from workers.probing.endpoint import letter_token_ids
from workers.probing.records import ProgressCallback

MODEL_END = 0.40
COUNTERFACTUAL_END = 0.70
GENERATION_END = 0.95


@dataclass
class ProbeRun:
    """One probe job's two models and prompts, and what its probes measured so far and cost."""

    context: JobContext
    spec: ProbeJobCreate
    dense: LoadedModel
    pruned: PrunedModel
    prompts: list[ProbePrompt]
    input_ids: list[torch.Tensor]  # one (T,) per prompt
    convention: ProbeConvention
    records: list[ProbeRecord] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # probe -> why it did not run
    timings: dict[str, float] = field(default_factory=dict)


def run(context: JobContext) -> None:
    spec = ProbeJobCreate.model_validate(context.request)
    started = time.perf_counter()
    context.report("loading model", 0.0, spec.model)
    source, dense = load_for_job(context, spec)
    environment = run_environment(dense.device, dense.memory_plan)
    context.set_environment(environment)
    timings = {"load_s": lap(started)}
    prompts = (
        [ProbePrompt(p.text, tuple(p.options) if p.options else None) for p in spec.prompts]
        if spec.prompts
        else list(BUILTIN_PROMPTS)
    )
    convention = convention_named(spec.convention)
    check_options(dense, prompts, convention)  # before any pruning: a bad prompt fails the job at once
    new_tokens = 0 if spec.generation is None else spec.generation.max_new_tokens
    room = max(new_tokens, decoding_steps(spec, convention))
    input_ids = [tokenize(dense, prompt.text, room=room) for prompt in prompts]

    pruned = (
        pruned_from_artifact(context, spec, dense)
        if spec.artifact_job_id is not None
        else pruned_in_job(context, spec, dense)
    )
    probed = ProbeRun(
        context, spec, dense, pruned, prompts, input_ids, convention, timings={**timings, **pruned.timings}
    )
    for probe in (probe_models, probe_counterfactual, probe_generation, probe_choices):
        probe(probed)
    probed.timings["total_s"] = lap(started)
    store_probes(probed, source.model_id, environment)


def probe_models(probed: ProbeRun) -> None:
    """Both full models on the prompts, and one dense pass over them: the cost unit."""
    context, spec, dense, pruned = probed.context, probed.spec, probed.dense, probed.pruned
    started = time.perf_counter()
    context.report("model", PRUNE_END, f"{len(probed.input_ids)} prompts")
    probed.records += model_probe(
        dense.model,
        pruned.model,
        probed.input_ids,
        temperature=spec.probe_temperature,
        convention=probed.convention,
    )
    probed.timings["model_probe_s"] = lap(started)
    dense_module: torch.nn.Module = dense.model
    probed.timings["dense_pass_s"] = time_dense_pass(dense_module, probed.input_ids)


def probe_counterfactual(probed: ProbeRun) -> None:
    """Per layer and sublayer, the dense forward with only that sublayer pruned; for a sliced model,
    which lives in another basis of another width, whole blocks mapped through its kept bases."""
    context, spec, dense, pruned = probed.context, probed.spec, probed.dense, probed.pruned
    unavailable = counterfactual_unavailable(dense.model, pruned.model, pruned.bases)
    if unavailable is not None:
        probed.skipped["counterfactual"] = unavailable
        context.log.info("counterfactual skipped", reason=unavailable)
        return
    if pruned.bases is not None and set(spec.sublayers) - {"block"}:
        probed.skipped["counterfactual sublayers"] = SLICED_SUBLAYERS_REASON
    if probed.convention.decoding_steps_only:
        probed.skipped["counterfactual on prompts"] = (
            f"the {probed.convention.name} convention reads only the last token of each decoding step"
        )
        probe_decoding_counterfactual(probed, decoding_steps(spec, probed.convention))
        return
    started = time.perf_counter()
    context.report("counterfactual", MODEL_END, "prompt-layer 0")
    probed.records += run_probe(
        context,
        counterfactual_probe,
        dense.model,
        pruned.model,
        pruned.layer_map,
        probed.input_ids,
        temperature=spec.probe_temperature,
        sublayers=tuple(spec.sublayers),
        bases=pruned.bases,
        convention=probed.convention,
        progress=step_reporter(context, "counterfactual", MODEL_END, COUNTERFACTUAL_END, "prompt-layer"),
    )
    probed.timings["counterfactual_s"] = lap(started)


def probe_decoding_counterfactual(probed: ProbeRun, steps: int) -> None:
    """The counterfactual stage of a convention that reads only decoding steps."""
    started = time.perf_counter()
    probed.context.report("counterfactual", MODEL_END, f"at {steps} decoding steps")
    progress = step_reporter(probed.context, "counterfactual", MODEL_END, COUNTERFACTUAL_END, "prompt-layer")
    probed.records += decoding_counterfactual(probed, steps, progress)
    probed.timings["counterfactual_s"] = lap(started)


def decoding_counterfactual(
    probed: ProbeRun, steps: int, progress: ProgressCallback | None = None
) -> list[ProbeRecord]:
    """The local counterfactual at the last token of each of the first `steps` decoding steps, the
    dense model driving (greedy, or sampled at T as the convention says)."""
    spec, dense, pruned = probed.spec, probed.dense, probed.pruned
    return run_probe(
        probed.context,
        decoding_counterfactual_probe,
        dense.model,
        pruned.model,
        pruned.layer_map,
        probed.input_ids,
        max_new_tokens=steps,
        temperature=spec.probe_temperature,
        sublayers=tuple(spec.sublayers),
        bases=pruned.bases,
        convention=probed.convention,
        seed=spec.sampling_seed,
        progress=progress,
    )


def decoding_steps(spec: ProbeJobCreate, convention: ProbeConvention) -> int:
    """Decoding steps the counterfactual reads: `generation.counterfactual_steps`; under a convention
    that reads only decoding steps, every generated step when that is 0, and the prompt's last token
    alone (step 0) without generation."""
    if spec.generation is None:
        return 1 if convention.decoding_steps_only else 0
    if spec.generation.counterfactual_steps or not convention.decoding_steps_only:
        return spec.generation.counterfactual_steps
    return spec.generation.max_new_tokens


def probe_generation(probed: ProbeRun) -> None:
    """Both models generate from every prompt, greedy and sampled: divergence per step."""
    context, spec, dense, pruned = probed.context, probed.spec, probed.dense, probed.pruned
    if spec.generation is None:
        probed.skipped["generation"] = "not requested (generation: null)"
        return
    started = time.perf_counter()
    probed.records += run_probe(
        context,
        generation_probe,
        dense.model,
        pruned.model,
        pruned.layer_map,
        probed.input_ids,
        max_new_tokens=spec.generation.max_new_tokens,
        temperature=spec.probe_temperature,
        seed=spec.sampling_seed,
        convention=probed.convention,
        progress=step_reporter(context, "generation", COUNTERFACTUAL_END, GENERATION_END, "prompt-step"),
    )
    probed.timings["generation_s"] = lap(started)
    if spec.generation.counterfactual_steps:
        probe_decoding_steps(probed, spec.generation.counterfactual_steps)


def probe_decoding_steps(probed: ProbeRun, steps: int) -> None:
    """Along the dense model's greedy generation: the pruned model teacher-forced on it, and the
    local counterfactual at each of the first `steps` decoding steps (where the counterfactual runs
    at all: a sliced model without bases has none; a convention that reads only decoding steps ran
    it in the counterfactual stage)."""
    context, spec, dense, pruned = probed.context, probed.spec, probed.dense, probed.pruned
    started = time.perf_counter()
    context.report("generation", GENERATION_END, f"teacher-forced, {steps} steps")
    probed.records += run_probe(
        context,
        teacher_forced_probe,
        dense.model,
        pruned.model,
        probed.input_ids,
        max_new_tokens=steps,
        temperature=spec.probe_temperature,
        convention=probed.convention,
    )
    if "counterfactual" not in probed.skipped and not probed.convention.decoding_steps_only:
        context.report("generation", GENERATION_END, f"counterfactual at {steps} decoding steps")
        probed.records += decoding_counterfactual(probed, steps)
    probed.timings["decoding_steps_s"] = lap(started)


def probe_choices(probed: ProbeRun) -> None:
    """On the multiple-choice prompts, p restricted to the options' tokens."""
    context, spec, dense, pruned = probed.context, probed.spec, probed.dense, probed.pruned
    choice_prompts = [prompt for prompt in probed.prompts if prompt.options]
    if not choice_prompts:
        probed.skipped["mc-subspace"] = "no prompt has options"
        return
    started = time.perf_counter()
    context.report("multiple choice", GENERATION_END, f"{len(choice_prompts)} prompts")
    probed.records += mc_subspace_probe(
        dense.model,
        pruned.model,
        dense.tokenizer,
        choice_prompts,
        temperature=spec.probe_temperature,
        convention=probed.convention,
    )
    probed.timings["mc_subspace_s"] = lap(started)


def store_probes(probed: ProbeRun, model_id: str, environment: dict[str, Any]) -> None:
    """The points, and the `probe_cost_multiple` result that says what they cost and what was skipped;
    non-finite values fail the job instead."""
    context, spec, dense, pruned = probed.context, probed.spec, probed.dense, probed.pruned
    prompts, input_ids, records, timings = probed.prompts, probed.input_ids, probed.records, probed.timings
    multiples = cost_multiples(timings)
    diverged = sorted({f"{r.probe}/{r.space}/{r.metric}" for r in records if not math.isfinite(r.value)})
    if diverged:
        raise JobFailure(
            f"probe values are not finite ({', '.join(diverged[:5])}): the pruned model's outputs "
            "overflowed or are NaN; probe in float32, or prune less"
        )
    convention = probed.convention
    context.add_probe_points([ProbePoint(**asdict(record), convention=convention.name) for record in records])
    context.add_results(
        [
            Result(
                model_id=model_id,
                model_revision=dense.revision,
                method=pruned.method,
                sparsity=pruned.sparsity,
                metric="probe_cost_multiple",
                dataset=NO_DATASET,
                value=multiples["all_probes"],
                n=len(records),
                source="measured",
                protocol={
                    "what": "time of all probes / one dense forward over the same prompts",
                    "cost_multiples": multiples,
                    "prompts": len(prompts),
                    "prompt_tokens": sum(int(ids.numel()) for ids in input_ids),
                    "prompts_sha256": prompts_sha256(prompts),
                    "builtin_prompts": not spec.prompts,
                    "convention": convention.name,
                    "convention_rules": convention.rules(),
                    "temperature": spec.probe_temperature,
                    "sublayers": list(spec.sublayers),
                    "measuring_points": {name: MEASURING_POINTS[name] for name in spec.sublayers},
                    "generation": None if spec.generation is None else spec.generation.model_dump(),
                    "skipped": probed.skipped,
                    "pruning": pruned.report,
                    "origin": pruned.origin,
                    "timings": timings,
                    "dtype": str(dense.dtype).removeprefix("torch."),
                    "seed": spec.seed,
                    **environment,
                },
            )
        ]
    )
    context.log.info(
        "probe finished",
        points=len(records),
        cost_multiples=multiples,
        skipped=sorted(probed.skipped),
        **timings,
    )


def cost_multiples(timings: dict[str, float]) -> dict[str, float]:
    """Each probe's time, and all of them together, as a multiple of one dense pass."""
    unit = max(timings["dense_pass_s"], 1e-9)
    probes = {
        name: timings[f"{name}_s"] / unit
        for name in ("model_probe", "counterfactual", "generation", "decoding_steps", "mc_subspace")
        if f"{name}_s" in timings
    }
    return {
        **{name: round(value, 3) for name, value in probes.items()},
        "all_probes": round(sum(probes.values()), 3),
    }


def run_probe(context: JobContext, probe: Any, *args: Any, **kwargs: Any) -> list[ProbeRecord]:
    """Call a probe that stops at safe points; a stop becomes the job's stop."""
    try:
        records: list[ProbeRecord] = probe(*args, should_stop=context.should_stop, **kwargs)
    except ProbeStopped:
        context.check_stop()
        raise
    return records


def check_options(dense: LoadedModel, prompts: list[ProbePrompt], convention: ProbeConvention) -> None:
    """Every multiple-choice prompt's options must start with distinct tokens (the subspace), and the
    convention's option letters must be distinct tokens of this tokenizer."""
    for index, prompt in enumerate(prompts):
        if prompt.options:
            try:
                option_token_ids(dense.tokenizer, prompt.options)
            except ValueError as error:
                raise JobFailure(
                    f"prompts[{index}]: {error}; give options that differ in their first token"
                ) from error
    if convention.option_letters and any(prompt.options for prompt in prompts):
        try:
            letter_token_ids(dense.tokenizer, convention.option_letters)
        except ValueError as error:
            raise JobFailure(
                f"the {convention.name} convention's multiple-choice subspace: {error} with this "
                "model's tokenizer; probe with the prunecast convention"
            ) from error


def tokenize(loaded: LoadedModel, text: str, *, room: int = 0) -> torch.Tensor:
    """A prompt's token ids (1-D), cut so that `room` generated tokens still fit the context."""
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids[0]  # (T,)
    context = int(getattr(loaded.model.config, "max_position_embeddings", 0) or 0)
    if context and room >= context:
        raise JobFailure(
            f"generation.max_new_tokens ({room}) leaves no room for a prompt in the model's context of "
            f"{context} tokens; ask for fewer new tokens"
        )
    if context and ids.numel() + room > context:
        ids = ids[: max(context - room, 1)]
    return ids.to(loaded.device)


@torch.no_grad()
def time_dense_pass(model: torch.nn.Module, input_ids: list[torch.Tensor]) -> float:
    """Seconds of one dense forward over the prompts (the probe's cost unit); best of two."""
    best = float("inf")
    synchronize = torch.cuda.synchronize if input_ids and input_ids[0].is_cuda else (lambda: None)
    for _ in range(2):
        synchronize()
        started = time.perf_counter()
        for ids in input_ids:
            model(input_ids=ids[None], use_cache=False)
        synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def prompts_sha256(prompts: list[ProbePrompt]) -> str:
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(prompt.text.encode())
        digest.update(b"\0" + "\x1f".join(prompt.options or ()).encode() + b"\0")
    return digest.hexdigest()

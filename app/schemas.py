"""Request and response bodies. Job kinds form a discriminated union on `kind`.

Request models forbid unknown fields, so a typo is a 422 that names the field rather than a
silently ignored option.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PerplexitySpec(StrictModel):
    """Token perplexity on a test split, non-overlapping windows (science.md §4)."""

    dataset: Literal["wikitext2"] = Field("wikitext2", description="Evaluation corpus (test split).")
    seqlen: int = Field(
        2048, ge=16, le=131_072, description="Window length in tokens; capped at the model's context."
    )
    max_windows: int | None = Field(
        None, ge=1, le=100_000, description="Score only the first N windows (cheap runs); null = all."
    )
    batch_size: int = Field(1, ge=1, le=64, description="Windows per forward pass.")


class ModelSpec(StrictModel):
    model: str = Field(
        min_length=1,
        max_length=512,
        description="Packaged alias (e.g. `smollm2-135m`), a local directory below "
        "PRUNECAST_MODEL_ROOTS, or a Hugging Face id present in the local HF cache.",
        examples=["smollm2-135m"],
    )
    revision: str | None = Field(None, max_length=128, description="HF revision (HF ids only).")
    dtype: Dtype = Field("auto", description="`auto`: float32 on CPU, bfloat16 on CUDA.")
    device: Device = "auto"
    seed: int = Field(42, ge=0, le=2**31 - 1, description="Seed for any sampling the job does.")


# Multiple-choice tasks, named as lm-evaluation-harness names them (workers.mc_tasks.TASKS; a test
# checks the two agree). Spelled out here because the API never imports the worker's data code.
AccuracyTask = Literal["arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande", "boolq", "openbookqa"]
ACCURACY_TASKS: tuple[str, ...] = get_args(AccuracyTask)


class AccuracySpec(StrictModel):
    """Multiple-choice accuracy by the lm-evaluation-harness log-likelihood protocol (science.md §4):
    `acc` and, where lm-eval defines it, `acc_norm`, each with its standard error, per task."""

    tasks: list[AccuracyTask] = Field(
        min_length=1,
        max_length=len(ACCURACY_TASKS),
        description="Tasks to score, each once. Each scores lm-eval's default split (ARC and "
        "OpenBookQA: test; the others: validation).",
        examples=[["arc_easy", "winogrande"]],
    )
    limit: int | None = Field(
        None, ge=1, le=100_000, description="Score only N docs per task (cheap runs); null = all."
    )
    subsample_seed: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="With `limit`: N seeded random docs instead of the first N; null = the first N.",
    )
    num_fewshot: int = Field(
        0, ge=0, le=25, description="Solved examples before each question (drawn from the same split)."
    )
    batch_size: int = Field(16, ge=1, le=512, description="Options scored per forward pass.")

    @field_validator("tasks")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("tasks lists the same task twice")
        return value


class EvaluateJobCreate(ModelSpec):
    """Measure a model as it is: perplexity and/or multiple-choice accuracy."""

    kind: Literal["evaluate"]
    perplexity: PerplexitySpec | None = Field(
        default_factory=PerplexitySpec,
        description="Perplexity protocol; on (with its defaults) when omitted, null to skip it.",
    )
    accuracy: AccuracySpec | None = Field(None, description="Multiple-choice tasks to score; null: none.")

    @model_validator(mode="after")
    def _measures_something(self) -> EvaluateJobCreate:
        if self.perplexity is None and self.accuracy is None:
            raise ValueError("an evaluate job must measure something: give `perplexity`, `accuracy` or both")
        return self


# Longest calibration text a request may carry (characters). The request body limit
# (PRUNECAST_MAX_BODY_BYTES) applies first, so raise that too to send texts this long.
MAX_CALIBRATION_TEXT_CHARS = 2_000_000


class CalibrationSpec(StrictModel):
    """The text SliceGPT's PCAs are computed on: `num_sequences` windows of `seqlen` tokens drawn
    at seeded random offsets from one corpus (science.md §1, step 7)."""

    corpus: Literal["boolq-passages", "text"] = Field(
        "boolq-passages",
        description="`boolq-passages`: the packaged BoolQ Wikipedia passages (English prose, ~1.6M "
        "characters; never the evaluation split). `text`: the `text` field of this request.",
    )
    text: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CALIBRATION_TEXT_CHARS,
        description="Your own calibration text; required when `corpus` is `text`, refused otherwise. "
        "It must hold at least `seqlen` tokens. Also bounded by the server's request body limit.",
    )
    num_sequences: int = Field(
        128, ge=1, le=4096, description="Calibration windows (SliceGPT uses 128; 1024 does better)."
    )
    seqlen: int = Field(
        2048, ge=16, le=32_768, description="Tokens per window; capped at the model's context length."
    )
    batch_size: int = Field(8, ge=1, le=256, description="Windows per forward pass while slicing.")
    seed: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="Seed of the window offsets; null uses the job's `seed` (default 42).",
    )

    @model_validator(mode="after")
    def _text_iff_corpus_is_text(self) -> CalibrationSpec:
        if self.corpus == "text" and self.text is None:
            raise ValueError("calibration.text is required when calibration.corpus is 'text'")
        if self.corpus != "text" and self.text is not None:
            raise ValueError(
                f"calibration.text is only read when calibration.corpus is 'text' (got {self.corpus!r})"
            )
        return self


PruneMethod = Literal["slicegpt", "magnitude", "wanda", "sparsegpt", "attention-drop", "mlp-drop", "shortgpt"]
PRUNE_METHODS: tuple[str, ...] = get_args(PruneMethod)
# The method names results are stored under: an N:M pattern is part of the name
# (workers.kinds.prune_steps.result_method), so curves and predictions never mix patterns.
StoredMethod = Literal[
    PruneMethod,
    "magnitude-2:4",
    "magnitude-4:8",
    "wanda-2:4",
    "wanda-4:8",
    "sparsegpt-2:4",
    "sparsegpt-4:8",
]
INTRA_LAYER_METHODS: tuple[str, ...] = ("magnitude", "wanda", "sparsegpt")
"""Methods that zero a fraction of the weights of every pruned linear (N:M patterns apply)."""
DROP_METHODS: tuple[str, ...] = ("attention-drop", "mlp-drop", "shortgpt")
"""Methods that remove whole branches or blocks: n = round(sparsity * L) of the L layers."""

SparsityPattern = Literal["unstructured", "2:4", "4:8"]
NM_SPARSITY = 0.5
"""The only sparsity an N:M pattern (2:4, 4:8) gives: N of every M consecutive weights are zeroed."""

METHOD_DESCRIPTION = (
    "How the model is pruned (science.md §1, §3). "
    "`slicegpt`: remove a fraction of the residual-stream width (SliceGPT, ICLR 2024). "
    "`magnitude`: zero the weights of smallest |W| in each linear. "
    "`wanda`: zero the weights of smallest |W| * ||X|| (input activation norm from the calibration "
    "data), compared within each output row. "
    "`sparsegpt`: OBS-style pruning with the layer's Hessian X X^T, updating the kept weights; "
    "blocks of 128 columns, 1% damping. "
    "`attention-drop` / `mlp-drop`: remove the attention / MLP branches that change the residual "
    "stream least (highest cosine between the branch's input and output residual on the calibration "
    "data). "
    "`shortgpt`: remove whole blocks of lowest Block Influence BI = 1 - mean cos(h_in, h_out)."
)
SPARSITY_DESCRIPTION = (
    "Fraction removed; what it counts depends on `method`. `slicegpt`: the fraction of the residual "
    "width D removed (d = floor((1 - sparsity) * D), rounded down to `round_to`), not of parameters; "
    "the real parameter fraction is reported as the `param_fraction_removed` result. `magnitude`, "
    "`wanda`, `sparsegpt`: the fraction of the weights of each pruned linear set to zero (0.5 with an "
    "N:M `pattern`). `attention-drop`, `mlp-drop`, `shortgpt`: the fraction of the L layers removed, "
    "n = round(sparsity * L) attention branches, MLP branches or blocks."
)
PATTERN_DESCRIPTION = (
    "Where the zeros may fall (`magnitude`, `wanda`, `sparsegpt` only). `unstructured`: anywhere in "
    "the comparison group. `2:4` / `4:8`: N of every M consecutive input weights of a row (hardware "
    "sparse kernels); the sparsity is then N/M = 0.5."
)
ROUND_TO_DESCRIPTION = (
    "`slicegpt` only (ignored by the other methods): round the kept width d down to a multiple of this."
)
SLICE_HEAD_DESCRIPTION = (
    "`slicegpt` only (refused for the other methods): also slice the LM head's input. null: the "
    "family's default (no, except GPT-2, whose forward needs it)."
)


def check_pruning(method: str, sparsity: float, pattern: str, slice_head: bool | None = None) -> None:
    """The rules every pruning request follows, whatever job kind carries it (ValueError: why not)."""
    if pattern != "unstructured":
        if method not in INTRA_LAYER_METHODS:
            raise ValueError(
                f"pattern {pattern!r} only applies to {', '.join(INTRA_LAYER_METHODS)} (got method "
                f"{method!r}); leave pattern at 'unstructured'"
            )
        if sparsity != NM_SPARSITY:
            raise ValueError(
                f"pattern {pattern!r} zeroes {pattern.split(':')[0]} of every {pattern.split(':')[1]} "
                f"weights, so its sparsity is fixed at {NM_SPARSITY}; set sparsity to {NM_SPARSITY} "
                f"(got {sparsity:g}) or use pattern 'unstructured'"
            )
    if slice_head is not None and method != "slicegpt":
        raise ValueError(f"slice_head is a slicegpt option; leave it null for method {method!r}")


class PruneJobCreate(ModelSpec):
    """Prune a model, then measure it: the dense baseline (measured once per model and protocol,
    then reused), the pruned perplexity and the real fraction of parameters removed."""

    kind: Literal["prune"]
    method: PruneMethod = Field(description=METHOD_DESCRIPTION)
    sparsity: float = Field(ge=0.0, lt=1.0, description=SPARSITY_DESCRIPTION, examples=[0.25])
    pattern: SparsityPattern = Field("unstructured", description=PATTERN_DESCRIPTION)
    round_to: int = Field(8, ge=1, le=128, description=ROUND_TO_DESCRIPTION)
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec,
        description="Calibration text: SliceGPT's PCAs, Wanda's activation norms, SparseGPT's Hessians, "
        "the drop methods' cosines and Block Influence. Unused by `magnitude`.",
    )
    perplexity: PerplexitySpec = Field(
        default_factory=PerplexitySpec,
        description="How the dense and pruned models are scored; the dense baseline is reused "
        "from an earlier job when model, data and this protocol match.",
    )
    accuracy: AccuracySpec | None = Field(
        None,
        description="Multiple-choice tasks to score the dense and the pruned model on; the dense "
        "accuracy is reused from an earlier job when model, data and this protocol match.",
    )
    save_artifact: bool = Field(
        True, description="Save the pruned model under the artifact directory (see `/artifacts`)."
    )
    slice_head: bool | None = Field(None, description=SLICE_HEAD_DESCRIPTION)

    @model_validator(mode="after")
    def _consistent_pruning(self) -> PruneJobCreate:
        check_pruning(self.method, self.sparsity, self.pattern, self.slice_head)
        return self


# Most sparsities one sweep may measure: each costs a slicing and an evaluation.
MAX_SWEEP_SPARSITIES = 20


class SweepJobCreate(ModelSpec):
    """Prune and measure a model at several sparsities, then fit the prediction laws to the points.

    One job: the model is loaded and the dense baseline measured (or reused) once, the calibration
    windows drawn once and shared by every sparsity; each sparsity stores the same results a `prune`
    job would (tagged with `sweep_job_id` in their protocol) as soon as it is measured; the fitted
    laws, with their quality on the measured points, are stored under `/v1/fits?job_id=...` once
    every sparsity is measured. A canceled sweep keeps the points it measured and stores no fit.
    """

    kind: Literal["sweep"]
    method: Literal["slicegpt"] = Field(
        description="`slicegpt`: remove a fraction of the residual-stream width (SliceGPT, ICLR 2024). "
        "Sweeps slice only; prune other methods with `prune` jobs."
    )
    sparsities: list[Annotated[float, Field(ge=0.0, lt=1.0)]] = Field(
        min_length=1,
        max_length=10 * MAX_SWEEP_SPARSITIES,
        description=f"Sparsities to measure, each in [0, 1); sorted and deduplicated on submit, at most "
        f"{MAX_SWEEP_SPARSITIES} distinct values, at least one above 0. 0 stands for the dense "
        "baseline, which every sweep measures (or reuses) once anyway.",
        examples=[[0.0, 0.1, 0.2, 0.3, 0.4]],
    )
    round_to: int = Field(8, ge=1, le=128, description="Round the kept width d down to a multiple of this.")
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec,
        description="Drawn once; every sparsity is sliced with the same windows.",
    )
    perplexity: PerplexitySpec = Field(
        default_factory=PerplexitySpec,
        description="How the dense and pruned models are scored; the dense baseline is reused "
        "from an earlier job when model, data and this protocol match.",
    )
    accuracy: AccuracySpec | None = Field(
        None,
        description="Multiple-choice tasks to score the dense model (once, or reused from an earlier "
        "job when model, data and this protocol match) and every pruned sparsity on; an accuracy law "
        "is fitted and stored per task and metric besides the perplexity law.",
    )
    save_artifacts: bool = Field(
        False,
        description="Save every sliced model under the artifact directory (`<job id>/s<sparsity>`).",
    )
    slice_head: bool | None = Field(
        None,
        description="Also slice the LM head's input. null: the family's default (no, except GPT-2, "
        "whose forward needs it).",
    )

    @field_validator("sparsities")
    @classmethod
    def _sorted_distinct_with_a_pruned_one(cls, value: list[float]) -> list[float]:
        distinct = sorted({s + 0.0 for s in value})  # + 0.0 turns -0.0 into 0.0
        if len(distinct) > MAX_SWEEP_SPARSITIES:
            raise ValueError(
                f"{len(distinct)} distinct sparsities, at most {MAX_SWEEP_SPARSITIES} per sweep; "
                "split the list over several sweeps"
            )
        if distinct[-1] == 0.0:
            raise ValueError("a sweep needs at least one sparsity above 0 (0 is the dense baseline)")
        return distinct

    @property
    def pruned_sparsities(self) -> list[float]:
        """The sparsities that are sliced: every requested one but 0."""
        return [s for s in self.sparsities if s > 0.0]


# ------------------------------------------------------------------------------------------ probes
# Deviation probing (science.md §3): a `probe` job stores points in `probe_points`, one row per
# (probe, layer, sublayer, space, step, metric) with the measured value and, where one exists, the
# Taylor estimate; GET /v1/jobs/{id}/probes lists them.

ProbeKind = Literal["counterfactual", "model", "generation-greedy", "generation-sampled", "mc-subspace"]
PROBE_KINDS: tuple[str, ...] = get_args(ProbeKind)
ProbeSublayer = Literal["attention", "mlp", "block"]
PROBE_SUBLAYERS: tuple[str, ...] = get_args(ProbeSublayer)
PROBE_SPACES: tuple[str, ...] = ("embedding", "logits", "probs")
MAX_PROBE_PROMPTS = 64

PROBE_KIND_DESCRIPTION = (
    "What kind of probe measured the point. `counterfactual`: the dense model runs, and at layer l "
    "only that sublayer is replaced by its pruned version on the dense input (the shift at that "
    "layer, with its Taylor estimate). `model`: the whole pruned model against the dense one, at "
    "its output (final hidden state, logits, probabilities). `generation-greedy` / "
    "`generation-sampled`: dense and pruned models generate from the same prompt (greedy, or "
    "sampled at `temperature` with the generation seed); per `step`, the divergence per space and "
    "the token metrics `agree` / `prefix_agree` (space `tokens`); points with a `layer` are "
    "per-layer hidden states, points without one are the model's output. `mc-subspace`: on "
    "multiple-choice prompts, p restricted to the option tokens versus the full vocabulary."
)
PROBE_SPACE_DESCRIPTION = (
    "`embedding`: the hidden state h after the (sub)layer; `logits`: z = W_head(norm_final(h)); "
    "`probs`: p = softmax(z / temperature); `options`: p restricted to the options' tokens "
    "(`mc-subspace`); `tokens`: generated-token metrics."
)
PROBE_METRIC_DESCRIPTION = (
    "`1-cos`: angular deviation 1 - cos(x, x + dx); `dpar` / `dperp`: ||dx|| parallel / orthogonal to x, "
    "over ||x||; `kl`: KL(p_dense || p_pruned), summed over the vocabulary; `agree` / `prefix_agree`: "
    "generated tokens equal at this step / at every step so far; `argmax_agree`: same top option."
)


class ProbePromptSpec(StrictModel):
    """One prompt to probe on; with `options` it is a multiple-choice question."""

    text: str = Field(min_length=1, max_length=4000, description="The prompt.")
    options: list[Annotated[str, Field(min_length=1, max_length=32)]] | None = Field(
        None,
        min_length=2,
        max_length=10,
        description="Answer options (e.g. ['A', 'B', 'C', 'D']): marks the prompt multiple choice; the "
        "`mc-subspace` probe restricts p to their first tokens. null: an open prompt.",
        examples=[["A", "B", "C", "D"]],
    )

    @field_validator("options")
    @classmethod
    def _distinct_options(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("options lists the same option twice")
        return value


class ProbeGenerationSpec(StrictModel):
    """Generation divergence: dense and pruned models continue the same prompts, greedily and sampled."""

    max_new_tokens: int = Field(32, ge=1, le=256, description="Tokens generated per prompt and run.")
    seed: int | None = Field(
        None, ge=0, le=2**31 - 1, description="Seed of the sampled run; null uses the job's `seed`."
    )


def _all_sublayers() -> list[ProbeSublayer]:
    return ["attention", "mlp", "block"]


class ProbeJobCreate(ModelSpec):
    """Deviation probing of a pruned model against its dense model (science.md §3): per layer and
    space (embedding, logits, probabilities) the measured shift beside its Taylor estimate, the
    divergence of generations, and multiple-choice agreement in the options' subspace.

    The pruned model is either pruned inside the job (`method`, `sparsity`, and `pattern`,
    `calibration`, `round_to` as in a `prune` job) or read from the artifact of a succeeded `prune`
    job of the same model (`artifact_job_id`): give exactly one of the two.
    """

    kind: Literal["probe"]
    method: PruneMethod | None = Field(
        None, description="Prune inside the job with this method (with `sparsity`). " + METHOD_DESCRIPTION
    )
    sparsity: float | None = Field(None, ge=0.0, lt=1.0, description=SPARSITY_DESCRIPTION, examples=[0.5])
    pattern: SparsityPattern = Field("unstructured", description=PATTERN_DESCRIPTION)
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec, description="Calibration text of the pruning (with `method`)."
    )
    round_to: int = Field(8, ge=1, le=128, description=ROUND_TO_DESCRIPTION)
    artifact_job_id: str | None = Field(
        None,
        pattern=r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$",
        description="Probe the model a succeeded `prune` job of the same `model` saved (its artifact), "
        "instead of pruning in this job.",
    )
    prompts: list[ProbePromptSpec] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROBE_PROMPTS,
        description=f"At most {MAX_PROBE_PROMPTS} prompts; null: the built-in set (multiple-choice, "
        "arithmetic and open-generation prompts).",
    )
    temperature: float = Field(
        1.0, gt=0.0, le=100.0, allow_inf_nan=False, description="T of p = softmax(z / T) and of sampling."
    )
    sublayers: list[ProbeSublayer] = Field(
        default_factory=_all_sublayers,
        min_length=1,
        max_length=len(PROBE_SUBLAYERS),
        description="Sublayers replaced one at a time by the local counterfactual probe.",
    )
    generation: ProbeGenerationSpec | None = Field(
        default_factory=ProbeGenerationSpec,
        description="Generation divergence; on (with its defaults) when omitted, null to skip it.",
    )

    @field_validator("artifact_job_id")
    @classmethod
    def _lowercase_id(cls, value: str | None) -> str | None:
        return None if value is None else value.lower()  # job ids are stored in lowercase

    @field_validator("sublayers")
    @classmethod
    def _distinct_sublayers(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("sublayers lists the same sublayer twice")
        return value

    @model_validator(mode="after")
    def _one_pruned_model(self) -> ProbeJobCreate:
        if (self.method is None) == (self.artifact_job_id is None):
            given = "both" if self.method is not None else "neither"
            raise ValueError(
                f"a probe job probes one pruned model: give either `method` (with `sparsity`) to prune "
                f"in the job, or `artifact_job_id` of a succeeded prune job (got {given})"
            )
        if self.method is not None:
            if self.sparsity is None:
                raise ValueError(f"`sparsity` is required with `method` ({self.method!r})")
            check_pruning(self.method, self.sparsity, self.pattern)
        else:
            # Compared with the defaults, not with the fields set: the stored request (model_dump, which
            # the worker validates again) carries every field.
            defaults = {
                "sparsity": None,
                "pattern": "unstructured",
                "calibration": CalibrationSpec(),
                "round_to": 8,
            }
            pruning_fields = [name for name, default in defaults.items() if getattr(self, name) != default]
            if pruning_fields:
                raise ValueError(
                    f"{', '.join(pruning_fields)} describe pruning inside the job; with "
                    "`artifact_job_id` the prune job that saved the artifact already did it"
                )
        return self

    @property
    def sampling_seed(self) -> int:
        """The seed of the sampled generation run."""
        if self.generation is not None and self.generation.seed is not None:
            return self.generation.seed
        return self.seed


JobCreate = Annotated[
    EvaluateJobCreate | PruneJobCreate | SweepJobCreate | ProbeJobCreate, Field(discriminator="kind")
]
JOB_KINDS = ("evaluate", "prune", "sweep", "probe")


class JobLinks(BaseModel):
    self: str
    wait: str
    results: str
    artifacts: str
    probes: str


class JobPublic(BaseModel):
    """A job as clients see it: request, lifecycle state and progress."""

    id: str
    kind: str
    status: Literal["queued", "running", "succeeded", "failed", "canceled"]
    model: str
    request: dict[str, Any]
    stage: str
    progress: float = Field(description="0..1 within the whole job.")
    detail: str | None = Field(None, description="Human-readable progress, e.g. 'window 7/20'.")
    error: str | None = Field(None, description="Why the job failed, was canceled or was retried.")
    attempts: int
    worker: str | None = Field(None, description="host:pid of the process running the current attempt.")
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    environment: dict[str, Any] | None = Field(None, description="Versions and device of the run.")
    links: JobLinks


class JobList(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next page.")


class ResultPublic(BaseModel):
    """One measured (or predicted) number with everything needed to reproduce it."""

    id: int
    job_id: str | None
    model: str
    model_revision: str | None
    method: str
    sparsity: float
    metric: str
    dataset: str
    split: str | None
    value: float
    stderr: float | None
    n: int | None
    source: str
    law: str | None
    protocol: dict[str, Any]
    created_at: datetime


class ResultList(BaseModel):
    items: list[ResultPublic]
    next_cursor: str | None = None


class LmEvalExport(BaseModel):
    """A job's accuracy in lm-evaluation-harness's results format (`results_*.json`): per task
    `acc,none`, `acc_stderr,none`, `acc_norm,none`, `acc_norm_stderr,none` and `alias`; what lm-eval
    has no place for (job, method, sparsity, dense baseline, perplexity) is under `prunecast`."""

    model_config = ConfigDict(populate_by_name=True)

    results: dict[str, dict[str, Any]] = Field(description="Task -> lm-eval metric keys -> value.")
    groups: dict[str, Any] = Field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = Field(description="Task -> how it was scored.")
    versions: dict[str, float | None]
    n_shot: dict[str, int] = Field(alias="n-shot")
    higher_is_better: dict[str, dict[str, bool]]
    n_samples: dict[str, dict[str, int]] = Field(alias="n-samples", description="original / effective docs.")
    config: dict[str, Any] = Field(description="model, model_args, batch_size, device, limit.")
    model_name: str
    model_revision: str | None = None
    prunecast: dict[str, Any] = Field(description="job_id, kind, method, sparsity, dense, perplexity.")


class ArtifactPublic(BaseModel):
    """A file or folder a job wrote (e.g. a sliced model), on the artifact volume."""

    id: int
    job_id: str
    kind: str = Field(description="`sliced-model`: load it with `workers.slicing.artifacts.load_sliced`.")
    path: str = Field(description="Folder on the artifact volume (PRUNECAST_ARTIFACT_DIR).")
    bytes: int = Field(description="Total size of the files in the folder.")
    sha256: str = Field(description="SHA-256 of the weights file (model.safetensors).")
    created_at: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactPublic]


class ProbePointPublic(BaseModel):
    """One probe measurement: the measured deviation and, where one exists, its Taylor estimate."""

    id: int
    job_id: str
    probe: str = Field(description=PROBE_KIND_DESCRIPTION)
    layer: int | None = Field(description="Block index from 0; null: the model's output.")
    sublayer: str | None = Field(description="`attention`, `mlp` or `block`; null where it does not apply.")
    space: str = Field(description=PROBE_SPACE_DESCRIPTION)
    step: int | None = Field(description="Generation step from 0; null outside generation probes.")
    metric: str = Field(description=PROBE_METRIC_DESCRIPTION)
    value: float = Field(description="Measured (ground truth).")
    estimate: float | None = Field(description="Taylor estimate of `value` (science.md §3); null: none.")


class ProbeSummary(BaseModel):
    """How well the Taylor estimates track the measured values, for one probe, sublayer, space and
    metric, over every matching point that has an estimate (all layers, not just one page)."""

    probe: str
    sublayer: str | None
    space: str
    metric: str
    n: int = Field(description="Points with an estimate.")
    correlation: float | None = Field(
        description="Pearson correlation of estimate and value across the points; null with fewer than "
        "3 points or when either does not vary."
    )
    mean_value: float
    mean_estimate: float
    mean_relative_error: float | None = Field(
        description="Mean of |estimate - value| / |value| over the points with value != 0."
    )


class ProbePointList(BaseModel):
    items: list[ProbePointPublic] = Field(description="One page, in the order the job stored them.")
    next_cursor: str | None = Field(None, description="Pass as `cursor` to get the next page.")
    summary: list[ProbeSummary] = Field(
        description="Estimate against value per (probe, sublayer, space, metric), over all matching points."
    )


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)


# --------------------------------------------------------------------------- predictions and curves
# POST /v1/predictions and GET /v1/models/{model}/curves (issue 5). Accuracy results are looked up by
# `metric` (`acc`, `acc_norm`) with the task name as the result's `dataset`.

PredictMetric = Literal["ppl", "acc", "acc_norm"]
MAX_PREDICTION_SPARSITIES = 100

Sparsity = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]
TaskName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")]


class MetricSpec(StrictModel):
    """One metric to predict: `ppl` on the protocol's dataset, or an accuracy on a task."""

    metric: PredictMetric = Field(description="`ppl`, or `acc` / `acc_norm` of a multiple-choice task.")
    task: TaskName | None = Field(
        None, description="The task of an accuracy metric (e.g. `arc_easy`); not allowed for `ppl`."
    )

    @model_validator(mode="after")
    def _task_iff_accuracy(self) -> MetricSpec:
        if self.metric == "ppl" and self.task is not None:
            raise ValueError("`ppl` takes no task: its dataset is protocol.dataset")
        if self.metric != "ppl" and self.task is None:
            raise ValueError(
                f"`{self.metric}` needs a task, e.g. {{'metric': '{self.metric}', 'task': 'arc_easy'}}"
            )
        return self


class ProtocolSelector(StrictModel):
    """Which stored perplexity protocol to use. Unset fields match any stored value; among the
    matching protocols the one with a dense baseline and the most measured points wins."""

    dataset: Literal["wikitext2"] = Field("wikitext2", description="Evaluation corpus of `ppl`.")
    seqlen: int | None = Field(None, ge=16, le=131_072, description="Window length in tokens.")
    max_windows: int | Literal["all"] | None = Field(
        None, description="Windows scored: a number, `all` (the whole test split), or unset: any."
    )
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="Dtype the model was scored in; unset: any."
    )

    @model_validator(mode="after")
    def _windows_in_range(self) -> ProtocolSelector:
        if isinstance(self.max_windows, int) and not 1 <= self.max_windows <= 100_000:
            raise ValueError("protocol.max_windows must be in 1..100000, 'all' or unset")
        return self


# Smallest sparsity a caller's pruned point may have: below it the laws' sums of s^2 underflow.
MIN_PRUNED_SPARSITY = 1e-6


class CallerPoint(StrictModel):
    """A value you measured yourself (or took from a paper): sparsity 0 is the dense baseline."""

    metric: PredictMetric
    task: TaskName | None = Field(None, description="Required for accuracy metrics.")
    sparsity: Sparsity
    value: float = Field(
        gt=0.0, le=1e12, allow_inf_nan=False, description="Perplexity (> 1) or accuracy fraction (0, 1]."
    )
    n_options: int | None = Field(None, ge=2, le=1000, description="Accuracy: options per question.")
    chance: float | None = Field(
        None, gt=0.0, lt=1.0, allow_inf_nan=False, description="Accuracy: chance level (e.g. 0.25)."
    )

    @field_validator("sparsity")
    @classmethod
    def _dense_or_measurably_pruned(cls, value: float) -> float:
        if 0.0 < value < MIN_PRUNED_SPARSITY:
            raise ValueError(
                f"sparsity {value:g} is neither 0 (the dense baseline) nor at least {MIN_PRUNED_SPARSITY:g}: "
                "the laws cannot be fitted on it"
            )
        return value


class PredictionCreate(StrictModel):
    """What to predict. Measured points come from the store, or from `points` when you send them
    (then, per metric, only yours are used)."""

    model: str = Field(min_length=1, max_length=512, description="Model id as stored in results.")
    method: StoredMethod = Field(
        "slicegpt",
        description="Pruning method whose measured points calibrate, as results store it (an N:M "
        "pattern appended: `wanda-2:4`).",
    )
    protocol: ProtocolSelector = Field(default_factory=ProtocolSelector)
    sparsities: list[Sparsity] = Field(
        min_length=1,
        max_length=MAX_PREDICTION_SPARSITIES,
        description="Fractions removed, each in [0, 1).",
        examples=[[0.25, 0.3]],
    )
    metrics: list[MetricSpec] = Field(
        default_factory=lambda: [MetricSpec(metric="ppl")], min_length=1, max_length=16
    )
    points: list[CallerPoint] | None = Field(
        None, max_length=1000, description="Your own measured points, used instead of the store."
    )
    level: float = Field(0.95, ge=0.5, le=0.999, description="Coverage of each band.")
    measure_missing: bool = Field(
        False,
        description="When the dense baseline is unknown: queue the `evaluate` job that measures it and "
        "answer 202 with its link (false: answer 409 naming that job).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> PredictionCreate:
        wanted = [(m.metric, m.task) for m in self.metrics]
        if len(set(wanted)) != len(wanted):
            raise ValueError("metrics lists the same metric and task twice")
        for point in self.points or []:
            if point.metric == "ppl" and point.task is not None:
                raise ValueError("a `ppl` point takes no task")
            if (point.metric, point.task) not in wanted:
                raise ValueError(
                    f"a point is for metric {point.metric!r} task {point.task!r}, which `metrics` "
                    "does not ask for"
                )
        return self


class PointPublic(BaseModel):
    """A measured value a prediction used; `result_id` when it came from the store."""

    sparsity: float
    value: float
    result_id: int | None = None


class ProtocolPublic(BaseModel):
    """The protocol the points share, and how it was chosen."""

    dataset: str
    seqlen: int | None = None
    max_windows: int | None = Field(None, description="null: the whole test split (or not perplexity).")
    dtype: str | None = None
    chance: float | None = Field(None, description="Accuracy: the floor predictions are clipped at.")
    selection: str = Field(description="Why these points: exact match, most common protocol, or yours.")


class FitQualityPublic(BaseModel):
    n: int
    r2: float | None
    max_ape: float | None = Field(description="Largest absolute relative error on the points.")
    mean_ape: float | None


class CalibrationPublic(BaseModel):
    """The calibrated law: chosen among candidates by held-out error (see `reason`)."""

    law: str
    formula: str
    params: dict[str, float | None]
    reason: str
    loo_rel_error: float | None = Field(description="Leave-one-out RMS relative error; null if too few.")
    sigma: float | None = Field(description="Relative error of one measurement about the law.")
    quality: dict[str, FitQualityPublic] = Field(description="Per law, on the calibration points.")


class StrictErrorPublic(BaseModel):
    sparsity: float
    measured: float
    strict: float | None
    rel_error: float | None = Field(description="strict / measured - 1.")


class StrictLawPublic(BaseModel):
    """The paper's law PPL0 ** (1 / (1 - s)) and how far off it is on the measured points."""

    formula: str
    errors: list[StrictErrorPublic]
    max_abs_rel_error: float | None
    mean_abs_rel_error: float | None
    verdict: str


class PredictedPublic(BaseModel):
    """One prediction. `value` is the calibrated law's when there is one, else the strict law's."""

    sparsity: float
    value: float | None = Field(description="null when the law has no finite value (see flags).")
    band: list[float | None] | None = Field(description="[low, high] at `level`; null for the strict law.")
    level: float
    expected_rel_error: float | None = Field(description="One standard deviation, relative.")
    law: str
    formula: str
    params: dict[str, float | None]
    strict: float | None = Field(None, description="The strict law's value here (perplexity only).")
    strict_vs_value: float | None = Field(None, description="strict / value - 1.")
    flags: list[str]
    notes: list[str]


class MetricPredictionPublic(BaseModel):
    """Predictions of one metric (and task) with everything they rest on."""

    metric: str
    task: str | None
    source: Literal["store", "caller"]
    protocol: ProtocolPublic
    baseline: PointPublic
    fitted_on: list[PointPublic] = Field(description="Pruned points the calibrated law was fitted on.")
    calibration: CalibrationPublic | None = Field(description="null: no pruned point (strict law only).")
    strict_law: StrictLawPublic | None = Field(description="Perplexity only.")
    predictions: list[PredictedPublic]
    flags: list[str]
    notes: list[str]


class PredictionPublic(BaseModel):
    model: str
    method: str
    level: float
    metrics: list[MetricPredictionPublic]


class MeasurementQueued(BaseModel):
    """202 from POST /v1/predictions with `measure_missing`: the job that measures the baseline."""

    status: Literal["measuring"] = "measuring"
    detail: str
    job: JobPublic = Field(description="The evaluate job, as GET /v1/jobs/{id} shows it.")
    retry: dict[str, Any] = Field(description="What to do next: wait for the job, then repeat the request.")


class CurvePointPublic(BaseModel):
    sparsity: float
    value: float | None
    low: float | None = None
    high: float | None = None


class CurvePublic(BaseModel):
    """Measured points and both laws over a sparsity grid, for one model, method, metric, protocol."""

    model: str
    method: str
    metric: str
    task: str | None
    protocol: ProtocolPublic
    level: float
    measured: list[PointPublic] = Field(description="The dense baseline (sparsity 0) and pruned points.")
    strict: list[CurvePointPublic] | None = Field(description="Perplexity only; no band.")
    calibrated: list[CurvePointPublic] | None = Field(description="null without a pruned point.")
    calibration: CalibrationPublic | None
    flags: list[str]
    notes: list[str]

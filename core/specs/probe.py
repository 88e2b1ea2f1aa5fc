"""Probe job requests and the vocabulary of probe points (docs/science.md §3)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.methods import METHODS
from core.probe_conventions import (
    CONVENTION_DESCRIPTION,
    DEFAULT_CONVENTION,
    ProbeConventionName,
    convention_named,
)
from core.specs.common import CalibrationSpec, ModelSpec, StrictModel
from core.specs.pruning import (
    LAYOUT_DESCRIPTION,
    METHOD_DESCRIPTION,
    PATTERN_DESCRIPTION,
    ROUND_TO_DESCRIPTION,
    SPARSITY_DESCRIPTION,
    PruneMethod,
    SlicedLayout,
    SparsityPattern,
)

# ------------------------------------------------------------------------------------------ probes
# Deviation probing (docs/science.md §3): a `probe` job stores points in `probe_points`, one row per
# (probe, layer, sublayer, space, step, metric) with the measured value and, where one exists, the
# Taylor estimate; GET /v1/jobs/{id}/probes lists them.

ProbeKind = Literal[
    "counterfactual",
    "model",
    "generation-greedy",
    "generation-sampled",
    "generation-teacher-forced",
    "mc-subspace",
]
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
    "per-layer hidden states, points without one are the model's output. `generation-teacher-forced`: "
    "the pruned model reads the dense model's greedy text; per `step` its next-token deviation (no "
    "compounding: the gap to `generation-greedy` is what compounding adds). `counterfactual` points "
    "with a `step` were measured at that decoding step of the dense model's greedy generation. "
    "`mc-subspace`: on "
    "multiple-choice prompts, p restricted to the option tokens versus the full vocabulary."
)
PROBE_SPACE_DESCRIPTION = (
    "`embedding`: the hidden state h after the (sub)layer; `logits`: z = W_head(norm_final(h)); "
    "`probs`: p = softmax(z / temperature); `options`: p restricted to the options' tokens "
    "(`mc-subspace`); `option-letters`: p restricted to ' a' .. ' d' (`mc-subspace` under the "
    "`released-code` convention); `tokens`: generated-token metrics."
)
PROBE_METRIC_DESCRIPTION = (
    "`1-cos`: angular deviation 1 - cos(x, x + dx); `dpar` / `dperp`: ||dx|| parallel / orthogonal to x, "
    "over ||x||; `alpha`: the signed scale of the parallel part, dx_par = alpha x; `kl`: KL summed over "
    "the vocabulary, KL(p_dense || p_pruned) except per sublayer under the `released-code` convention, "
    "where it is KL(p_pruned || p_dense); `agree` / `prefix_agree`: "
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
    counterfactual_steps: int = Field(
        0,
        ge=0,
        le=256,
        description="Also run the local counterfactual at the first N decoding steps of the dense "
        "model's own greedy generation (points with a `step`), and the teacher-forced probe over "
        "them; 0: prompts only.",
    )
    seed: int | None = Field(
        None, ge=0, le=2**31 - 1, description="Seed of the sampled run; null uses the job's `seed`."
    )


def _all_sublayers() -> list[ProbeSublayer]:
    return ["attention", "mlp", "block"]


ARTIFACT_PRUNING_DEFAULTS: dict[str, Any] = {
    "sparsity": None,
    "pattern": "unstructured",
    "calibration": CalibrationSpec(),
    "round_to": 8,
    "layout": None,
}
"""The pruning fields a probe of an artifact leaves at these values: its prune job already pruned."""


def _equal_to(value: Any) -> dict[str, Any]:
    """JSON Schema for a value equal to `value`; a model, field by field (an omitted field is its
    default). None is `type: null`: FastAPI drops a `const` of null from the OpenAPI document."""
    if isinstance(value, BaseModel):
        return {"properties": {name: _equal_to(item) for name, item in value.model_dump().items()}}
    return {"type": "null"} if value is None else {"const": value}


ONE_PRUNED_MODEL: dict[str, Any] = {
    "oneOf": [
        {
            "title": "Prune inside the job",
            "properties": {
                "method": {"type": "string"},
                "sparsity": {"type": "number"},
                "artifact_job_id": {"type": "null"},
            },
            "required": ["method", "sparsity"],
        },
        {
            "title": "Probe a prune job's artifact",
            "properties": {
                "artifact_job_id": {"type": "string"},
                "method": {"type": "null"},
                **{name: _equal_to(default) for name, default in ARTIFACT_PRUNING_DEFAULTS.items()},
            },
            "required": ["artifact_job_id"],
        },
    ]
}
"""`_one_pruned_model`'s rule in JSON Schema, so the OpenAPI document refuses what it refuses. Which
pattern and layout a method takes (`core.methods`) stays in the descriptions and the 422."""


class ProbeJobCreate(ModelSpec):
    """Deviation probing of a pruned model against its dense model (docs/science.md §3): per layer and
    space (embedding, logits, probabilities) the measured shift beside its Taylor estimate, the
    divergence of generations, and multiple-choice agreement in the options' subspace.

    The pruned model is either pruned inside the job (`method`, `sparsity`, and `pattern`,
    `calibration`, `round_to` as in a `prune` job) or read from the artifact of a succeeded `prune`
    job of the same model (`artifact_job_id`): give exactly one of the two.
    """

    model_config = ConfigDict(json_schema_extra=ONE_PRUNED_MODEL)

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
    layout: SlicedLayout | None = Field(None, description=LAYOUT_DESCRIPTION)
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
    convention: ProbeConventionName = Field(DEFAULT_CONVENTION, description=CONVENTION_DESCRIPTION)
    temperature: float | None = Field(
        None,
        gt=0.0,
        le=100.0,
        allow_inf_nan=False,
        description="T of p = softmax(z / T) and of sampling; null: the convention's default (1.0 for "
        "`prunecast`, 0.5 for `released-code`). The stored request holds the value used.",
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

    @model_validator(mode="after")
    def _convention_temperature(self) -> ProbeJobCreate:
        if self.temperature is None:
            self.temperature = convention_named(self.convention).temperature
        return self

    @property
    def probe_temperature(self) -> float:
        """T as the probes use it: the request's, or its convention's default (filled in above)."""
        assert self.temperature is not None  # _convention_temperature ran on validation
        return self.temperature

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
            METHODS[self.method].check(self.sparsity, self.pattern, layout=self.layout)
        else:
            # Compared with the defaults, not with the fields set: the stored request (model_dump, which
            # the worker validates again) carries every field.
            pruning_fields = [
                name for name, default in ARTIFACT_PRUNING_DEFAULTS.items() if getattr(self, name) != default
            ]
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

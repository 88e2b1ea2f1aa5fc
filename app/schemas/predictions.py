"""POST /v1/predictions and GET /v1/models/{model}/curves: what to predict and the answer.

Accuracy results are looked up by `metric` (`acc`, `acc_norm`) with the task name as the result's
`dataset`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.schemas.jobs import JobPublic
from app.schemas.profiles import BeforePruningPublic
from app.schemas.records import VERDICT_LEVELS, VerdictPublic
from core.methods import DEFAULT_METHOD
from core.prediction.paired_windows import DEFAULT_PRECISION
from core.specs.common import StrictModel
from core.specs.pruning import StoredMethod

PredictMetric = Literal["ppl", "acc", "acc_norm"]
AnswerRung = Literal["best", "measured", "simulated", "profile", "law", "strict"]
MAX_PREDICTION_SPARSITIES = 100

Sparsity = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]
TaskName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")]

TASK_IFF_ACCURACY: dict[str, Any] = {
    "oneOf": [
        {"properties": {"metric": {"const": "ppl"}, "task": {"type": "null"}}},
        {
            "properties": {
                "metric": {"enum": [metric for metric in get_args(PredictMetric) if metric != "ppl"]},
                "task": {"type": "string"},
            },
            "required": ["task"],
        },
    ]
}
"""`task` goes with an accuracy metric and never with `ppl`, said in JSON Schema, so that the OpenAPI
document refuses what the validators refuse (a client generated from it never sends either)."""


class MetricSpec(StrictModel):
    """One metric to predict: `ppl` on the protocol's dataset, or an accuracy on a task."""

    model_config = ConfigDict(json_schema_extra=TASK_IFF_ACCURACY)

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

    model_config = ConfigDict(json_schema_extra=TASK_IFF_ACCURACY)  # checked by PredictionCreate

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


class CalibrationSelector(StrictModel):
    """The calibration windows the prune will use, to pick the profile made on the same ones."""

    corpus: str | None = Field(None, max_length=64)
    num_sequences: int | None = Field(None, ge=1, le=4096)
    seqlen: int | None = Field(None, ge=16, le=32_768)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)


class PredictionCreate(StrictModel):
    """What to predict. Measured points come from the store, or from `points` when you send them
    (then, per metric, only yours are used)."""

    model: str = Field(min_length=1, max_length=512, description="Model id as stored in results.")
    method: StoredMethod = Field(
        DEFAULT_METHOD,
        description="Pruning method whose measured points calibrate, as results store it (an N:M "
        "pattern appended: `wanda-2:4`).",
    )
    protocol: ProtocolSelector = Field(default_factory=ProtocolSelector)
    calibration: CalibrationSelector | None = Field(
        None,
        description="The calibration the prune will use: `before_pruning` then answers from the newest "
        "profile made on matching windows (every field given must match; null: the model's newest "
        "profile). A profile predicts the pruning calibrated as it was profiled.",
    )
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
    rung: AnswerRung = Field(
        "best",
        description="Where each answer comes from: `best` (the first rung that can answer, in the order "
        "measured, simulated, profile, law), or one rung by name; `strict` answers with the strict law "
        "PPL0 ** (1 / (1 - s)), which is otherwise shown for reference only.",
    )
    precision: float | None = Field(
        DEFAULT_PRECISION,
        gt=0.0,
        lt=1.0,
        description="The `simulate` job `measure_missing` queues scores each sparsity on windows paired "
        "with the dense model's until the 95 % band on PPL is within this relative half width (null: "
        "every window). Dense baselines are always measured on every window.",
    )
    measure_missing: bool = Field(
        False,
        description="Queue the jobs that would make a better answer and are missing: with no dense "
        "baseline, the one job that measures it (a `simulate` job for a method that has a simulation, "
        "else `evaluate`) and answer 202 with its link; with a baseline but no simulation (or no "
        "profile, for a method a profile predicts and that has no simulation), queue that job and "
        "answer at once from the rungs there are (false: 409 for a missing baseline; `missing` names "
        "the jobs).",
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


class EstimatePublic(BaseModel):
    """One rung's answer at one sparsity, or why it cannot give one."""

    rung: str = Field(description="`measured`, `simulated`, `profile`, `law`, or `strict` (reference).")
    value: float | None = Field(description="null: this rung cannot answer here (`why_not`).")
    band: list[float | None] | None = Field(
        description="[low, high] at `level`: for perplexity log-normal and never below PPL0; for an "
        "accuracy within [0, 1] (null: no error model)."
    )
    predictor: str
    source: str = Field(description="What it rests on: a job, a profile, fitted points, pooled models.")
    verdict: VerdictPublic
    why_not: str | None = None
    flags: list[str]


class PredictedPublic(BaseModel):
    """The answer at one sparsity: the first rung that can give one (or the one asked for by name),
    its band, its verdict, and every rung beside it in `alternatives`."""

    sparsity: float
    value: float | None = Field(description="null when no rung can answer (see `alternatives`' why_not).")
    band: list[float | None] | None = Field(
        description="[low, high] at `level`: for perplexity log-normal, never below the dense perplexity; "
        "for an accuracy within [0, 1]; null when the answer has no error model."
    )
    level: float
    rung: str | None = Field(None, description="Where `value` came from; null: no rung can answer.")
    predictor: str | None = None
    verdict: VerdictPublic | None = Field(
        None, description="How far the answer can be trusted: " + VERDICT_LEVELS
    )
    alternatives: list[EstimatePublic] = Field(
        default_factory=list,
        description="Every rung's estimate here, best first, with why the others cannot.",
    )
    expected_rel_error: float | None = Field(description="The law rung's: one standard deviation, relative.")
    law: str = Field(description="The law rung's law (details of `alternatives`' law entry).")
    formula: str
    params: dict[str, float | None]
    strict: float | None = Field(None, description="The strict law's value here (perplexity only).")
    strict_vs_value: float | None = Field(None, description="strict / value - 1.")
    flags: list[str]
    notes: list[str]


class MissingJobPublic(BaseModel):
    """A job that would make a better answer: what it gives and its body for POST /v1/jobs."""

    kind: str
    gives: str
    job: dict[str, Any]


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
    missing: list[MissingJobPublic] = Field(
        default_factory=list,
        description="Jobs that would give a better rung and are not in the store (queued with "
        "`measure_missing`: see `queued`).",
    )
    queued: list[JobPublic] = Field(default_factory=list, description="Jobs `measure_missing` queued.")
    before_pruning: BeforePruningPublic | None = Field(
        None,
        description="Perplexity, for a method a stored profile of the model predicts: the feature laws' "
        "predictions from its dense profile, each with its coefficient and backtest record, the method's "
        "pre-registered one named in `chosen` (it answers as the `profile` rung; null: no profile).",
    )


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


class AnswerPointPublic(CurvePointPublic):
    rung: str | None = Field(None, description="The rung that answered here (see POST /v1/predictions).")


class CurvePublic(BaseModel):
    """Measured points and both laws over a sparsity grid, for one model, method, metric, protocol."""

    model: str
    method: str
    metric: str
    task: str | None
    protocol: ProtocolPublic
    level: float
    measured: list[PointPublic] = Field(description="The dense baseline (sparsity 0) and pruned points.")
    source: str = Field("measured", description="`measured` here, or `published` (a paper's table).")
    strict: list[CurvePointPublic] | None = Field(description="Perplexity only; no band.")
    calibrated: list[CurvePointPublic] | None = Field(description="null without a pruned point.")
    calibration: CalibrationPublic | None
    flags: list[str]
    notes: list[str]
    profile_predictor: str | None = Field(
        None,
        description="`slicegpt` perplexity with a stored profile: the chosen feature law "
        "(see `before_pruning` of a prediction).",
    )
    profile_predicted: list[CurvePointPublic] | None = Field(
        None, description="Its predictions with band, up to the profile's largest sparsity."
    )
    simulation_job_id: str | None = Field(
        None, description="Perplexity: the newest `simulate` job of this model, method and protocol."
    )
    simulated: list[CurvePointPublic] | None = Field(
        None,
        description="That job's simulated points at face value, with the sampling band of a subset of "
        "windows (null band: every window scored). Never mixed into `measured`.",
    )
    anchored: list[CurvePointPublic] | None = Field(
        None, description="The simulated curve scaled through that job's anchors (null without anchors)."
    )
    answer: list[AnswerPointPublic] | None = Field(
        None,
        description="Perplexity: what POST /v1/predictions answers at each sparsity of the grid (rung "
        "`best`), with its band and the rung it came from; the line the plot draws boldest.",
    )

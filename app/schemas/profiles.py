"""GET /v1/models/{model}/profile, GET /v1/backtests, and the `before_pruning` part of a prediction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.schemas.records import VERDICT_LEVELS, SummaryPublic, VerdictPublic


class LensPublic(BaseModel):
    """One signal at one width, projected and read through the final norm and head."""

    width: int
    kl: float = Field(description="Mean KL(p_dense || p_projected) over the lens tokens, nats.")
    kl_taylor: float = Field(description="Its Taylor estimate Var_p(dz) / 2.")
    nll_increase: float = Field(description="Mean increase of the next token's NLL, nats.")


class SignalPublic(BaseModel):
    position: int = Field(description="0: the embedding output; then each block's pre-MLP stream and output.")
    name: str
    kind: str = Field(description="`embedding`, `pre-mlp` or `output`.")
    layer: int | None
    discarded: list[float] = Field(description="Raw energy share discarded at each of `widths`.")
    token_discarded: list[float] = Field(
        description="Normalised tokens' energy share discarded at each width."
    )
    lens: list[LensPublic]
    eigenvalues: list[float] | None = Field(
        None, description="With `spectra=true`: of C / positions, descending."
    )
    energy: list[float] | None = Field(
        None, description="With `spectra=true`: each eigenvector's share of the measured windows' energy."
    )
    token_energy: list[float] | None = Field(None, description="With `spectra=true`: per eigenvector.")


class LinearPublic(BaseModel):
    """One block linear: the share of its output energy each mask rule removes at each sparsity."""

    layer: int
    name: str
    rows: int
    columns: int
    output_energy: float = Field(description="tr(W C W^T): the mean squared output norm per token.")
    errors: dict[str, list[float]] = Field(description="Mask rule -> e(s) at each of `sparsities`.")


class ProfilePublic(BaseModel):
    """A stored profile: what slicing to each width would discard, per residual signal, and what each
    unstructured mask rule would remove from the block linears' outputs."""

    id: int
    job_id: str
    model: str
    model_revision: str | None
    family: str
    hidden_size: int
    num_layers: int
    calibration: dict[str, Any]
    round_to: int
    sparsities: list[float]
    widths: list[int]
    protocol: dict[str, Any] = Field(description="Lens tokens, dtype, device, timings, versions.")
    created_at: datetime
    signals: list[SignalPublic]
    mask_features: dict[str, dict[str, list[float]]] = Field(
        description="Per method the profile predicts from mask errors (wanda, sparsegpt, magnitude, "
        "magnitude-row): each feature's value at each of `sparsities`. Empty for profiles without them."
    )
    linears: list[LinearPublic] | None = Field(None, description="With `linears=true`: every block linear.")


class CoefficientPublic(BaseModel):
    value: float
    sd: float = Field(description="Standard deviation of the coefficient itself.")
    sigma: float = Field(description="Spread of one measured ln PPL about the law.")
    source: str
    curves: int = Field(description="Curves pooled into its prior.")
    points: int = Field(description="This curve's own points it was updated with.")


class BacktestPublic(BaseModel):
    """A predictor's held-out record in one mode over the store's curves."""

    rung: str = Field(description="The rung it answers as: simulated, profile, law, or strict (reference).")
    predictor: str
    mode: str
    level: float
    n: int = Field(description="Held-out predictions scored.")
    curves: int
    record: SummaryPublic = Field(description="The |ln| miss pooled model -> curve: what verdicts read.")
    mape: float | None = Field(description="Mean absolute percentage error, kept for comparison only.")
    max_ape: float | None
    coverage: float | None = Field(description="Share of held-out points inside the band (null: no band).")
    points: list[dict[str, Any]] | None = Field(None, description="With `points=true`: every held-out point.")


class FeaturePredictedPublic(BaseModel):
    sparsity: float
    width: int | None = Field(description="SliceGPT's kept width d; null for the intra-layer methods.")
    feature: float | None = Field(
        description="The profile feature at this sparsity (slicing: at width d), to the law's exponent."
    )
    value: float | None = Field(description="null: the profile cannot give the feature here (`why_not`).")
    band: list[float] | None
    level: float
    why_not: str | None = None


class PredictorPublic(BaseModel):
    predictor: str
    feature: str
    description: str
    formula: str = Field(description="ln PPL - ln PPL0 = c * F (a feature law) or c * F^beta (a power law).")
    exponent: float = Field(
        description="beta: 1 for a feature law, pooled from other curves for a power law."
    )
    exponent_sd: float = Field(description="The spread of a new curve's beta about it (0 for a feature law).")
    coefficient: CoefficientPublic
    backtest: BacktestPublic | None = Field(description="Its record in the mode that matches this model.")
    predictions: list[FeaturePredictedPublic]


class BeforePruningPublic(BaseModel):
    """Predictions from the model's dense profile: one per feature law, the chosen one named."""

    profile_id: int
    profile_job_id: str
    calibration: dict[str, Any]
    features_from: str = Field(description="What of the profile the method is predicted from.")
    own_points: int = Field(description="Pruned points of this model under the profile's calibration.")
    mode: str = Field(description="The backtest mode that matches what is known of this model.")
    chosen: str | None = Field(description="The method's pre-registered predictor (null: it cannot answer).")
    reason: str
    verdict: VerdictPublic = Field(
        description="How far the registered predictor's answer can be trusted: " + VERDICT_LEVELS
    )
    predictors: list[PredictorPublic]


class CurvePublic(BaseModel):
    label: str
    model: str
    method: str
    ppl0: float
    points: list[list[float]]
    features: list[str] = Field(description="Profile features known at its points (none: no profile).")


class BacktestList(BaseModel):
    method: str
    level: float
    curves: list[CurvePublic]
    items: list[BacktestPublic]

"""/v1/predictions: predicted perplexity and accuracy at any sparsity, at once, from the laws.

When a dense baseline is missing the answer is a 409 naming the `evaluate` job that would measure
it, or, with `measure_missing`, that job queued (202). The work is in `app.services.predictions`.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.deps import ServicesDep
from app.problems import problem_responses
from app.schemas.predictions import MeasurementQueued, PredictionCreate, PredictionPublic
from app.services import predictions

router = APIRouter(prefix="/v1/predictions", tags=["predictions"])


@router.post(
    "",
    response_model=PredictionPublic,
    responses={
        202: {"model": MeasurementQueued, "description": "`measure_missing`: the baseline's job is queued"},
        **problem_responses(
            {
                409: "Dense baseline unknown: names the evaluate job",
                422: "Invalid request, or points that cannot be fitted",
            }
        ),
    },
)
def create_prediction(body: PredictionCreate, services: ServicesDep) -> Response:
    """Predict each metric at each sparsity, with a band, the law used and the points it was fitted on.

    - **Points**: the store's measured results of this model and method (dense baseline = method
      `dense`, sparsity 0) under one perplexity protocol (`protocol`; unset fields match any, and
      the stored protocol with the most points wins: `protocol.selection` says which); for accuracy
      the results of `task`. Send `points` to use your own values instead (per metric).
    - **Laws**: perplexity: the calibrated law when a pruned point exists, else the strict law
      PPL0 ** (1 / (1 - s)); the strict law is always shown beside it (`strict`) with how far off
      it is on the measured points (`strict_law`). Accuracy: ln(acc / acc0) linear in s, clipped at
      chance; without a pruned point a prior slope (pooled over the store), flagged `prior`.
    - **Missing baseline**: 409 with the `evaluate` job body that measures it (and any queued or
      running evaluate job of the model); with `measure_missing: true` that job is queued: 202.

    Values that are not finite (a law that diverges) are null, with the flag `non_finite`.
    """
    return predictions.create_prediction(body, services)

"""/v1/predictions: predicted perplexity and accuracy at any sparsity, at once, from the best rung.

When a dense baseline is missing the answer is a 409 naming the job that would measure it, or, with
`measure_missing`, that job queued (202). The work is in `app.services.prediction.answer`; the route
only picks the status.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.deps import ServicesDep
from app.problems import problem_responses
from app.schemas.predictions import MeasurementQueued, PredictionCreate, PredictionPublic
from app.services.prediction import answer as answer_service

router = APIRouter(prefix="/v1/predictions", tags=["predictions"])


@router.post(
    "",
    response_model=PredictionPublic,
    responses={
        202: {"model": MeasurementQueued, "description": "`measure_missing`: the baseline's job is queued"},
        **problem_responses(
            {
                409: "Dense baseline unknown: names the job that measures it",
                422: "Invalid request, or points that cannot be fitted",
            }
        ),
    },
)
async def create_prediction(body: PredictionCreate, services: ServicesDep) -> Response:
    """Predict each metric at each sparsity: one `value`, a log-normal `band` (never below the dense
    perplexity), the `rung` it came from and a `verdict` naming the record it rests on.

    - **Rungs, best first** (the first that can answer is the answer; every rung's estimate stays in
      `alternatives`, with `why_not` where it cannot answer):
      `measured` (the store's or your point under this protocol), `simulated` (the newest
      `simulate` job, anchored through measured points), `profile` (the model's profile through the
      method's pre-registered feature law), `law` (the calibrated law on the model's pruned points,
      or alpha pooled over other models' curves). The strict law PPL0 ** (1 / (1 - s)) answers only
      when asked for by name (`rung: strict`); it is always shown beside the answer with how far off
      it is on the measured points (`strict_law`).
    - **Points**: the store's results of this model and method (dense baseline = method `dense`,
      sparsity 0) under one perplexity protocol (`protocol`; unset fields match any, and the stored
      protocol with the most points wins: `protocol.selection` says which); for accuracy the results
      of `task`. Send `points` to use your own values instead (per metric).
    - **Missing baseline**: 409 naming the job that measures it (a `simulate` job, which measures the
      baseline too, where the method can be simulated; else `evaluate`); with `measure_missing: true`
      that job is queued: 202 with its `Location`. With a baseline, `missing` names the jobs that
      would make a better rung, and `measure_missing` queues them.

    Values that are not finite (a law that diverges) are null, with the flag `non_finite`.
    """
    answer = await answer_service.answer_request(body, services)
    if answer.queued_job is not None:
        location = {"Location": f"/v1/jobs/{answer.queued_job}"}
        return Response(answer.json, status_code=202, media_type="application/json", headers=location)
    return Response(answer.json, media_type="application/json")

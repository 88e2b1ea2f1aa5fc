"""/v1/models/{model}/curves: measured points and both laws over sparsity, as JSON, SVG or PNG;
/v1/models/{model}/profile: the model's dense profile (what slicing would discard), as JSON or a heatmap;
/v1/models/{model}/retention: what each pruning keeps of multiple-choice and generative scores.

Model ids may contain slashes (`org/name`, absolute paths): the path parameter takes everything
between `/v1/models/` and the final `/curves`, so `GET /v1/models/HuggingFaceTB/SmolLM2-135M/curves`
works as written, and so does a percent-encoded id (`%2F`). An absolute path id gives a double
slash (`/v1/models//srv/models/x/curves`); clients that collapse slashes should percent-encode it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response

from app.deps import ServicesDep, SessionDep
from app.problems import ProblemError, problem_responses
from app.schemas.predictions import CurvePublic, PredictMetric
from app.schemas.profiles import ProfilePublic
from app.schemas.retention import RetentionPublic
from app.services.prediction.curves import load_curve, selector_from
from app.services.profiles import find_profile, profile_public
from app.services.retention import load_retention
from app.views.curve_plots import curve_png, curve_svg
from app.views.profile_plots import profile_png, profile_svg
from app.views.retention_plots import NothingToDraw, retention_png, retention_svg
from core.methods import DEFAULT_METHOD
from core.prediction.law_prediction import DEFAULT_LEVEL
from core.specs.pruning import StoredMethod

router = APIRouter(prefix="/v1/models", tags=["models"])

CURVE_MEDIA = {"svg": "image/svg+xml", "png": "image/png"}


@router.get(
    "/{model:path}/curves",
    response_model=CurvePublic,
    responses={
        200: {
            "description": "JSON, or the plot with `format=svg` / `format=png`",
            "content": {"image/svg+xml": {}, "image/png": {}},
        },
        **problem_responses(
            {404: "No dense baseline stored for this curve", 409: "Stored points cannot be fitted"}
        ),
    },
)
def model_curves(
    services: ServicesDep,
    model: Annotated[str, Path(min_length=1, max_length=512, description="Model id; may hold slashes.")],
    metric: Annotated[
        PredictMetric,
        Query(description="`ppl`, or `acc` / `acc_norm` of a `task` (required with them: 422 without)."),
    ] = "ppl",
    task: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=128,
            description="Task of `acc` / `acc_norm`: required with them, refused with `ppl` (422).",
        ),
    ] = None,
    method: Annotated[
        StoredMethod, Query(description="Pruning method of the pruned points, as results store it.")
    ] = DEFAULT_METHOD,
    dataset: Annotated[Literal["wikitext2"], Query(description="Corpus of `ppl`.")] = "wikitext2",
    seqlen: Annotated[int | None, Query(ge=16, le=131_072, description="Protocol window length.")] = None,
    max_windows: Annotated[
        str | None,
        Query(pattern=r"^(all|[1-9][0-9]{0,4})$", description="A number, `all`, or unset: any."),
    ] = None,
    dtype: Annotated[Literal["float32", "bfloat16", "float16"] | None, Query()] = None,
    source: Annotated[
        Literal["measured", "published"],
        Query(description="`published`: draw a published curve (`prunecast import-published`) instead."),
    ] = "measured",
    level: Annotated[float, Query(ge=0.5, le=0.999, description="Coverage of the band.")] = DEFAULT_LEVEL,
    format: Annotated[Literal["json", "svg", "png"], Query(description="`json`, `svg` or `png`.")] = "json",
) -> Response:
    """Measured points (dense baseline and pruned), the strict law (perplexity) and the calibrated
    law with its band on a sparsity grid 0..0.9, for one model, method, metric and protocol; with
    `source=published`, a published curve's points instead (never mixed with measured ones).

    The protocol is chosen as in POST /v1/predictions (`protocol.selection` says which). With
    `format=svg` or `format=png` the same curve is drawn: measured points, strict law dashed,
    calibrated law with its shaded band.
    """
    selector = selector_from(dataset, seqlen, max_windows, dtype, source)
    curve = load_curve(services, model, method, metric, task, selector, level)
    if format == "json":
        return Response(curve.model_dump_json(), media_type="application/json")
    if format == "svg":
        return Response(curve_svg(curve), media_type=CURVE_MEDIA["svg"])
    return Response(curve_png(curve), media_type=CURVE_MEDIA["png"])


@router.get(
    "/{model:path}/profile",
    response_model=ProfilePublic,
    responses={
        200: {
            "description": "JSON, or the heatmap with `format=svg` / `format=png`",
            "content": {"image/svg+xml": {}, "image/png": {}},
        },
        **problem_responses({404: "No profile of this model matches"}),
    },
)
def model_profile(
    services: ServicesDep,
    session: SessionDep,
    model: Annotated[str, Path(min_length=1, max_length=512, description="Model id; may hold slashes.")],
    job_id: Annotated[str | None, Query(max_length=36, description="The profile job's id.")] = None,
    corpus: Annotated[str | None, Query(max_length=64, description="Calibration corpus.")] = None,
    num_sequences: Annotated[int | None, Query(ge=1, le=4096, description="Calibration windows.")] = None,
    seqlen: Annotated[int | None, Query(ge=16, le=32_768, description="Calibration window length.")] = None,
    seed: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="Calibration seed.")] = None,
    spectra: Annotated[bool, Query(description="Include every signal's full spectrum.")] = False,
    linears: Annotated[bool, Query(description="Include every block linear's mask errors.")] = False,
    rule: Annotated[
        Literal["wanda", "magnitude", "magnitude-row"] | None,
        Query(description="With `format=svg|png`: draw this mask rule's errors per linear instead."),
    ] = None,
    format: Annotated[Literal["json", "svg", "png"], Query(description="`json`, `svg` or `png`.")] = "json",
) -> Response:
    """The newest profile of the model matching the filters: per residual signal the share of raw
    and normalised-token energy slicing would discard at each profiled width, and the lens readings
    (that signal projected on its top-d eigenvectors, read through the final norm and head), and
    per intra-layer method the mask-error features its predictions use. With `rule` and an image
    format: each block linear's mask error at each sparsity as a heatmap. With
    `format=svg` or `png`: the discarded token-energy share for every width, per signal, as a heatmap."""
    calibration = {"corpus": corpus, "num_sequences": num_sequences, "seqlen": seqlen, "seed": seed}
    profile = find_profile(session, services.settings, model, job_id, calibration)
    if profile is None:
        raise ProblemError(
            404,
            f"no profile of model {model!r} matches; submit a `profile` job (POST /v1/jobs, kind "
            "`profile`) with the calibration your prune would use",
            slug="profile-not-found",
        )
    if format == "json":
        return Response(
            profile_public(profile, spectra=spectra, linears=linears).model_dump_json(),
            media_type="application/json",
        )
    if rule is not None and not profile.offers_rule(rule):
        raise ProblemError(
            404,
            f"the profile of model {model!r} has no {rule!r} mask errors (made before they were measured)",
            slug="profile-not-found",
        )
    if format == "svg":
        return Response(profile_svg(profile, rule), media_type=CURVE_MEDIA["svg"])
    return Response(profile_png(profile, rule), media_type=CURVE_MEDIA["png"])


@router.get(
    "/{model:path}/retention",
    response_model=RetentionPublic,
    responses={
        200: {
            "description": "JSON, or the bar chart with `format=svg` / `format=png`",
            "content": {"image/svg+xml": {}, "image/png": {}},
        },
        **problem_responses({404: "Nothing to draw: no pruned result with a paired dense one"}),
    },
)
def model_retention(
    session: SessionDep,
    model: Annotated[str, Path(min_length=1, max_length=512, description="Model id; may hold slashes.")],
    format: Annotated[Literal["json", "svg", "png"], Query(description="`json`, `svg` or `png`.")] = "json",
) -> Response:
    """When pruning works for this model: per pruning (method at sparsity) the share of the dense
    score each task keeps, multiple choice beside generative (LAMBADA, GSM8K) and perplexity, their
    means, a verdict (does generation break first?), and the newest probe job's final KL and greedy
    agreement for the same pruning. JSON is always answered (an empty list when nothing is paired);
    a plot of nothing is a 404."""
    view = load_retention(session, model)
    if format == "json":
        return Response(view.model_dump_json(), media_type="application/json")
    try:
        if format == "svg":
            return Response(retention_svg(view), media_type=CURVE_MEDIA["svg"])
        return Response(retention_png(view), media_type=CURVE_MEDIA["png"])
    except NothingToDraw as error:
        raise ProblemError(404, f"{error}; {view.notes[-1]}", slug="nothing-to-draw") from error

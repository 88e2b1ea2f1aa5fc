"""Liveness, readiness and metrics: the endpoints orchestrators and Prometheus call."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from app.deps import ServicesDep, TrustedDep
from app.problems import ProblemError, problem_responses
from app.schemas.health import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """Liveness: the process answers. Checks no dependency, so a store outage never restarts it."""
    return Health(status="ok")


@router.get(
    "/readyz", response_model=Health, responses=problem_responses({503: "Store or queue unreachable"})
)
def readyz(services: ServicesDep, trusted: TrustedDep) -> Health:
    """Readiness: the store and the queue are reachable (a 503 problem naming the failing check
    otherwise, with `checks` as on success). It stays public when API tokens are set; only a caller
    with a valid token (or any caller, with no tokens set) is told why a check failed, since the
    reason can name the exception and the queue's address."""
    checks: dict[str, str] = {}
    try:
        with services.store.session() as session:
            session.execute(text("SELECT 1"))
        checks["store"] = "ok"
    except Exception as error:
        checks["store"] = f"unavailable: {type(error).__name__}" if trusted else "unavailable"
    try:
        services.queue.ping()
        checks["queue"] = "ok"
    except Exception as error:
        checks["queue"] = f"unavailable: {error}" if trusted else "unavailable"
    failing = sorted(name for name, value in checks.items() if value != "ok")
    if failing:
        raise ProblemError(
            503,
            f"not ready: {', '.join(f'{name} {checks[name]}' for name in failing)}",
            slug="not-ready",
            title="Not ready",
            headers={"Retry-After": str(services.settings.store_retry_after_s)},
            checks=checks,
        )
    return Health(status="ok", checks=checks)


metrics_router = APIRouter(tags=["health"])
"""/metrics alone: behind the API token only when PRUNECAST_METRICS_REQUIRE_TOKEN is set (create_app)."""


@metrics_router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(services: ServicesDep) -> Response:
    """Prometheus exposition: HTTP traffic, jobs by kind and status, job durations, queue depth. Behind
    the API token when PRUNECAST_METRICS_REQUIRE_TOKEN is set."""
    registry = services.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

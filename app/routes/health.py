"""Liveness, readiness and metrics: the endpoints orchestrators and Prometheus call."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from app.deps import ServicesDep
from app.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """Liveness: the process answers. Checks no dependency, so a store outage never restarts it."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(services: ServicesDep) -> Response:
    """Readiness: the store and the queue are reachable (503 and the failing check otherwise)."""
    checks: dict[str, str] = {}
    try:
        with services.store.session() as session:
            session.execute(text("SELECT 1"))
        checks["store"] = "ok"
    except Exception as error:
        checks["store"] = f"unavailable: {type(error).__name__}"
    try:
        services.queue.ping()
        checks["queue"] = "ok"
    except Exception as error:
        checks["queue"] = f"unavailable: {error}"
    ready = all(value == "ok" for value in checks.values())
    body = Health(status="ok" if ready else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(services: ServicesDep) -> Response:
    """Prometheus exposition: HTTP traffic, jobs by kind and status, job durations, queue depth."""
    registry = services.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

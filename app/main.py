"""create_app(): the FastAPI application, its lifespan (store, queue, reconciler) and middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry

from app.deps import Services, require_token
from app.docs_access import DocsGate
from app.metrics import HttpMetrics, HttpMetricsMiddleware, StoreCollector
from app.middleware import BodySizeLimit, StorableText, document_storable_text
from app.problems import LastResort, document_problems, install_problem_handlers
from app.queueing import make_queue
from app.reconciler import Reconciler
from app.routes import backtests, fits, health, jobs, models, predictions, probes, reports, results
from core.async_reads import AsyncReader
from core.logs import configure_logging
from core.migrate import pending_migrations
from core.settings import Settings, get_settings
from core.store import Store

log = structlog.get_logger(__name__)

DESCRIPTION = """
**prunecast** tells you what pruning will do to a language model before you ship it.

1. `POST /v1/jobs` with a job (`kind: evaluate` measures WikiText-2 perplexity of a model;
   `kind: prune` with `method: slicegpt` slices it at a `sparsity` and measures it against the
   dense baseline; `kind: sweep` does so at a list of `sparsities` and fits the prediction laws
   to the points; `kind: probe` measures where a pruned model deviates from its dense model, layer
   by layer, with Taylor estimates, and how its generations diverge); you get `202` and a `Location`.
   Besides `slicegpt`, `prune` takes `magnitude`, `wanda`, `sparsegpt` (unstructured, 2:4, 4:8),
   `attention-drop`, `mlp-drop` and `shortgpt`.
2. `GET /v1/jobs/{id}/wait?timeout=60` blocks until the job ends (or the timeout);
   `GET /v1/jobs/{id}` shows its stage and progress at any time; `DELETE` cancels it.
3. `GET /v1/results?model=...&metric=ppl` returns every measured number with its protocol;
   `GET /v1/fits?model=...` (or `?job_id=` of a sweep) the laws fitted to them and their quality.
4. `POST /v1/predictions` predicts perplexity (and accuracy) at any sparsity in milliseconds from
   the dense baseline and the measured points, with a band and the law used;
   `GET /v1/models/{model}/curves` draws them (JSON, SVG, PNG); `GET /v1/jobs/{id}/report` is a
   job's page for people.
5. `GET /v1/jobs/{id}/probes` lists a probe job's points with how well the Taylor estimates track
   them; `GET /v1/jobs/{id}/probes/plot.svg?view=layers|heatmap|generation` draws them.

Errors are RFC 9457 `application/problem+json`. When the server has API tokens configured,
send `Authorization: Bearer <token>` (the *Authorize* button above).
"""

TAGS = [
    {
        "name": "jobs",
        "description": "Submit, follow, cancel and wait for jobs (evaluate, prune, sweep, probe).",
    },
    {
        "name": "probes",
        "description": "Deviation probes of a pruned model against its dense model: points, summary, plots.",
    },
    {"name": "results", "description": "Measured numbers, with the protocol that produced them."},
    {
        "name": "fits",
        "description": "Prediction laws fitted to measured points by sweeps, with their quality.",
    },
    {"name": "predictions", "description": "Predicted perplexity and accuracy at any sparsity, at once."},
    {"name": "models", "description": "Per-model views over the results: curves as JSON, SVG, PNG."},
    {"name": "health", "description": "Liveness, readiness and Prometheus metrics."},
]


def create_app(settings: Settings | None = None, *, start_background: bool = True) -> FastAPI:
    """Build the app. `start_background=False` skips the reconciler (for tools and tests)."""
    settings = settings or get_settings()
    configure_logging(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.store_url)
        if pending_migrations(store.engine):
            store.dispose()
            raise RuntimeError(f"the store at {store.engine.url!r} is not migrated: run `prunecast migrate`")
        queue = make_queue(settings, store)
        store_collector = StoreCollector(store, queue)
        registry.register(store_collector)
        async_reader = AsyncReader.for_url(settings.store_url)
        app.state.services = Services(
            settings=settings, store=store, queue=queue, metrics_registry=registry, async_reader=async_reader
        )
        reconciler = Reconciler(store, queue, settings) if start_background else None
        if reconciler:
            reconciler.start()
        log.info(
            "prunecast api started", embedded=settings.embedded, store=store.engine.url.get_backend_name()
        )
        try:
            yield
        finally:
            if reconciler:
                reconciler.stop()
            registry.unregister(store_collector)
            queue.close()
            if async_reader:
                await async_reader.close()
            store.dispose()

    # Swagger UI and ReDoc served from the package's own copies, never from a CDN: the machines the
    # service runs on often have no internet access, and a CDN-loaded /docs is then a blank page.
    app = FastAPIOffline(
        docs_url=DOCS_URL,
        redoc_url=REDOC_URL,
        title="prunecast",
        version="0.1.0",
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=lifespan,
    )
    registry = CollectorRegistry()
    install_problem_handlers(app, retry_after_s=settings.store_retry_after_s)
    protected = [Depends(require_token)]
    for router in PROTECTED_ROUTERS:
        app.include_router(router, dependencies=protected)
    app.include_router(health.router)
    app.include_router(
        health.metrics_router, dependencies=protected if settings.metrics_require_token else []
    )
    # Added innermost first: LastResort sits inside Starlette's own error middleware.
    app.add_middleware(LastResort)
    if settings.docs_require_token and settings.api_tokens:
        docs = [app.openapi_url, DOCS_URL, REDOC_URL, app.swagger_ui_oauth2_redirect_url]
        app.add_middleware(DocsGate, tokens=settings.api_tokens, paths=[path for path in docs if path])
    app.add_middleware(StorableText)
    app.add_middleware(HttpMetricsMiddleware, metrics=HttpMetrics(registry))
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                tags=app.openapi_tags,
            )
            protected_paths = {"/v1/", "/metrics"} if settings.metrics_require_token else {"/v1/"}
            schema = document_problems(schema, protected=protected_paths)
            app.openapi_schema = document_storable_text(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


DOCS_URL = "/docs"
REDOC_URL = "/redoc"
"""Swagger UI and ReDoc; behind the API token with /openapi.json when PRUNECAST_DOCS_REQUIRE_TOKEN is set."""

PROTECTED_ROUTERS = (
    jobs.router,
    results.router,
    fits.router,
    probes.router,
    reports.router,
    predictions.router,
    backtests.router,
    models.router,
)
"""Routers under /v1: behind the bearer token when PRUNECAST_API_TOKENS is set."""

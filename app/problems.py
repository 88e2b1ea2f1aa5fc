"""RFC 9457 problem details: every error the API returns has this body.

Handlers cover our own ProblemError, FastAPI/Starlette HTTP errors, request validation errors
(with the failing fields listed) and a store outage (503 with Retry-After); `LastResort` turns any
other exception into a 500 problem without dropping the client's connection. `document_problems`
makes the OpenAPI document say so: every error response is `application/problem+json`.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as StarletteRequest
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.store import StoreUnavailable, is_outage

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://prunecast.dev/problems/"

log = structlog.get_logger(__name__)


class Problem(BaseModel):
    """An RFC 9457 problem details object. Problems may carry more members (e.g. `errors` of a
    validation failure, or the `job` that would supply a missing baseline)."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


class ProblemError(Exception):
    """Raise anywhere in a request to answer with a problem+json body."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        slug: str | None = None,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.slug = slug
        self.title = title or HTTPStatus(status).phrase
        self.headers = headers
        self.extra = extra


def problem_response(
    status: int,
    detail: str | None,
    *,
    request: StarletteRequest,
    slug: str | None = None,
    title: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug if slug else "about:blank",
        "title": title or HTTPStatus(status).phrase,
        "status": status,
        "instance": request.url.path,
    }
    if detail:
        body["detail"] = detail
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def problem_responses(described: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error statuses of one operation, each a problem body."""
    return {status: {"model": Problem, "description": text} for status, text in described.items()}


def _jsonable_errors(errors: Any) -> list[dict[str, Any]]:
    cleaned = []
    for error in errors:
        location = [str(part) for part in error.get("loc", ())]
        cleaned.append(
            {"loc": location, "msg": str(error.get("msg", "")), "type": str(error.get("type", ""))}
        )
    return cleaned


def _invalid_request(request: StarletteRequest, errors: list[dict[str, Any]]) -> JSONResponse:
    summary = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
    return problem_response(
        422,
        f"request is invalid: {summary}",
        request=request,
        slug="validation-error",
        title="Request validation failed",
        errors=errors,
    )


_UNPARSABLE = "JSON decode error: the body is not UTF-8, or nests too deep to parse"


def _unparsable_body(error: StarletteHTTPException) -> bool:
    """FastAPI answers 400 to a JSON body it cannot decode at all (bytes that are not UTF-8, arrays
    nested past Python's recursion limit) but 422 to one with a syntax error. Both are the same
    client mistake, a body that is not JSON, so both answer the 422 validation problem every other
    bad body gets and every operation documents: one status for "fix your body", with `errors`
    naming it, rather than a 400 no operation declares."""
    return error.status_code == 400 and isinstance(error.__cause__, ValueError | RecursionError)


def _allowed_methods(request: StarletteRequest) -> str:
    """Every method some route serves at this path: Starlette's 405 names only the methods of the
    first route that matched the path (GET of /v1/jobs/{id}, never its DELETE). Asked of the routes
    one method at a time, through `matches` alone, so included routers are searched too. Empty for a
    405 of a mounted app (the static files), whose scope the app's routes no longer match."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    )


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
"""What `Allow` may list; OPTIONS is served by no route (it answers this 405 too)."""


STORE_ERRORS = (StoreUnavailable, PoolTimeoutError, DBAPIError)
"""Handled by `_store`: DBAPIError covers the driver's Operational and Interface errors."""


def install_problem_handlers(app: FastAPI, retry_after_s: int) -> None:
    """Route every error path through problem+json."""

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, error: ProblemError) -> JSONResponse:
        return problem_response(
            error.status,
            error.detail,
            request=request,
            slug=error.slug,
            title=error.title,
            headers=error.headers,
            **error.extra,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if _unparsable_body(error):
            return _invalid_request(request, [{"loc": ["body"], "msg": _UNPARSABLE, "type": "json_invalid"}])
        detail = error.detail if isinstance(error.detail, str) else None
        headers = dict(error.headers) if error.headers else {}
        if error.status_code == 405 and (allowed := _allowed_methods(request)):
            headers["Allow"] = allowed
        return problem_response(error.status_code, detail, request=request, headers=headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError) -> JSONResponse:
        return _invalid_request(request, _jsonable_errors(error.errors()))

    async def _store(request: Request, error: Exception) -> JSONResponse:
        if not is_outage(error):
            raise error  # a real bug: LastResort answers 500 and logs it
        log.warning("store unreachable; answering 503", path=request.url.path, error=type(error).__name__)
        return problem_response(
            503,
            "the store is unreachable right now; the request changed nothing it did not commit: "
            f"retry in {retry_after_s}s",
            request=request,
            slug="store-unavailable",
            title="Store unavailable",
            headers={"Retry-After": str(retry_after_s)},
        )

    for error_class in STORE_ERRORS:
        app.add_exception_handler(error_class, _store)


class LastResort:
    """Answer an exception no handler took with a 500 problem, and keep the connection open.

    Starlette's own last handler re-raises after answering, which makes the server drop the
    connection, so a client's next request on it would be reset. This middleware sits inside that
    one and never re-raises.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            log.exception("unhandled error", path=scope.get("path"))
            if started:
                raise  # half a response is out: only dropping the connection can end it
            response = problem_response(
                500,
                "internal error; it has been logged",
                request=StarletteRequest(scope),
                slug="internal-error",
            )
            await response(scope, receive, send)


def document_problems(schema: dict[str, Any], protected: set[str]) -> dict[str, Any]:
    """Make the OpenAPI document say what the API does on errors: every 4xx and 5xx body is
    `application/problem+json` (the Problem schema, FastAPI's own validation error included); every
    operation may answer 422 and 503, body-taking ones 413, `protected` paths 401."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    common = {
        422: "Invalid request (the problem lists the failing fields in `errors`)",
        503: "The store is unreachable for a moment; retry after `Retry-After` seconds",
    }
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            wanted = dict(common)
            if "requestBody" in operation:
                wanted[413] = "Request body too large"
            if any(path.startswith(prefix) for prefix in protected):
                wanted[401] = "Missing or invalid bearer token"
            for status, text in wanted.items():
                responses.setdefault(str(status), {"description": text})
            for status, response in responses.items():
                if status[0] in "45":
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": problem_ref}}
    return schema

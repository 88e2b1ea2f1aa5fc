"""RFC 9457 problem details: every error the API returns has this body.

Handlers cover our own ProblemError, FastAPI/Starlette HTTP errors, request validation errors
(with the failing fields listed) and, as a last resort, unexpected exceptions, so a client
never sees a bare text or HTML error.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://prunecast.dev/problems/"

log = structlog.get_logger(__name__)


class Problem(BaseModel):
    """An RFC 9457 problem details object (documented for clients in the OpenAPI schema)."""

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
    request: Request,
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


def _jsonable_errors(errors: Any) -> list[dict[str, Any]]:
    cleaned = []
    for error in errors:
        location = [str(part) for part in error.get("loc", ())]
        cleaned.append(
            {"loc": location, "msg": str(error.get("msg", "")), "type": str(error.get("type", ""))}
        )
    return cleaned


def install_problem_handlers(app: FastAPI) -> None:
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
        detail = error.detail if isinstance(error.detail, str) else None
        headers = dict(error.headers) if error.headers else None
        return problem_response(error.status_code, detail, request=request, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = _jsonable_errors(error.errors())
        summary = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
        return problem_response(
            422,
            f"request is invalid: {summary}",
            request=request,
            slug="validation-error",
            title="Request validation failed",
            errors=errors,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error", path=request.url.path)
        return problem_response(
            500, "internal error; it has been logged", request=request, slug="internal-error"
        )

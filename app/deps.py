"""Typed request dependencies: the process's settings, store session and job queue."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from app.problems import ProblemError
from app.queueing import JobQueue
from core.async_reads import AsyncReader
from core.settings import Settings
from core.store import Store
from core.tables import MAX_ROW_ID


@dataclass
class Services:
    """What create_app builds once and every request shares."""

    settings: Settings
    store: Store
    queue: JobQueue
    metrics_registry: CollectorRegistry
    async_reader: AsyncReader | None = None
    """Reads awaited on the event loop (PostgreSQL stores; `core.async_reads`)."""


async def get_services(request: Request) -> Services:
    """`async` although it awaits nothing: FastAPI runs a plain `def` dependency in its threadpool, a
    thread hop per request for an attribute read (and `require_token` likewise)."""
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_session(services: ServicesDep) -> Iterator[Session]:
    with services.store.session() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]

CursorQuery = Annotated[
    int | None, Query(ge=0, le=MAX_ROW_ID, description="`next_cursor` of the previous page.")
]
"""The keyset cursor of a list of integer-id rows (results, fits, probe points)."""

_bearer = HTTPBearer(auto_error=False, description="Required when the server has PRUNECAST_API_TOKENS set.")


async def require_token(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Bearer-token check; a no-op when no tokens are configured."""
    tokens = services.settings.api_tokens
    if not tokens:
        return
    challenge = {"WWW-Authenticate": 'Bearer realm="prunecast"'}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ProblemError(
            401, "send 'Authorization: Bearer <token>'", slug="unauthorized", headers=challenge
        )
    if not _valid(credentials.credentials, tokens):
        raise ProblemError(401, "the bearer token is not valid", slug="unauthorized", headers=challenge)


def _valid(presented: str, tokens: Sequence[str]) -> bool:
    # Header values arrive decoded as latin-1; compared as bytes, a non-ASCII token is just wrong.
    raw = presented.encode("latin-1")
    return any(hmac.compare_digest(raw, token.encode()) for token in tokens)


def carries_token(authorization: str, tokens: Sequence[str], *, basic: bool = False) -> bool:
    """True when an `Authorization` header value carries one of `tokens`: as a bearer token, or, with
    `basic`, as the password of Basic credentials (any user name), which is what a browser sends for
    a page once its login prompt is filled in: a browser cannot add a bearer header to a page it opens."""
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    if basic and scheme.lower() == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode("latin-1").partition(":")[2]
        except binascii.Error:
            return False
    elif scheme.lower() != "bearer":
        return False
    return bool(value) and _valid(value, tokens)


async def is_trusted(services: ServicesDep, request: Request) -> bool:
    """True when the caller may see internals (exception classes, addresses): no tokens are
    configured, or it sent a valid one. For public endpoints that say more to a trusted caller; the
    header is read by hand so that OpenAPI does not mark such an endpoint as needing a token."""
    tokens = services.settings.api_tokens
    return not tokens or carries_token(request.headers.get("authorization", ""), tokens)


TrustedDep = Annotated[bool, Depends(is_trusted)]

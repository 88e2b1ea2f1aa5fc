"""Typed request dependencies: the process's settings, store session and job queue."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from app.config import Settings
from app.db import Store
from app.problems import ProblemError
from app.queueing import JobQueue


@dataclass
class Services:
    """What create_app builds once and every request shares."""

    settings: Settings
    store: Store
    queue: JobQueue
    metrics_registry: CollectorRegistry


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_session(services: ServicesDep) -> Iterator[Session]:
    with services.store.session() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="Required when the server has PRUNECAST_API_TOKENS set.")


def require_token(
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
    if not any(hmac.compare_digest(credentials.credentials, token) for token in tokens):
        raise ProblemError(401, "the bearer token is not valid", slug="unauthorized", headers=challenge)

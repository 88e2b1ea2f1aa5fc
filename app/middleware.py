"""Checks on every request before any route sees it: its body's size, and text the store cannot hold."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.problems import problem_response
from core.text import invalid_character


class BodySizeLimit:
    """Refuse request bodies over the limit with 413 before any handler parses them."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = declared is not None and declared.isdigit() and int(declared) > self.max_bytes
        messages: list[Message] = []
        if not too_big:
            received = 0
            while True:
                message = await receive()
                messages.append(message)
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    too_big = True
                    break
                if message["type"] != "http.request" or not message.get("more_body", False):
                    break
        if too_big:
            response = problem_response(
                413,
                f"request body exceeds {self.max_bytes} bytes",
                request=Request(scope),
                slug="body-too-large",
            )
            await response(scope, receive, send)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


class StorableText:
    """Refuse (422, naming the parameter) a path or query parameter holding a character the store
    cannot hold (`core.text`): a NUL byte would otherwise reach a PostgreSQL comparison as an
    error. Request bodies are checked by their schemas (`core.specs.common.StrictModel`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = _invalid_parameter(scope)
            if problem is not None:
                where, what = problem
                response = problem_response(
                    422,
                    f"{where} contains {what}, which the store cannot hold",
                    request=Request(scope),
                    slug="validation-error",
                    title="Request validation failed",
                    errors=[
                        {"loc": where.split(" ", 1), "msg": f"contains {what}", "type": "invalid_character"}
                    ],
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _invalid_parameter(scope: Scope) -> tuple[str, str] | None:
    raw_path: bytes = scope.get("raw_path") or scope.get("path", "").encode()
    path = unquote(raw_path.decode("latin-1"), errors="surrogateescape")
    if (what := invalid_character(path)) is not None:
        return "path", what
    query = (scope.get("query_string") or b"").decode("latin-1")
    for key, value in parse_qsl(query, keep_blank_values=True, errors="surrogateescape"):
        for text in (key, value):
            if (what := invalid_character(text)) is not None:
                return f"query {key!r}", what
    return None

"""Checks on every request before any route sees it: its body's size, and text the store cannot hold."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any
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


NO_NUL_PATTERN = "^[^\\u0000]*$"
"""What a request string may hold, as a JSON Schema pattern. Lone surrogates are refused too, but no
client can send one in a query (UTF-8 cannot encode it) and JSON Schema strings are Unicode text
without them; naming them would also make JavaScript's non-Unicode regexes refuse every emoji."""

_ONE_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs")
_FIXED_TEXT = frozenset({"pattern", "enum", "const", "format"})


def document_storable_text(schema: dict[str, Any]) -> dict[str, Any]:
    """Make the OpenAPI document say what StorableText and the request models refuse: every free
    string of a path or query parameter or a request body (one without a pattern, enum or const of
    its own) gets a pattern excluding NUL, so a client that follows the spec never meets that 422.
    Response schemas are left alone: a problem's `instance` echoes the path it refused."""
    schema = copy.deepcopy(schema)  # models' `json_schema_extra` dicts may be shared into it
    components = schema.get("components", {}).get("schemas", {})
    followed: set[str] = set()
    pending = list(_request_schemas(schema))
    while pending:
        node = pending.pop()
        if not isinstance(node, dict):
            continue
        reference = node.get("$ref")
        if reference and reference not in followed:
            followed.add(reference)
            pending.append(components.get(reference.rsplit("/", 1)[1]))
        if node.get("type") == "string" and not _FIXED_TEXT & node.keys():
            node["pattern"] = NO_NUL_PATTERN
        pending.extend(_subschemas(node))
    return schema


def _request_schemas(schema: dict[str, Any]) -> Iterator[Any]:
    """The schemas of every path and query parameter and request body."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") in ("path", "query"):
                    yield parameter.get("schema")
            for media in operation.get("requestBody", {}).get("content", {}).values():
                yield media.get("schema")


def _subschemas(node: dict[str, Any]) -> Iterator[Any]:
    """The schemas directly inside `node` (its `$ref` aside)."""
    for key in _ONE_SUBSCHEMA:
        if key in node:
            yield node[key]
    for key in _SUBSCHEMA_LISTS:
        yield from node.get(key, [])
    for key in _SUBSCHEMA_MAPS:
        yield from node.get(key, {}).values()

"""/docs, /redoc and /openapi.json behind the API tokens, when PRUNECAST_DOCS_REQUIRE_TOKEN asks.

A browser cannot add a bearer header to a page it opens, so these pages also take the token the
way a browser sends one by itself: they answer 401 with a `Basic` challenge, the browser shows its
login prompt, and the token typed as the password (any user name) comes back as Basic credentials.
The browser then sends them with every request the page makes to the same server, so the
/openapi.json that Swagger UI and ReDoc fetch gets them too. The token never goes into a URL (where
access logs and the history would keep it), and the credentials the browser keeps open these
read-only pages alone: /v1 takes bearer tokens only, so no other site can make the browser act on
the API with them. Tools keep sending `Authorization: Bearer <token>`, as on /v1.

The scripts and styles under the offline static folder stay public: they are the installed
Swagger UI and ReDoc packages and say nothing about this API.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.deps import carries_token
from app.problems import problem_response

CHALLENGE = {"WWW-Authenticate": 'Basic realm="prunecast docs", charset="UTF-8"'}


class DocsGate:
    """Answer 401 (a problem, with a Basic challenge) on the documentation paths to a request that
    carries none of the tokens, as a bearer token or as a Basic password."""

    def __init__(self, app: ASGIApp, tokens: Sequence[str], paths: Collection[str]) -> None:
        self.app = app
        self.tokens = tokens
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths:
            request = Request(scope)
            if not carries_token(request.headers.get("authorization", ""), self.tokens, basic=True):
                response = problem_response(
                    401,
                    "the API documentation needs an API token: sign in with the token as the password "
                    "(any user name), or send 'Authorization: Bearer <token>'",
                    request=request,
                    slug="unauthorized",
                    headers=CHALLENGE,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

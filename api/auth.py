"""API-key guard for every route but /health: Bearer token or x-api-key, compared in constant time."""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from strata.api.errors import APIError, error_response

OPEN_PATHS = frozenset({"/health"})


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]

    def _ok(self, presented: bytes | None) -> bool:
        if presented is None:
            return False
        # check every key so timing does not reveal which one (or whether any) nearly matched: a list,
        # not a generator, so any() cannot stop at the first match
        return any([hmac.compare_digest(presented, k) for k in self.keys])  # noqa: C419

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        # compared as bytes, never decoded: a header that is not UTF-8 is just a wrong key (401)
        headers = {k.lower(): v for k, v in scope["headers"]}
        auth = headers.get(b"authorization", b"")
        token = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key")
        if self._ok(token):
            await self.app(scope, receive, send)
            return
        msg = "missing API key" if token is None else "invalid API key"
        resp = error_response(Request(scope), APIError(401, msg, code="invalid_api_key"))
        await resp(scope, receive, send)

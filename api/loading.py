"""Ready means ready: the socket opens at once, the model loads and warms up behind it.

While `Loading.ready` is False, /health answers 503 `{"status": "loading", ...}` with the phase and the
time spent, /openapi.json is served (with a key, as always), and every other route answers 503 in its
protocol's shape with Retry-After (after the API key check, so a wrong key is still a 401). The warm-up runs
what the first requests would otherwise pay for (kernel builds, a graph per batch size, a prefill pass), so
the first request after ready costs what any other does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from strata.api.errors import APIError, error_response

OPEN_WHILE_LOADING = ("/health", "/openapi.json")


@dataclass(slots=True)
class Loading:
    phase: str = "starting"
    ready: bool = False
    error: str | None = None
    started: float = field(default_factory=time.monotonic)

    def body(self) -> dict[str, object]:
        return {
            "status": "loading",
            "phase": self.phase,
            "elapsed_s": round(time.monotonic() - self.started, 1),
        }


class LoadingGate:
    def __init__(self, app: ASGIApp, loading: Loading) -> None:
        self.app, self.loading = app, loading

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.loading.ready or scope["path"] in OPEN_WHILE_LOADING:
            await self.app(scope, receive, send)
            return
        err = APIError(
            503,
            f"the model is loading ({self.loading.phase}); retry shortly",
            code="loading",
            headers={"Retry-After": "2"},
        )
        await error_response(Request(scope), err)(scope, receive, send)

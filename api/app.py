"""The Starlette application: routes, API-key guard, and client errors in protocol shape."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from strata.api import anthropic_messages, openai_chat, openai_completions, openapi, ops
from strata.api.auth import APIKeyMiddleware
from strata.api.errors import APIError, error_response
from strata.api.loading import Loading, LoadingGate
from strata.conf.server import ServerConfig
from strata.errors import ContextOverflowError, StrataError


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(request, exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    msg = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed here"}
    err = APIError(exc.status_code, msg.get(exc.status_code, str(exc.detail)), headers=exc.headers)
    return error_response(request, err)  # 405 keeps Starlette's Allow header


async def _strata_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, ContextOverflowError):
        return error_response(request, APIError(400, str(exc), code="context_length_exceeded"))
    return error_response(request, APIError(400, str(exc)))


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug: still an answer in the protocol's shape (Starlette logs the traceback)."""
    return error_response(
        request, APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")
    )


def build_app(cfg: ServerConfig, loading: Loading) -> Starlette:
    """The app, before the model is loaded: `app.state.strata` (AppState) is set when loading is done
    (`Loading.ready`); until then the gate answers for it."""
    routes = [
        Route("/health", ops.health, methods=["GET"]),
        Route("/v1/models", ops.models, methods=["GET"]),
        Route("/v1/status", ops.status, methods=["GET"]),
        Route("/props", ops.props, methods=["GET"]),
        Route("/metrics", ops.metrics, methods=["GET"]),
        Route("/tokenize", ops.tokenize, methods=["POST"]),
        Route("/detokenize", ops.detokenize, methods=["POST"]),
        Route("/v1/chat/completions", openai_chat.chat_completions, methods=["POST"]),
        Route("/v1/completions", openai_completions.completions, methods=["POST"]),
        Route("/v1/messages", anthropic_messages.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic_messages.count_tokens, methods=["POST"]),
        Route("/openapi.json", openapi.openapi, methods=["GET"]),
    ]

    if cfg.test_hooks:
        routes.append(Route("/debug/fault", ops.inject_fault, methods=["POST"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if app.state.strata is not None:
                app.state.strata.scheduler.stop()

    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(APIKeyMiddleware, keys=cfg.api_keys),
            Middleware(LoadingGate, loading=loading),
        ],
        exception_handlers={
            APIError: _api_error,
            HTTPException: _http_error,
            StrataError: _strata_error,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )
    app.state.strata = None
    app.state.loading = loading
    app.state.openapi = openapi.build_spec()
    return app

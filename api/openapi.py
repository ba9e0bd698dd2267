"""GET /openapi.json: the API described from the same pydantic models that validate requests, so
the description cannot drift from what the server accepts (the CI fuzzer reads it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.api.auth import OPEN_PATHS
from strata.api.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from strata.api.schemas_anthropic import CountTokensRequest, MessagesRequest
from strata.api.state import VERSION

POST_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
GET_PATHS = ("/health", "/v1/models", "/v1/status", "/props", "/metrics", "/openapi.json")

_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


def build_spec() -> dict[str, Any]:
    """The OpenAPI 3.1 document: request bodies from the models, errors in each protocol's shape."""
    keys = [(m, "validation") for m in POST_BODIES.values()]
    refs, defs = models_json_schema(keys, ref_template="#/components/schemas/{model}")
    paths: dict[str, Any] = {}
    for path, model in POST_BODIES.items():
        paths[path] = {
            "post": _operation(
                path,
                {
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": refs[(model, "validation")]}},
                    }
                },
            )
        }
    for path in GET_PATHS:
        paths[path] = {"get": _operation(path, {})}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Strata", "version": VERSION},
        "paths": paths,
        "components": {
            "schemas": {
                **defs.get("$defs", {}),
                "OpenAIError": _OPENAI_ERROR,
                "AnthropicError": _ANTHROPIC_ERROR,
            },
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


def _operation(path: str, extra: dict[str, Any]) -> dict[str, Any]:
    error = "AnthropicError" if path.startswith("/v1/messages") else "OpenAIError"
    shape = {
        "description": "error",
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}},
    }
    op: dict[str, Any] = {
        "operationId": path.strip("/").replace("/", "_").replace(".", "_") or "root",
        "responses": {"200": {"description": "ok"}, "4XX": shape, "5XX": shape},
        **extra,
    }
    if path not in OPEN_PATHS:
        op["security"] = [{"bearer": []}, {"apiKey": []}]
    return op


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)

"""Client errors as typed exceptions, rendered in the shape of the protocol that was called.

OpenAI:    {"error": {"message", "type", "param", "code"}}
Anthropic: {"type": "error", "error": {"type", "message"}}
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from strata.errors import StrataError

# status -> (OpenAI error type, Anthropic error type)
_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    404: ("not_found_error", "not_found_error"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_request_error"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    503: ("server_error", "api_error"),
    529: ("server_error", "overloaded_error"),
}


class APIError(StrataError):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


class ClientGone(APIError):
    """The client disconnected before its answer was ready; the response goes nowhere, and is not
    an application error worth a traceback."""

    def __init__(self) -> None:
        super().__init__(499, "client closed the request", code="client_closed_request")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def is_anthropic(request: Request) -> bool:
    return request.url.path.startswith("/v1/messages")


def error_response(request: Request, err: APIError) -> JSONResponse:
    client = ("invalid_request_error", "invalid_request_error")  # any other 4xx (405: a wrong method)
    oa_type, an_type = _TYPES.get(err.status, client if err.status < 500 else ("server_error", "api_error"))
    status = err.status
    if is_anthropic(request):
        if status == 429:  # Anthropic signals a full server as 529 overloaded_error
            status, an_type = 529, "overloaded_error"
        body: dict = {"type": "error", "error": {"type": an_type, "message": err.message}}
    else:
        body = {"error": {"message": err.message, "type": oa_type, "param": err.param, "code": err.code}}
    return JSONResponse(body, status_code=status, headers=err.headers)

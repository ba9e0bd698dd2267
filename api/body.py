"""Reading a request body as JSON within limits: size (--max-body-mib, a 413), nesting depth, no
NaN / Infinity literals, no lone surrogates. Every failure is a typed 4xx naming what was wrong,
so nothing strange reaches the handlers, the templates or the tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from starlette.requests import ClientDisconnect, Request

from strata.api.errors import APIError, ClientGone, bad_request

MAX_DEPTH = 100  # arrays and objects; a tool schema 40 levels deep still fits
OFF_LOOP_BYTES = 256 << 10  # bodies above this are decoded in a worker thread
_SURROGATE = re.compile("[\ud800-\udfff]")


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 / 413 APIError."""
    raw = await _read_limited(request, int(request.app.state.strata.config.max_body_mib * (1 << 20)))
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(decode, raw)
    return decode(raw)


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():  # chunked bodies declare no length: count as they come
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"request body is larger than {limit / (1 << 20):g} MiB (--max-body-mib)",
        code="request_too_large",
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode(raw: bytes) -> dict[str, Any]:
    """Parse and check a body: a JSON object, at most MAX_DEPTH deep, every string valid Unicode."""
    try:
        data = json.loads(raw, parse_constant=_no_constant) if raw else None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise bad_request(
            f"request body is nested more than {MAX_DEPTH} levels deep", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    check_tree(data)
    return data


def check_tree(data: Any, max_depth: int = MAX_DEPTH) -> None:
    """Depth and lone surrogates, walked without recursion (the tree may be what is too deep)."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(data, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise _bad_string(path)
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth > max_depth:
            raise bad_request(
                f"request body is nested more than {max_depth} levels deep",
                param=_dotted(path) or None,
                code="invalid_json",
            )
        if isinstance(node, dict):
            for k, v in node.items():
                if _SURROGATE.search(k):
                    raise _bad_string(path, key=True)  # never echo the key: it cannot be encoded
                stack.append((v, depth + 1, (*path, k)))
        else:
            stack.extend((v, depth + 1, (*path, i)) for i, v in enumerate(node))


def _bad_string(path: tuple[str | int, ...], key: bool = False) -> APIError:
    where = _dotted(path)
    what = f"a key in {where or 'the body'}" if key else where
    return bad_request(
        f"{what}: text contains a lone UTF-16 surrogate, which is not valid Unicode",
        param=where or None,
        code="invalid_unicode",
    )


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path)

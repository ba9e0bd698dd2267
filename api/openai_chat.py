"""POST /v1/chat/completions (OpenAI), streaming and not, with tools and reasoning."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.api.body import read_json
from strata.api.errors import APIError, bad_request
from strata.api.generation import Finished, collect, deltas, submit
from strata.api.output_parser import ContentDelta, ReasoningDelta, ToolCallDelta
from strata.api.prompt import IMAGE_PARTS, Chat, ToolMode, prepare, vision_error
from strata.api.sampling_args import openai_params
from strata.api.schemas import (
    REFUSED_CHAT,
    ChatCompletionRequest,
    ChatMessage,
    NamedToolChoice,
    ResponseFormat,
    parse,
    unsupported,
)
from strata.api.sse import event_json
from strata.api.state import VERSION, AppState
from strata.constraints.schema import JSON_OBJECT
from strata.runtime.finish import OPENAI_FINISH

# reasoning_effort -> tokens of thinking before </think> is forced (high: the model decides).
EFFORT_BUDGET = {"low": 1024, "medium": 4096}


def _text(m: ChatMessage, i: int) -> str:
    if m.content is None or isinstance(m.content, str):
        return m.content or ""
    out = []
    for j, p in enumerate(m.content):
        where = f"messages.{i}.content.{j}"
        if p.type in IMAGE_PARTS:
            raise vision_error(where)
        if p.type not in ("text", "input_text"):
            raise bad_request(
                f"{where}: content parts of type {p.type!r} are not supported (only text)",
                param=f"{where}.type",
                code="unsupported_content",
            )
        if p.text is None:
            raise bad_request(f"{where}.text: a text part needs its text", param=f"{where}.text")
        out.append(p.text)
    return "".join(out)


def _tool_calls(m: ChatMessage) -> list[dict[str, Any]] | None:
    if not m.tool_calls:
        return None
    out = []
    for c in m.tool_calls:
        args: Any = c.function.arguments
        if isinstance(args, str):
            # keep the client's text when it is not JSON; the template shows it as given
            with contextlib.suppress(json.JSONDecodeError, RecursionError):
                args = json.loads(args or "{}")
        out.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
    return out


def to_chat(body: ChatCompletionRequest) -> Chat:
    messages = []
    for i, m in enumerate(body.messages):
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _text(m, i)}
        if calls := _tool_calls(m):
            msg["tool_calls"] = calls
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.name:
            msg["name"] = m.name
        if m.reasoning_content:
            msg["reasoning_content"] = m.reasoning_content
        messages.append(msg)
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    mode, forced = _tool_choice(body.tool_choice, tools)
    thinking = None if body.reasoning_effort is None else body.reasoning_effort not in ("none", "minimal")
    return Chat(messages, tools, mode, forced, thinking)


def _tool_choice(
    choice: str | NamedToolChoice | None, tools: list[dict[str, Any]]
) -> tuple[ToolMode, str | None]:
    if choice is None or choice == "auto":
        return (ToolMode.AUTO if tools else ToolMode.NONE), None
    if choice == "none":
        return ToolMode.NONE, None
    if choice == "required":
        if not tools:
            raise bad_request("tool_choice 'required' needs tools", param="tool_choice")
        return ToolMode.REQUIRED, None
    assert isinstance(choice, NamedToolChoice)  # the schema admits nothing else
    name = choice.function.name
    if name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
    return ToolMode.NAMED, name


def _output_schema(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    """The schema response_format holds the output to: its json_schema's, any object for json_object."""
    if fmt is None or fmt.type == "text":
        return None
    given = fmt.json_schema.schema_ if (fmt.type == "json_schema" and fmt.json_schema) else None
    return given if given is not None else JSON_OBJECT


def _usage(f: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    }


def _call_json(d: ToolCallDelta) -> dict[str, Any]:
    return {"id": d.id, "type": "function", "function": {"name": d.name, "arguments": d.arguments_json}}


async def chat_completions(request: Request) -> Response:
    state: AppState = request.app.state.strata
    body = parse(ChatCompletionRequest, await read_json(request))
    if body.n != 1:
        raise bad_request("only n=1 is supported", param="n")
    unsupported(body, REFUSED_CHAT)
    name = state.model_name(body.model)
    chat = to_chat(body)
    prompt = await prepare(state.engine, chat)
    params = openai_params(body)
    max_tokens = body.max_completion_tokens or body.max_tokens or state.engine.n_ctx
    stops = tuple([body.stop] if isinstance(body.stop, str) else (body.stop or []))
    reasoning = chat.thinking is not False
    req = await submit(
        state,
        prompt,
        params,
        max_tokens,
        stops,
        ignore_eos=body.ignore_eos,
        think_budget=EFFORT_BUDGET.get(body.reasoning_effort or ""),
        json_schema=_output_schema(body.response_format),
    )
    cid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventSourceResponse(
            _stream(req, prompt, reasoning, cid, created, name, include_usage), ping=15
        )
    parts, fin = await collect(request, req, prompt, reasoning)
    content = "".join(d.text for d in parts if isinstance(d, ContentDelta))
    reasoning_text = "".join(d.text for d in parts if isinstance(d, ReasoningDelta))
    calls = [_call_json(d) for d in parts if isinstance(d, ToolCallDelta)]
    message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
    if reasoning_text:
        message["reasoning_content"] = reasoning_text
    if calls:
        message["tool_calls"] = calls
    return JSONResponse(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": name,
            "system_fingerprint": f"strata-{VERSION}",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": OPENAI_FINISH[fin.reason]}
            ],
            "usage": _usage(fin),
            "timings": fin.timings,
        }
    )


async def _stream(
    req: Any, prompt: Any, reasoning: bool, cid: str, created: int, name: str, include_usage: bool
) -> AsyncIterator[dict[str, str]]:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, str]:
        obj = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": name,
            "system_fingerprint": f"strata-{VERSION}",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            **extra,
        }
        return {"data": event_json(obj)}

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for d in deltas(req, prompt, reasoning):
            if isinstance(d, ContentDelta):
                yield chunk({"content": d.text})
            elif isinstance(d, ReasoningDelta):
                yield chunk({"reasoning_content": d.text})
            elif isinstance(d, ToolCallDelta):
                yield chunk({"tool_calls": [{"index": d.index, **_call_json(d)}]})
            else:
                yield chunk({}, OPENAI_FINISH[d.reason], timings=d.timings)
                if include_usage:
                    usage = {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": name,
                        "choices": [],
                        "usage": _usage(d),
                    }
                    yield {"data": event_json(usage)}
    except APIError as e:
        yield {"data": event_json({"error": {"message": e.message, "type": "server_error", "code": e.code}})}
    yield {"data": "[DONE]"}

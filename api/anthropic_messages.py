"""POST /v1/messages and /v1/messages/count_tokens (Anthropic), streaming and not.

The stream emits exactly the events the anthropic SDK expects: message_start, ping,
content_block_start / _delta / _stop (text_delta, thinking_delta + signature_delta,
input_json_delta), message_delta and message_stop.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.api.body import read_json
from strata.api.errors import APIError, bad_request
from strata.api.generation import Delta, Finished, collect, deltas, submit
from strata.api.output_parser import ContentDelta, ReasoningDelta, ToolCallDelta
from strata.api.prompt import IMAGE_PARTS, Chat, ToolMode, prepare, vision_error
from strata.api.sampling_args import anthropic_params
from strata.api.schemas import parse
from strata.api.schemas_anthropic import (
    AnthropicMessage,
    Block,
    CountTokensRequest,
    MessagesRequest,
    SystemBlock,
    ToolChoice,
)
from strata.api.sse import event_json
from strata.api.state import AppState
from strata.runtime.finish import ANTHROPIC_STOP, FinishReason

# Thinking blocks carry a signature in Anthropic's API; ours is a fixed marker, since we do not
# sign, so clients that echo thinking blocks back round-trip without error.
SIGNATURE = "strata"


def _system_text(system: str | list[SystemBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system
    return "\n".join(b.text for b in system)


def _need(value: Any, where: str, field: str) -> Any:
    if value is None:
        raise bad_request(f"{where}.{field}: this block needs {field}", param=f"{where}.{field}")
    return value


def _tool_result_text(block: Block, where: str) -> str:
    c = block.content
    if c is None or isinstance(c, str):
        return c or ""
    out = []
    for j, p in enumerate(c):
        if p.type in IMAGE_PARTS:
            raise vision_error(f"{where}.content.{j}")
        if p.type != "text":
            raise bad_request(
                f"{where}.content.{j}: tool_result parts of type {p.type!r} are not supported",
                param=f"{where}.content.{j}.type",
                code="unsupported_content",
            )
        out.append(_need(p.text, f"{where}.content.{j}", "text"))
    return "".join(out)


def _blocks(m: AnthropicMessage) -> list[Block]:
    return [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content


def to_chat(body: MessagesRequest | CountTokensRequest) -> Chat:
    messages: list[dict[str, Any]] = []
    if (sys_text := _system_text(body.system)) is not None:
        messages.append({"role": "system", "content": sys_text})
    for i, m in enumerate(body.messages):
        text, thinking, calls = [], [], []
        for j, b in enumerate(_blocks(m)):
            where = f"messages.{i}.content.{j}"
            if b.type == "text":
                text.append(_need(b.text, where, "text"))
            elif b.type == "thinking":
                thinking.append(_need(b.thinking, where, "thinking"))
            elif b.type == "tool_use":
                calls.append(
                    {
                        "id": b.id,
                        "type": "function",
                        "function": {"name": _need(b.name, where, "name"), "arguments": b.input or {}},
                    }
                )
            elif b.type == "tool_result":
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": _need(b.tool_use_id, where, "tool_use_id"),
                        "content": _tool_result_text(b, where),
                    }
                )
            elif b.type in IMAGE_PARTS or b.type == "document":
                raise vision_error(where)
            elif b.type != "redacted_thinking":
                raise bad_request(
                    f"{where}: unsupported content block type {b.type!r}",
                    param=f"{where}.type",
                    code="unsupported_content",
                )
        if text or calls or thinking or m.role == "assistant":
            msg: dict[str, Any] = {"role": m.role, "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = "".join(thinking)
            messages.append(msg)
    tools = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
        }
        for t in body.tools or []
    ]
    mode, forced = _tool_choice(body.tool_choice or ToolChoice(type="auto"), tools)
    thinking_on = body.thinking is not None and body.thinking.type != "disabled"
    return Chat(messages, tools, mode, forced, thinking_on)


def _tool_choice(choice: ToolChoice, tools: list[dict[str, Any]]) -> tuple[ToolMode, str | None]:
    if not tools or choice.type == "none":
        return ToolMode.NONE, None
    if choice.type == "auto":
        return ToolMode.AUTO, None
    if choice.type == "any":
        return ToolMode.REQUIRED, None
    name = choice.name  # type "tool"
    if name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"tool_choice names {name!r}, which is not in tools", param="tool_choice.name")
    return ToolMode.NAMED, name


def _usage(f: Finished) -> dict[str, int]:
    return {
        "input_tokens": f.prompt_tokens - f.cached_tokens,
        "output_tokens": f.completion_tokens,
        "cache_read_input_tokens": f.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _tool_block(d: ToolCallDelta) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": d.id.replace("call_", "toolu_", 1),
        "name": d.name,
        "input": json.loads(d.arguments_json),
    }


def _content(parts: list[Delta]) -> list[dict[str, Any]]:
    """Merge consecutive deltas of a kind into Anthropic content blocks, in order."""
    blocks: list[dict[str, Any]] = []
    for d in parts:
        if isinstance(d, ToolCallDelta):
            blocks.append(_tool_block(d))
        elif isinstance(d, ReasoningDelta):
            if blocks and blocks[-1]["type"] == "thinking":
                blocks[-1]["thinking"] += d.text
            else:
                blocks.append({"type": "thinking", "thinking": d.text, "signature": SIGNATURE})
        elif blocks and blocks[-1]["type"] == "text":
            blocks[-1]["text"] += d.text
        else:
            blocks.append({"type": "text", "text": d.text})
    return blocks


async def messages(request: Request) -> Response:
    state: AppState = request.app.state.strata
    body = parse(MessagesRequest, await read_json(request))
    name = state.model_name(body.model)
    chat = to_chat(body)
    prompt = await prepare(state.engine, chat)
    budget = body.thinking.budget_tokens if (body.thinking and body.thinking.type == "enabled") else None
    fmt = body.output_config.format if body.output_config else None
    schema = fmt.schema_ if fmt is not None else None
    req = await submit(
        state,
        prompt,
        anthropic_params(body),
        body.max_tokens,
        tuple(body.stop_sequences or ()),
        think_budget=budget,
        json_schema=schema,
        schema_param="output_config.format.schema",
    )
    mid = f"msg_{secrets.token_hex(12)}"
    reasoning = bool(chat.thinking)
    if body.stream:
        return EventSourceResponse(_stream(req, prompt, reasoning, mid, name), ping=10)
    parts, fin = await collect(request, req, prompt, reasoning)
    return JSONResponse(
        {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": name,
            "content": _content(parts),
            "stop_reason": ANTHROPIC_STOP[fin.reason],
            "stop_sequence": fin.stop_string if fin.reason is FinishReason.STOP_STRING else None,
            "usage": _usage(fin),
        }
    )


def _event(kind: str, **data: Any) -> dict[str, str]:
    return {"event": kind, "data": event_json({"type": kind, **data})}


async def _stream(
    req: Any, prompt: Any, reasoning: bool, mid: str, name: str
) -> AsyncIterator[dict[str, str]]:
    yield _event(
        "message_start",
        message={
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": name,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(req.prompt_ids), "output_tokens": 0},
        },
    )
    yield _event("ping")
    index, open_kind = -1, None

    def close() -> list[dict[str, str]]:
        out = []
        if open_kind == "thinking":
            out.append(
                _event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "signature_delta", "signature": SIGNATURE},
                )
            )
        if open_kind is not None:
            out.append(_event("content_block_stop", index=index))
        return out

    try:
        async for d in deltas(req, prompt, reasoning):
            if isinstance(d, Finished):
                for ev in close():
                    yield ev
                open_kind = None
                yield _event(
                    "message_delta",
                    delta={
                        "stop_reason": ANTHROPIC_STOP[d.reason],
                        "stop_sequence": d.stop_string if d.reason is FinishReason.STOP_STRING else None,
                    },
                    usage=_usage(d),
                )
                yield _event("message_stop")
                return
            kind = (
                "tool_use"
                if isinstance(d, ToolCallDelta)
                else ("thinking" if isinstance(d, ReasoningDelta) else "text")
            )
            if kind != open_kind or kind == "tool_use":
                for ev in close():
                    yield ev
                index, open_kind = index + 1, kind
                if kind == "tool_use":
                    block = _tool_block(d)  # type: ignore[arg-type]
                    yield _event("content_block_start", index=index, content_block={**block, "input": {}})
                    yield _event(
                        "content_block_delta",
                        index=index,
                        delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                    )
                    continue
                start = (
                    {"type": "thinking", "thinking": "", "signature": ""}
                    if kind == "thinking"
                    else {"type": "text", "text": ""}
                )
                yield _event("content_block_start", index=index, content_block=start)
            if isinstance(d, ReasoningDelta):
                yield _event(
                    "content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": d.text}
                )
            elif isinstance(d, ContentDelta):
                yield _event("content_block_delta", index=index, delta={"type": "text_delta", "text": d.text})
    except APIError as e:
        yield _event("error", error={"type": "api_error", "message": e.message})


async def count_tokens(request: Request) -> Response:
    state: AppState = request.app.state.strata
    body = parse(CountTokensRequest, await read_json(request))
    prompt = await prepare(
        state.engine, to_chat(body), count_only=True
    )  # over-context prompts are counted too
    return JSONResponse({"input_tokens": len(prompt.ids)})

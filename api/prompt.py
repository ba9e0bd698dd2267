"""From a protocol-neutral chat to prompt token ids.

Both adapters (OpenAI, Anthropic) turn their bodies into a `Chat`; this module renders the
model's template, falls back to Hermes-style tool prompting when the template cannot show tools,
and pre-writes the start of a tool call when the client forces one (tool_choice required/named),
which makes the tool path deterministic even on tiny models.
"""

from __future__ import annotations

import asyncio
import enum
import json
from dataclasses import dataclass, field
from typing import Any

from strata.api.errors import APIError, bad_request
from strata.api.prompt_tokens import Marks, min_tokens
from strata.constraints.schema import tool_call_schema
from strata.engine import Engine
from strata.errors import TemplateError

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


class ToolMode(enum.Enum):
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(slots=True)
class Chat:
    messages: list[dict[str, Any]]  # role, content (str), tool_calls, tool_call_id, name
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI {"type":"function","function":{...}}
    tool_mode: ToolMode = ToolMode.AUTO
    forced_tool: str | None = None
    thinking: bool | None = None  # None = the template's default


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    prefix: str  # text pre-written into the assistant turn; the output parser reads it first
    in_reasoning: bool  # the prompt already opened a <think> block
    # A forced tool call: the part of its {"name": ..., "arguments": ...} object already written
    # into the prompt. Decoding is then JSON-constrained to finish exactly that one object.
    json_seed: str | None = None
    json_schema: dict[str, Any] | None = None  # what that object must satisfy (the tools' parameters)
    # Tokens before the generation prompt (the assistant's header, an empty think block, a forced call's
    # opening): the next turn of the conversation extends these, not the whole prompt. None: not known.
    turn_end: int | None = None


def _hermes_system(tools: list[dict[str, Any]]) -> str:
    sigs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{sigs}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _as_hermes(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rewrite tool traffic into plain turns for templates that know nothing of tools."""
    out: list[dict[str, Any]] = []
    if tools:
        sys_text = _hermes_system(tools)
        if messages and messages[0]["role"] == "system":
            sys_text = f"{messages[0]['content']}\n\n{sys_text}"
            messages = messages[1:]
        out.append({"role": "system", "content": sys_text})
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = [
                f"{TOOL_OPEN}\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                    ensure_ascii=False,
                )
                + f"\n{TOOL_CLOSE}"
                for c in m["tool_calls"]
            ]
            text = "\n".join(([m["content"]] if m.get("content") else []) + calls)
            out.append({"role": "assistant", "content": text})
        else:
            out.append(dict(m))
    return [{k: v for k, v in m.items() if k != "_tool"} for m in out]


async def prepare(engine: Engine, chat: Chat, count_only: bool = False) -> Prompt:
    """build_prompt in a worker thread: rendering and tokenizing megabytes must not stall the loop
    (the tokenizer releases the GIL while it works)."""
    return await asyncio.to_thread(build_prompt, engine, chat, count_only)


def build_prompt(engine: Engine, chat: Chat, count_only: bool = False) -> Prompt:
    """The prompt's token ids; count_only skips the context checks (count_tokens counts any length)."""
    template = engine.template
    tools = [] if chat.tool_mode is ToolMode.NONE else chat.tools
    native_tools = "tools" in template.source
    messages = chat.messages if native_tools else _as_hermes(chat.messages, tools)
    marks = Marks(engine.tokenizer)
    shown_messages, shown_tools = marks.swap(messages), marks.swap(tools)
    kw: dict[str, Any] = {}
    thinking = chat.thinking
    if chat.tool_mode in (ToolMode.REQUIRED, ToolMode.NAMED):
        thinking = False  # a forced call starts the turn; there is no room for thoughts first
    if thinking is not None:
        kw["enable_thinking"] = thinking
    shown = {"tools": shown_tools if (native_tools and tools) else None, **kw}
    try:
        text = template.render(shown_messages, add_generation_prompt=True, **shown)
        # the conversation alone: what the next turn's prompt starts with (a count needs no checkpoint)
        history = None
        if not count_only:
            history = template.render(shown_messages, add_generation_prompt=False, **shown)
    except TemplateError as e:
        raise bad_request(f"chat template: {e}", param="messages") from None
    # the generation prompt: template text (no client words), so it tokenizes alone as it ends the prompt
    gen_text = text[len(history) :] if history is not None and text.startswith(history) else ""
    seed, schema = None, None
    if chat.tool_mode is ToolMode.REQUIRED:
        seed = '{"name": "'
        schema = tool_call_schema({t["function"]["name"]: _params(t) for t in tools})
    elif chat.tool_mode is ToolMode.NAMED:
        seed = f'{{"name": {json.dumps(chat.forced_tool)}, "arguments": '
        schema = tool_call_schema(
            {t["function"]["name"]: _params(t) for t in tools if t["function"]["name"] == chat.forced_tool}
        )
    prefix = "" if seed is None else f"{TOOL_OPEN}\n{seed}"
    text, literal = marks.restore(text + prefix)
    if not count_only and (at_least := min_tokens(engine.tokenizer, text)) >= engine.n_ctx:
        check_context(engine, at_least, exact=False)  # too long to be worth tokenizing
    ids = engine.tokenizer.encode_chat(text, literal)
    if not count_only:
        check_context(engine, len(ids))
    in_reasoning = text.rstrip().endswith("<think>") and thinking is not False
    turn_end = None
    if history is not None and (gen_text or prefix):
        tail = engine.tokenizer.encode(gen_text + prefix, add_special=False, parse_special=True)
        if 0 < len(tail) < len(ids) and ids[-len(tail) :] == tail:
            turn_end = len(ids) - len(tail)
    return Prompt(ids, prefix, in_reasoning, seed, schema, turn_end)


def _params(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def check_context(engine: Engine, n_prompt: int, exact: bool = True, param: str = "messages") -> None:
    if n_prompt >= engine.n_ctx:
        count = f"{n_prompt}" if exact else f"at least {n_prompt}"
        raise APIError(
            400,
            f"the prompt has {count} tokens but the context size is {engine.n_ctx}; "
            f"shorten the prompt or raise --ctx-size",
            param=param,
            code="context_length_exceeded",
        )


IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


def vision_error(param: str) -> APIError:
    return bad_request(
        "this model has no vision support: image inputs are not accepted",
        param=param,
        code="vision_not_supported",
    )

"""Split raw Qwen3/Hermes model output into content, reasoning and tool-call deltas as it streams.

Text arrives in arbitrary pieces (a tag may be split as "<too" + "l_call>"), so the parser keeps
a small buffer: in content it holds back only a suffix that could still grow into a tag, in
reasoning also the trailing whitespace (reasoning is stripped at both ends, as llama.cpp's
reasoning parser does), and inside a <tool_call> block everything until the block closes.

Grammar, per mode:
  content:   <think> -> reasoning;  </think> (stray) -> dropped;  <tool_call> -> tool
  reasoning: </think> -> content
  tool:      </tool_call> -> content, emitting one ToolCallDelta (or the raw text on bad JSON)
Whitespace right after <think>, </think> and a parsed </tool_call> is dropped, so content does
not start with the "\n\n" Qwen3 writes after </think>.

Whatever the chunking, the concatenated deltas are the same as for the whole text at once.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
_CONTENT_TAGS = (THINK_OPEN, THINK_CLOSE, TOOL_OPEN)
_REASONING_TAGS = (THINK_CLOSE,)
_WS = " \t\r\n"
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int  # position among this turn's parsed tool calls, from 0
    id: str
    name: str
    arguments_json: str  # a JSON object, compact, non-ASCII kept as is


Delta = ContentDelta | ReasoningDelta | ToolCallDelta


def new_call_id() -> str:
    """An OpenAI-style tool call id: "call_" and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


class _Mode(Enum):
    CONTENT = "content"
    REASONING = "reasoning"
    TOOL = "tool"


def _partial_tag_len(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of one of the tags."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:n]):
                best = n
                break
    return best


def _first_tag(buf: str, tags: tuple[str, ...]) -> tuple[int, str | None]:
    """Position and text of the earliest tag in buf (no two tags can start at the same place)."""
    found: tuple[int, str | None] = (len(buf), None)
    for tag in tags:
        i = buf.find(tag, 0, found[0] + len(tag))
        if 0 <= i < found[0]:
            found = (i, tag)
    return found


class ToolCallError(ValueError):
    """A <tool_call> block whose body is not a usable call; the message says why."""


def parse_tool_call(body: str) -> tuple[str, str]:
    """(name, compact arguments JSON) of a Hermes tool call body; raises ToolCallError."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"invalid JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ToolCallError('not an object with a string "name"')
    # Some Hermes fine-tunes write "parameters"; some models send the arguments as a JSON string.
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolCallError(f"arguments string is not JSON ({e})") from None
    if not isinstance(args, dict):
        raise ToolCallError('"arguments" is not an object')
    return obj["name"], json.dumps(args, ensure_ascii=False, separators=(",", ":"))


class OutputParser:
    """Streaming splitter of one generation's text into typed deltas.

    reasoning: False drops <think> blocks (and their text) instead of emitting ReasoningDelta.
    start_in_reasoning: the prompt already ends in "<think>\\n", so the output begins as reasoning.
    prefix: text the server pre-wrote into the prompt (e.g. "<tool_call>\\n"); it is parsed first
        so the output continues inside it, but nothing it would produce is emitted.
    """

    def __init__(
        self,
        *,
        reasoning: bool = True,
        start_in_reasoning: bool = False,
        prefix: str = "",
        make_id: Callable[[], str] = new_call_id,
    ) -> None:
        self.reasoning_enabled = reasoning
        self.errors: list[str] = []  # one line per tool_call block that could not be parsed
        self._make_id = make_id
        self._mode = _Mode.REASONING if start_in_reasoning else _Mode.CONTENT
        self._strip = start_in_reasoning  # drop whitespace until the next non-whitespace character
        self._buf = ""
        self._consumed = 0  # input characters already taken out of _buf (prefix included)
        self._block_start = 0  # input position of the open <tool_call> tag
        self._scan = 0  # in tool mode, where to resume looking for </tool_call> in _buf
        self._prefix_len = len(prefix)
        self._muted = False
        self._finished = False
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCallDelta] = []
        if prefix:
            self._muted = True
            self._buf = prefix
            self._drain([], final=False)
            self._muted = False

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def tool_calls(self) -> list[ToolCallDelta]:
        """Every tool call completed so far, in order."""
        return list(self._calls)

    def push(self, text: str) -> list[Delta]:
        """Feed the next piece of output; return the deltas it makes certain."""
        if self._finished:
            raise RuntimeError("OutputParser.push after finish")
        self._buf += text
        out: list[Delta] = []
        self._drain(out, final=False)
        return out

    def finish(self) -> list[Delta]:
        """End of generation: flush held text, and try to parse a tool call left unclosed."""
        if self._finished:
            return []
        self._finished = True
        out: list[Delta] = []
        self._drain(out, final=True)
        return out

    def _drain(self, out: list[Delta], final: bool) -> None:
        while True:
            if self._mode is _Mode.CONTENT:
                i, tag = _first_tag(self._buf, _CONTENT_TAGS)
                if tag is None:
                    keep = 0 if final else _partial_tag_len(self._buf, _CONTENT_TAGS)
                    self._text(out, self._take(len(self._buf) - keep))
                    return
                self._text(out, self._take(i))
                self._block_start = self._consumed
                self._take(len(tag))
                self._enter(tag)
            elif self._mode is _Mode.REASONING:
                i = self._buf.find(THINK_CLOSE)
                if i < 0:
                    self._text(out, self._take(len(self._buf) - self._reasoning_hold(final)))
                    return
                self._text(out, self._take(i).rstrip(_WS))
                self._take(len(THINK_CLOSE))
                self._mode, self._strip = _Mode.CONTENT, True
            else:
                i = self._buf.find(TOOL_CLOSE, self._scan)
                if i < 0:
                    if final:
                        self._close_tool(out, self._take(len(self._buf)), closed=False)
                        continue
                    self._scan = max(0, len(self._buf) - len(TOOL_CLOSE) + 1)
                    return
                body = self._take(i)
                self._take(len(TOOL_CLOSE))
                self._close_tool(out, body, closed=True)

    def _reasoning_hold(self, final: bool) -> int:
        """How much of the reasoning buffer to keep: a partial </think> and the whitespace before it."""
        if final:
            # Trailing whitespace of unfinished reasoning is stripped, never emitted.
            return len(self._buf) - len(self._buf.rstrip(_WS))
        keep = _partial_tag_len(self._buf, _REASONING_TAGS)
        body = self._buf[: len(self._buf) - keep]
        return keep + len(body) - len(body.rstrip(_WS))

    def _enter(self, tag: str) -> None:
        if tag == THINK_OPEN:
            self._mode, self._strip = _Mode.REASONING, True
        elif tag == THINK_CLOSE:
            self._strip = True  # a stray close tag: drop it and the blank lines after it
        else:
            self._mode, self._scan = _Mode.TOOL, 0

    def _take(self, n: int) -> str:
        text, self._buf = self._buf[:n], self._buf[n:]
        self._consumed += n
        return text

    def _text(self, out: list[Delta], text: str) -> None:
        """Emit text in the current mode (content or reasoning), honouring the strip flag."""
        if self._strip:
            text = text.lstrip(_WS)
            self._strip = not text
        if not text or self._muted:
            return
        if self._mode is _Mode.CONTENT:
            self._content.append(text)
            out.append(ContentDelta(text))
        elif self.reasoning_enabled:
            self._reasoning.append(text)
            out.append(ReasoningDelta(text))

    def _close_tool(self, out: list[Delta], body: str, closed: bool) -> None:
        self._mode = _Mode.CONTENT
        try:
            name, args = parse_tool_call(body)
        except ToolCallError as e:
            self.errors.append(f"tool call {len(self._calls) + len(self.errors)}: {e}")
            # Give the text back as content, minus whatever part of it the server wrote itself.
            raw = TOOL_OPEN + body + (TOOL_CLOSE if closed else "")
            self._strip = False
            self._text(out, raw[max(0, self._prefix_len - self._block_start) :])
            return
        self._strip = True
        if self._muted:
            return
        call = ToolCallDelta(len(self._calls), self._make_id(), name, args)
        self._calls.append(call)
        out.append(call)

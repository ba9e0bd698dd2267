"""Incremental JSON-Schema prefix validation: grammar-constrained decoding from a tool's schema.

The twin of json_guard for a known schema. `SchemaPrefix` answers "does the text so far plus this
piece stay a prefix of some instance of the schema?", so a forced tool call can only write the
declared keys, each once, with values of the declared types, and must close once the required
keys are in. The state is immutable: a tuple of alternative stacks (anyOf branches still alive,
usually one), each stack a linked list (top frame, stack below) of small tuples, so accepts()
walks private copies, copy() is O(1) and alternatives share the frames below them.

Whitespace between tokens is limited to MAX_WS characters per gap: a model cannot stall in it.
The supported schema subset is described in json_schema.
"""

from __future__ import annotations

from typing import Any

# The number grammar and the plain-string-run pattern are json_guard's, shared on purpose: both
# guards accept exactly the same JSON tokens.
from strata.json_guard import (
    _HEX,
    _N_INT,
    _N_MINUS,
    _N_TERMINAL,
    _N_ZERO,
    _NUMBER_NEXT,
    _PLAIN_RUN,
    _SIMPLE_ESCAPES,
    _WS,
    allowed_token_mask,  # re-exported: one mask serves both validators
)
from strata.json_schema import (
    Alt,
    ArrayAlt,
    Node,
    NumberAlt,
    ObjectAlt,
    StringAlt,
    compile_schema,
    default_text,
    is_self_delimiting,
    tool_call_schema,
)

__all__ = ["MAX_WS", "SchemaPrefix", "advance", "allowed_token_mask", "closing_suffix", "tool_call_schema"]

MAX_WS = 2  # whitespace characters allowed in one gap between tokens

# Frame kinds; each frame is a tuple whose first item is its kind:
_VAL = 0  # (_VAL, node, ws): a value of `node` comes next
_OBJ = 1  # (_OBJ, alt, phase, used keys, ws, value node after the pending ":")
_KEY = 2  # (_KEY, text so far, esc): a key being written; the object frame is right below
_ARR = 3  # (_ARR, alt, phase, items started, ws)
_STR = 4  # (_STR, max length, esc, length)
_NUM = 5  # (_NUM, integer only, number sub-state as in json_guard)
_LIT = 6  # (_LIT, alt, text so far): one of a closed set of texts
_DONE = 7  # (_DONE, ws): the root value is complete
# esc in _KEY/_STR: 0 plain, -1 after a backslash, k > 0 hex digits still due in \uXXXX.
_O_FIRST, _O_KEY, _O_COLON, _O_AFTER = range(4)  # after "{", after ",", after a key, after a value
_A_FIRST, _A_AFTER = range(2)  # after "[", after an item

Frame = tuple[Any, ...]
Stack = tuple[Frame, Any]  # (top frame, the Stack below or None)
States = tuple[Stack, ...]  # the live alternatives
_NONE: States = ()
_DONE_STACK: Stack = ((_DONE, 0), None)
_NO_KEYS: frozenset[str] = frozenset()
_FIRST_DIGIT = {"-": _N_MINUS, "0": _N_ZERO, **{d: _N_INT for d in "123456789"}}
_INT_NEXT = {k: v for k, v in _NUMBER_NEXT.items() if k[0] in (_N_MINUS, _N_INT) and v in (_N_ZERO, _N_INT)}


def _pop(parent: Stack | None) -> Stack:
    """The stack once the value on top of `parent` is complete (parents wait in their after-phase)."""
    return parent if parent is not None else _DONE_STACK


def _no_key_left(alt: ObjectAlt, used: frozenset[str]) -> bool:
    return alt.additional is None and alt.props.keys() <= used


def _start(alt: Alt, ch: str, parent: Stack | None) -> Stack:
    """The frame for a value of alt whose first character, ch, is being read."""
    if isinstance(alt, StringAlt):
        return (_STR, alt.max_length, 0, 0), parent
    if isinstance(alt, ObjectAlt):
        return (_OBJ, alt, _O_FIRST, _NO_KEYS, 0, None), parent
    if isinstance(alt, ArrayAlt):
        return (_ARR, alt, _A_FIRST, 0, 0), parent
    if isinstance(alt, NumberAlt):
        return (_NUM, alt.integer, _FIRST_DIGIT[ch]), parent
    return (_LIT, alt, ch), parent


def _val(stack: Stack, ch: str) -> States:
    (_, node, ws), parent = stack
    if ch in _WS:
        return (((_VAL, node, ws + 1), parent),) if ws < MAX_WS else _NONE
    alts = node.by_char.get(ch)
    if alts is None:
        return _NONE
    return tuple([_start(alt, ch, parent) for alt in alts])  # by_char: ch starts each of them


def _obj(stack: Stack, ch: str) -> States:
    frame, parent = stack
    _, alt, phase, used, ws, pending = frame
    if ch in _WS:
        return (((_OBJ, alt, phase, used, ws + 1, pending), parent),) if ws < MAX_WS else _NONE
    if phase == _O_AFTER:
        if ch == ",":
            return _NONE if _no_key_left(alt, used) else (((_OBJ, alt, _O_KEY, used, 0, None), parent),)
        return (_pop(parent),) if ch == "}" and alt.required <= used else _NONE
    if phase == _O_COLON:
        if ch != ":":
            return _NONE
        return (((_VAL, pending, 0), ((_OBJ, alt, _O_AFTER, used, 0, None), parent)),)
    if ch == '"':
        if _no_key_left(alt, used):
            return _NONE
        return (((_KEY, "", 0), stack if ws == 0 else ((_OBJ, alt, phase, used, 0, None), parent)),)
    if ch == "}" and phase == _O_FIRST and alt.required <= used:
        return (_pop(parent),)
    return _NONE


def _key_prefix_ok(raw: str, obj: Frame) -> bool:
    """Can a key starting with raw still be written? Declared keys already used do not count."""
    alt: ObjectAlt = obj[1]
    if alt.additional is not None:
        return True
    keys = alt.prefixes.get(raw)
    return keys is not None and not keys <= obj[3]


def _key(stack: Stack, ch: str) -> States:
    (_, raw, esc), parent = stack
    if esc == 0:
        if ch == '"':
            return _close_key(raw, parent)
        if ch < " ":
            return _NONE
        esc = -1 if ch == "\\" else 0
    elif esc == -1:
        if ch != "u" and ch not in _SIMPLE_ESCAPES:
            return _NONE
        esc = 4 if ch == "u" else 0
    elif ch in _HEX:
        esc -= 1
    else:
        return _NONE
    raw += ch
    return (((_KEY, raw, esc), parent),) if _key_prefix_ok(raw, parent[0]) else _NONE


def _close_key(raw: str, parent: Stack) -> States:
    (_, alt, _, used, _, _), below = parent
    if raw in used:
        return _NONE
    node = alt.props.get(raw, alt.additional)
    if node is None:
        return _NONE
    return (((_OBJ, alt, _O_COLON, used | {raw}, 0, node), below),)


def _arr(stack: Stack, ch: str) -> States:
    frame, parent = stack
    _, alt, phase, count, ws = frame
    if ch in _WS:
        return (((_ARR, alt, phase, count, ws + 1), parent),) if ws < MAX_WS else _NONE
    if phase == _A_AFTER:
        if ch == ",":
            if count >= alt.max_items:
                return _NONE
            return (((_VAL, alt.items, 0), ((_ARR, alt, _A_AFTER, count + 1, 0), parent)),)
        return (_pop(parent),) if ch == "]" and count >= alt.min_items else _NONE
    if ch == "]":
        return (_pop(parent),) if alt.min_items == 0 else _NONE
    if alt.max_items == 0:
        return _NONE
    return _val(((_VAL, alt.items, 0), ((_ARR, alt, _A_AFTER, 1, 0), parent)), ch)


def _str(stack: Stack, ch: str) -> States:
    (_, max_len, esc, length), parent = stack
    if esc == 0:
        if ch == '"':
            return (_pop(parent),)
        if ch < " " or length >= max_len:
            return _NONE
        return (((_STR, max_len, -1 if ch == "\\" else 0, length + 1), parent),)
    if esc == -1:
        if ch == "u":
            return (((_STR, max_len, 4, length), parent),)
        return (((_STR, max_len, 0, length), parent),) if ch in _SIMPLE_ESCAPES else _NONE
    return (((_STR, max_len, esc - 1, length), parent),) if ch in _HEX else _NONE


def _num(stack: Stack, ch: str) -> States:
    (_, integer, n), parent = stack
    nxt = (_INT_NEXT if integer else _NUMBER_NEXT).get((n, ch))
    if nxt is not None:
        return (((_NUM, integer, nxt), parent),)
    # A number has no closing character: the first one that cannot extend it belongs to the parent.
    return _step(_pop(parent), ch) if n in _N_TERMINAL else _NONE


def _lit(stack: Stack, ch: str) -> States:
    (_, alt, prefix), parent = stack
    text = prefix + ch
    if text in alt.prefixes:
        if text in alt.text_set and is_self_delimiting(text):
            return (_pop(parent),)
        return (((_LIT, alt, text), parent),)
    return _step(_pop(parent), ch) if prefix in alt.text_set else _NONE  # a complete number ended


def _done(stack: Stack, ch: str) -> States:
    ws = stack[0][1]
    return (((_DONE, ws + 1), None),) if ch in _WS and ws < MAX_WS else _NONE


_STEPS = (_val, _obj, _key, _arr, _str, _num, _lit, _done)  # indexed by frame kind


def _step(stack: Stack, ch: str) -> States:
    return _STEPS[stack[0][0]](stack, ch)


def _run(stack: Stack, run: str) -> Stack | None:
    """A run of plain characters (no quote, backslash or control) inside a string or key."""
    frame, parent = stack
    if frame[0] == _STR:
        length = frame[3] + len(run)
        return ((_STR, frame[1], 0, length), parent) if length <= frame[1] else None
    raw = frame[1] + run
    return ((_KEY, raw, 0), parent) if _key_prefix_ok(raw, parent[0]) else None


def advance(states: States, text: str) -> States | None:
    """The alternatives alive after text, or None if text cannot continue an instance prefix."""
    i, end = 0, len(text)
    while i < end:
        if len(states) == 1:
            stack = states[0]
            frame = stack[0]
            if (frame[0] == _STR or frame[0] == _KEY) and frame[2] == 0:
                # Long string tokens are common: take ordinary characters in one regex step.
                m = _PLAIN_RUN.match(text, i)
                assert m is not None
                if m.end() > i:
                    nxt = _run(stack, text[i:m.end()])
                    if nxt is None:
                        return None
                    stack, i = nxt, m.end()
                    if i == end:
                        return (stack,)
            states = _STEPS[stack[0][0]](stack, text[i])
        else:
            out: list[Stack] = []
            for stack in states:
                out.extend(_STEPS[stack[0][0]](stack, text[i]))
            states = tuple(dict.fromkeys(out))  # branches that met again are one
        if not states:
            return None
        i += 1
    return states


class SchemaPrefix:
    """A prefix validator for instances of one JSON Schema; cheap to copy, accepts() never mutates."""

    __slots__ = ("_states",)

    def __init__(self, schema: Any = True) -> None:
        """`schema`: a JSON Schema (dict or bool) or a Node compiled once and shared."""
        root = schema if isinstance(schema, Node) else compile_schema(schema)
        self._states: States = (((_VAL, root, 0), None),)

    @property
    def state(self) -> States:
        return self._states

    @property
    def complete(self) -> bool:
        """True once the root value is closed (a bare root number never closes: it could grow)."""
        return any(s[0][0] == _DONE for s in self._states)

    def accepts(self, text: str) -> bool:
        """Would text keep the prefix valid? The state is not changed."""
        return advance(self._states, text) is not None

    def feed(self, text: str) -> bool:
        """Append text if it keeps the prefix valid; else return False and change nothing."""
        nxt = advance(self._states, text)
        if nxt is None:
            return False
        self._states = nxt
        return True

    def copy(self) -> SchemaPrefix:
        twin = SchemaPrefix.__new__(SchemaPrefix)
        twin._states = self._states
        return twin


def closing_suffix(state: SchemaPrefix) -> str:
    """Text that finishes every open token and container into an instance of the schema.

    Missing required keys and values get the schema's simplest value (default_text); a key cut
    short becomes the first unused declared key it can still be (required ones first). Each
    alternative is tried in turn; the first whose text really completes the prefix wins.
    """
    states = state.state
    for stack in states:
        text = _close(stack)
        done = advance(states, text)
        if done is not None and any(s[0][0] == _DONE for s in done):
            return text
    return _close(states[0])


def _close(stack: Stack | None) -> str:
    parts: list[str] = []
    while stack is not None:
        frame, stack = stack
        kind = frame[0]
        if kind == _KEY:
            obj, stack = stack  # a key closes together with its object
            alt, used = obj[1], obj[3]
            tail, key = _finish_key(frame, alt, used)
            node = alt.props.get(key, alt.additional)
            parts.append(f"{tail}: {default_text(node)}{_close_object(alt, _O_AFTER, used | {key})}")
        elif kind == _OBJ:
            _, alt, phase, used, _, pending = frame
            head = f": {default_text(pending)}" if phase == _O_COLON else ""
            parts.append(head + _close_object(alt, _O_AFTER if phase == _O_COLON else phase, used))
        elif kind == _ARR:
            _, alt, phase, count, _ = frame
            more = [default_text(alt.items)] * max(0, alt.min_items - count)
            parts.append((", ".join(more) if phase == _A_FIRST else "".join(", " + m for m in more)) + "]")
        elif kind == _STR:
            esc = frame[2]
            parts.append(("\\" if esc == -1 else "0" * esc) + '"')
        elif kind == _NUM:
            parts.append("" if frame[2] in _N_TERMINAL else "0")
        elif kind == _LIT:
            alt, prefix = frame[1], frame[2]
            if prefix not in alt.text_set:
                parts.append(next(t for t in alt.texts if t.startswith(prefix))[len(prefix):])
        elif kind == _VAL:
            parts.append(default_text(frame[1]))
    return "".join(parts)


def _finish_key(frame: Frame, alt: ObjectAlt, used: frozenset[str]) -> tuple[str, str]:
    """(the rest of the key with its closing quote, the whole key)."""
    raw, esc = frame[1], frame[2]
    keys = alt.prefixes.get(raw, _NO_KEYS) - used
    if keys:
        key = next(k for k in alt.order if k in keys)
    else:  # an undeclared key, which additionalProperties allows: end any escape, keep it unique
        key = raw + ("\\" if esc == -1 else "0" * max(esc, 0))
        while key in used:
            key += "_"
    return key[len(raw):] + '"', key


def _close_object(alt: ObjectAlt, phase: int, used: frozenset[str]) -> str:
    """From `phase`, the members still due and the closing brace."""
    todo = [k for k in alt.order if k in alt.required and k not in used]
    if phase == _O_KEY and not todo:  # a "," was written: one more member must follow
        spare = [k for k in alt.order if k not in used]
        todo = spare[:1] or [next(k for k in ("_" * n for n in range(1, len(used) + 2)) if k not in used)]
    members = [f'"{k}": {default_text(alt.props.get(k, alt.additional))}' for k in todo]
    sep = ", " if phase == _O_AFTER and members else ""
    return sep + ", ".join(members) + "}"

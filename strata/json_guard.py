"""Incremental JSON-object prefix validation for response_format json_object decoding.

The sampler asks, for each of many candidate token texts, "does the text so far plus this piece
stay a prefix of some valid JSON object?". The whole parser state is therefore one immutable
tuple (mode, open containers, aux, n): testing a candidate walks a local copy and mutates
nothing, copying a JsonPrefix is O(1), and feed() commits only a run that succeeded.

Strict JSON (RFC 8259): no NaN/Infinity, no leading zeros, no control characters in strings,
escapes limited to \\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX. The top-level value must be an object;
whitespace may come before it and only whitespace after it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import Protocol

# Modes: where in the grammar the next character lands.
_TOP = 0  # before the top-level object
_OBJ_FIRST = 1  # after "{": a key or "}"
_OBJ_KEY = 2  # after "," in an object: a key
_COLON = 3  # after a key
_VALUE = 4  # after ":" or after "," in an array
_ARR_FIRST = 5  # after "[": a value or "]"
_AFTER = 6  # after a value inside a container: "," or the closer
_STRING = 7  # aux: "k" for a key, "v" for a value
_ESCAPE = 8  # after a backslash in a string
_UHEX = 9  # inside \uXXXX; n: hex digits still to come
_NUMBER = 10  # n: number sub-state below
_LITERAL = 11  # aux: the rest of true / false / null
_DONE = 12  # the top-level object is closed
_IN_TOKEN = frozenset((_STRING, _ESCAPE, _UHEX, _NUMBER, _LITERAL))  # stepped by _step_scalar

# Number sub-states, named after the last thing read.
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_N_TERMINAL = frozenset((_N_ZERO, _N_INT, _N_FRAC, _N_EXP))  # a number may end here


def _number_table() -> dict[tuple[int, str], int]:
    digits, nonzero, exp = "0123456789", "123456789", "eE"
    edges: list[tuple[int, str, int]] = [
        (_N_MINUS, "0", _N_ZERO), (_N_MINUS, nonzero, _N_INT),
        (_N_ZERO, ".", _N_DOT), (_N_ZERO, exp, _N_E),
        (_N_INT, digits, _N_INT), (_N_INT, ".", _N_DOT), (_N_INT, exp, _N_E),
        (_N_DOT, digits, _N_FRAC),
        (_N_FRAC, digits, _N_FRAC), (_N_FRAC, exp, _N_E),
        (_N_E, "+-", _N_ESIGN), (_N_E, digits, _N_EXP),
        (_N_ESIGN, digits, _N_EXP),
        (_N_EXP, digits, _N_EXP),
    ]
    return {(src, ch): dst for src, chars, dst in edges for ch in chars}


_NUMBER_NEXT = _number_table()
_WS = frozenset(" \t\n\r")
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_CLOSER = {"{": "}", "[": "]"}
_PLAIN_RUN = re.compile(r'[^"\\\x00-\x1f]*')  # string characters needing no state change

State = tuple[int, str, str, int]  # (mode, open containers innermost last e.g. "{[", aux, n)
_START: State = (_TOP, "", "", 0)


def _closed(stack: str) -> State:
    """State after a value ends inside `stack` (or after the top-level object)."""
    return (_AFTER, stack, "", 0) if stack else (_DONE, "", "", 0)


def _value_start(ch: str, stack: str) -> State | None:
    if ch == '"':
        return (_STRING, stack, "v", 0)
    if ch == "{":
        return (_OBJ_FIRST, stack + "{", "", 0)
    if ch == "[":
        return (_ARR_FIRST, stack + "[", "", 0)
    if ch == "-":
        return (_NUMBER, stack, "", _N_MINUS)
    if ch == "0":
        return (_NUMBER, stack, "", _N_ZERO)
    if "1" <= ch <= "9":
        return (_NUMBER, stack, "", _N_INT)
    rest = _LITERALS.get(ch)
    return (_LITERAL, stack, rest, 0) if rest else None


def _step_scalar(st: State, ch: str) -> State | None:
    """One character inside a string, number or literal."""
    mode, stack, aux, n = st
    if mode == _STRING:
        if ch == '"':
            return (_COLON, stack, "", 0) if aux == "k" else _closed(stack)
        if ch == "\\":
            return (_ESCAPE, stack, aux, 0)
        return st if ch >= " " else None
    if mode == _ESCAPE:
        if ch == "u":
            return (_UHEX, stack, aux, 4)
        return (_STRING, stack, aux, 0) if ch in _SIMPLE_ESCAPES else None
    if mode == _UHEX:
        if ch not in _HEX:
            return None
        return (_STRING, stack, aux, 0) if n == 1 else (_UHEX, stack, aux, n - 1)
    if mode == _NUMBER:
        nxt = _NUMBER_NEXT.get((n, ch))
        if nxt is not None:
            return (_NUMBER, stack, "", nxt)
        # A number has no closing character: the first one that cannot extend it ends it.
        return _step_structural(_closed(stack), ch) if n in _N_TERMINAL else None
    # _LITERAL
    if ch != aux[0]:
        return None
    return (_LITERAL, stack, aux[1:], 0) if len(aux) > 1 else _closed(stack)


def _step_structural(st: State, ch: str) -> State | None:
    """One character between tokens: whitespace, punctuation, or the start of a value."""
    mode, stack = st[0], st[1]
    if ch in _WS:
        return st
    if mode == _AFTER:
        if ch == ",":
            return (_OBJ_KEY, stack, "", 0) if stack[-1] == "{" else (_VALUE, stack, "", 0)
        return _closed(stack[:-1]) if ch == _CLOSER[stack[-1]] else None
    if mode == _VALUE:
        return _value_start(ch, stack)
    if mode == _COLON:
        return (_VALUE, stack, "", 0) if ch == ":" else None
    if mode == _OBJ_FIRST or mode == _OBJ_KEY:
        if ch == '"':
            return (_STRING, stack, "k", 0)
        return _closed(stack[:-1]) if ch == "}" and mode == _OBJ_FIRST else None
    if mode == _ARR_FIRST:
        return _closed(stack[:-1]) if ch == "]" else _value_start(ch, stack)
    if mode == _TOP:
        return (_OBJ_FIRST, "{", "", 0) if ch == "{" else None
    return None  # _DONE: only whitespace, handled above


def advance(st: State, text: str) -> State | None:
    """The state after text, or None if text cannot continue a valid JSON object prefix."""
    i, end = 0, len(text)
    cur: State | None = st
    while i < end:
        assert cur is not None
        if cur[0] == _STRING:
            # Skip ordinary string characters in one regex step: long string tokens are common.
            m = _PLAIN_RUN.match(text, i)
            assert m is not None
            i = m.end()
            if i == end:
                break
        ch = text[i]
        cur = _step_scalar(cur, ch) if cur[0] in _IN_TOKEN else _step_structural(cur, ch)
        if cur is None:
            return None
        i += 1
    return cur


class JsonPrefix:
    """A JSON-object prefix validator; cheap to copy, and accepts() never mutates."""

    __slots__ = ("_state",)

    def __init__(self, state: State = _START) -> None:
        self._state = state

    @property
    def state(self) -> State:
        return self._state

    @property
    def complete(self) -> bool:
        """True once the top-level object has been closed."""
        return self._state[0] == _DONE

    def accepts(self, text: str) -> bool:
        """Would text keep the prefix valid? The state is not changed."""
        return advance(self._state, text) is not None

    def feed(self, text: str) -> bool:
        """Append text if it keeps the prefix valid; else return False and change nothing."""
        nxt = advance(self._state, text)
        if nxt is None:
            return False
        self._state = nxt
        return True

    def copy(self) -> JsonPrefix:
        return JsonPrefix(self._state)


class TokenTexts(Protocol):
    """token id -> decoded text: a list[str], or a lazy table that decodes on first use."""

    def __getitem__(self, tid: int, /) -> str: ...


class PrefixValidator(Protocol):
    """What allowed_token_mask needs: JsonPrefix here, SchemaPrefix in json_schema_guard."""

    @property
    def complete(self) -> bool: ...

    def accepts(self, text: str) -> bool: ...


def allowed_token_mask(state: PrefixValidator, candidate_ids: Iterable[int], token_texts: TokenTexts,
                       eos_ids: Collection[int] = ()) -> list[int]:
    """The candidate ids, in the given order, whose text keeps the prefix valid.

    token_texts[id] is the token's decoded text. An end-of-sequence id passes only once the value
    is complete; any other token with empty text is refused, since it would make no progress.
    """
    done, accepts = state.complete, state.accepts
    out: list[int] = []
    for tid in candidate_ids:
        if tid in eos_ids:
            if done:
                out.append(tid)
            continue
        text = token_texts[tid]
        if text and accepts(text):
            out.append(tid)
    return out


def closing_suffix(state: JsonPrefix) -> str:
    """The text that finishes every open token and container, making the prefix a valid object.

    A value that is still missing (after ":" , after "," in an array, or the key after "," in an
    object) becomes null (with an empty key "" where a key is missing), so nothing is invented.
    """
    mode, stack, aux, n = state.state
    if mode == _TOP:
        return "{}"
    head = ""
    if mode in (_STRING, _ESCAPE, _UHEX):
        # A dangling backslash is completed as an escaped backslash, keeping what the model wrote.
        head = ("\\" if mode == _ESCAPE else "0" * n if mode == _UHEX else "") + '"'
        if aux == "k":
            head += ":null"
    elif mode == _NUMBER:
        head = "" if n in _N_TERMINAL else "0"
    elif mode == _LITERAL:
        head = aux
    elif mode == _COLON:
        head = ":null"
    elif mode == _VALUE:
        head = "null"
    elif mode == _OBJ_KEY:
        head = '"":null'
    return head + "".join(_CLOSER[c] for c in reversed(stack))

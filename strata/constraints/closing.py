"""An ending for JSON that max_tokens cut short, so a forced tool call always parses.

The grammar is walked byte by byte (vocab.byte_vocab) from the end of the text: each step writes
the first byte of _PREFERRED the grammar allows (closing quotes and brackets first, then the
shortest values), else the lowest byte it allows, until the grammar may end. llguidance writes an
object's declared keys in order, so a missing required key is spelled out next, never stalled
on. A walk that finds no end within _LIMIT bytes falls back to the grammar of any JSON object,
which always closes: the result then parses, though it may miss what the schema requires.
"""

from __future__ import annotations

from functools import cache

from llguidance import LLMatcher

from strata.constraints.schema import JSON_OBJECT, grammar_text
from strata.constraints.vocab import BYTE_EOS, byte_vocab

_PREFERRED = b'"}]0nultrefas,:'  # closers, then 0, null, true, false, then separators
_LIMIT = 4096  # bytes of ending to try before giving up on the schema's grammar


def closing_suffix(grammar: str, text: str) -> str:
    """Text that makes `text` (a prefix of the grammar's JSON) a complete instance ("" when it is)."""
    for g in (grammar, _any_object()):
        suffix = _walk(g, text.encode())
        if suffix is not None:
            return suffix
    raise ValueError(f"{text[:80]!r}... is not the start of a JSON object")


@cache
def _any_object() -> str:
    return grammar_text(JSON_OBJECT)


def _walk(grammar: str, done: bytes) -> str | None:
    m = LLMatcher(byte_vocab(), grammar, log_level=0)
    if not m.consume_tokens(list(done)):
        return None
    out = bytearray()
    while not m.is_accepting():
        if len(out) >= _LIMIT:
            return None
        mask = m.compute_bitmask()  # one bit per byte token, then the end token's
        allowed = [b for b in range(BYTE_EOS) if mask[b >> 3] >> (b & 7) & 1]
        if not allowed:
            return None
        byte = next((b for b in _PREFERRED if b in allowed), allowed[0])
        m.consume_token(byte)
        out.append(byte)
    return out.decode("utf-8", "replace")

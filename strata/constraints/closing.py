"""An ending for JSON that max_tokens cut short, so a forced tool call always parses.

The grammar is walked byte by byte (vocab.byte_vocab) from the end of the text until it may end.
The first walk writes, at each step, the first byte of _PREFERRED the grammar allows (closing
quotes and brackets first, then the shortest values), else the lowest byte it allows; llguidance
writes an object's declared keys in order, so a missing required key is spelled out next. A
string whose format or pattern wants some other byte to end (an email's "@") can keep that walk
writing "0"s, so a second walk takes the allowed byte it has written least since the last quote,
which reaches every byte the grammar allows there. Whitespace comes last in both. Should both
fail, the grammar of any JSON object always closes: the result then parses, though it may miss
what the schema requires.
"""

from __future__ import annotations

from functools import cache

from llguidance import LLMatcher

from strata.constraints.schema import JSON_OBJECT, grammar_text
from strata.constraints.vocab import BYTE_EOS, byte_vocab

_PREFERRED = b'"}]0nultrefas,:'  # closers, then 0, null, true, false, then separators
_QUOTE = ord('"')
_WHITESPACE = b" \t\n\r"  # tried last: never what an ending needs
_RANK = [_PREFERRED.find(b) if b in _PREFERRED else 256 + b for b in range(256)]  # then the order tried


def closing_suffix(grammar: str, text: str) -> str:
    """Text that makes `text` (a prefix of the grammar's JSON) a complete instance ("" when it is)."""
    # (grammar, least used first, bytes it may write): the preferred walk ends soon or not at all
    walks = ((grammar, False, 256), (grammar, True, 4096), (_any_object(), False, 4096))
    for g, least_used, limit in walks:
        suffix = _walk(g, text.encode(), least_used, limit)
        if suffix is not None:
            return suffix
    raise ValueError(f"{text[:80]!r}... is not the start of a JSON object")


@cache
def _any_object() -> str:
    return grammar_text(JSON_OBJECT)


def _walk(grammar: str, done: bytes, least_used: bool, limit: int) -> str | None:
    m = LLMatcher(byte_vocab(), grammar, log_level=0)
    if not m.consume_tokens(list(done)):
        return None
    out = bytearray()
    uses = [0] * 256
    while not m.is_accepting():
        if len(out) >= limit:
            return None
        mask = m.compute_bitmask()  # one bit per byte token, then the end token's
        allowed = [b for b in range(BYTE_EOS) if mask[b >> 3] >> (b & 7) & 1]
        if not allowed:
            return None
        byte = min(allowed, key=lambda b: (b in _WHITESPACE, uses[b] if least_used else 0, _RANK[b]))
        m.consume_token(byte)
        out.append(byte)
        uses[byte] += 1
        if byte == _QUOTE:  # a string ended (or began): what was stuck has moved on
            uses = [0] * 256
    return out.decode("utf-8", "replace")

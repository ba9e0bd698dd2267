"""A tokenizer's vocabulary as llguidance sees it: each token's bytes, the special ones, the end ones.

Masks are computed over the model's own tokens, so a token is allowed exactly when its bytes (the
ones `Tokenizer.token_bytes` gives the detokenizer) continue the grammar. Special tokens carry
llguidance's marker and never match text; the end-of-turn ids are the grammar's EOS.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from functools import cache

from llguidance import LLTokenizer, TokenizerWrapper

from strata.text.tokenizer import Tokenizer

BYTE_EOS = 256  # the end token of byte_vocab


@dataclass(slots=True)
class _Source:
    """What llguidance's TokenizerWrapper reads from a tokenizer."""

    tokens: list[bytes]
    special_token_ids: list[int]
    eos_token_id: int
    bos_token_id: int | None
    tokenizer: Tokenizer | None  # encodes text for llguidance; None: one token per byte

    def __call__(self, text: bytes) -> list[int]:
        if self.tokenizer is None:
            return list(text)
        return self.tokenizer.encode(text.decode("utf-8", "replace"), add_special=False, parse_special=False)


# Built once per tokenizer (about 1 s at Qwen3's 151k tokens), and dropped with it.
_built: weakref.WeakKeyDictionary[Tokenizer, LLTokenizer] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def model_vocab(tokenizer: Tokenizer) -> LLTokenizer:
    """The llguidance tokenizer for `tokenizer`'s vocabulary (cached)."""
    with _lock:
        hit = _built.get(tokenizer)
        if hit is None:
            n = tokenizer.vocab_size
            eos = sorted(tokenizer.eot_ids)
            source = _Source(
                [tokenizer.token_bytes(i) for i in range(n)],
                [i for i in range(n) if tokenizer.is_special(i)],
                tokenizer.eos_id if tokenizer.eos_id is not None else eos[0],
                tokenizer.bos_id,
                tokenizer,
            )
            hit = _built[tokenizer] = LLTokenizer(TokenizerWrapper(source), n_vocab=n, eos_token=eos)
        return hit


@cache
def byte_vocab() -> LLTokenizer:
    """256 one-byte tokens and an end token: for walking a grammar byte by byte (closing.py)."""
    source = _Source([bytes([b]) for b in range(256)] + [b"<end>"], [BYTE_EOS], BYTE_EOS, None, None)
    return LLTokenizer(TokenizerWrapper(source), eos_token=BYTE_EOS)

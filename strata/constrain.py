"""Constrained decoding: a constraint masks the logits before each draw and follows the tokens.

JsonConstraint implements response_format json_object: only tokens whose text keeps the output
a prefix of a valid JSON object survive, and generation ends when the object closes.
"""

from __future__ import annotations

import numpy as np

from strata.json_guard import JsonPrefix, allowed_token_mask
from strata.tokenizer import Tokenizer

# Candidates tried in order of logit: most steps are settled among the first few dozen.
_WIDTHS = (64, 1024)


class _TokenTexts:
    """token id -> decoded text, computed on first use (a vocabulary is 50k-260k entries)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._cache: dict[int, str] = {}

    def __getitem__(self, tid: int) -> str:
        text = self._cache.get(tid)
        if text is None:
            text = "" if self._tok.is_special(tid) else self._tok.decode([tid])
            self._cache[tid] = text
        return text

    def __len__(self) -> int:
        return self._tok.vocab_size


class JsonConstraint:
    def __init__(self, tokenizer: Tokenizer, seed: str = "") -> None:
        """`seed` is JSON text already in the prompt (a forced tool call's opening); the output
        continues it."""
        self.prefix = JsonPrefix()
        if seed and not self.prefix.feed(seed):
            raise ValueError(f"JSON seed {seed!r} is not a valid object prefix")
        self._texts = _TokenTexts(tokenizer)
        self._eos = tokenizer.eot_ids

    @property
    def done(self) -> bool:
        return self.prefix.complete

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """logits [vocab] with every token that would break the JSON set to -inf."""
        order = np.argsort(-logits, kind="stable")
        allowed: list[int] = []
        for width in (*_WIDTHS, order.size):
            allowed = allowed_token_mask(self.prefix, order[:width].tolist(), self._texts, self._eos)  # type: ignore[arg-type]
            if allowed:
                break
        out = np.full_like(logits, -np.inf)
        out[allowed] = logits[allowed]
        return out

    def advance(self, token: int) -> None:
        self.prefix.feed(self._texts[token])

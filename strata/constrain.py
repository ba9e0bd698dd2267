"""Constrained decoding: a constraint masks the logits before each draw and follows the tokens.

JsonConstraint implements response_format json_object: only tokens whose text keeps the output
a prefix of a valid JSON object survive, and generation ends when the object closes.
SchemaConstraint does the same for instances of one JSON Schema (a forced tool call's
{"name", "arguments"} object, see json_schema_guard.tool_call_schema): only declared keys, typed
values, and the object must close once its required keys are written.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from strata.json_guard import JsonPrefix, PrefixValidator, allowed_token_mask
from strata.json_schema_guard import SchemaPrefix
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


class _Prefix(PrefixValidator, Protocol):
    def feed(self, text: str) -> bool: ...


P = TypeVar("P", bound=_Prefix)


class PrefixConstraint(Generic[P]):
    """Masks logits to the tokens a prefix validator accepts (a sequence.Constraint)."""

    def __init__(self, tokenizer: Tokenizer, prefix: P, seed: str) -> None:
        """`seed` is text already in the prompt (a forced tool call's opening); the output
        continues it, so it must itself be a valid prefix."""
        if seed and not prefix.feed(seed):
            raise ValueError(f"JSON seed {seed!r} is not a valid prefix for this constraint")
        self.prefix = prefix
        self._texts = _TokenTexts(tokenizer)
        self._eos = tokenizer.eot_ids

    @property
    def done(self) -> bool:
        return self.prefix.complete

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """logits [vocab] with every token that would break the prefix set to -inf."""
        allowed: list[int] = []
        for width in (*_WIDTHS, logits.size):
            # Only the set matters (survivors keep their logits), so the top `width` need no sort:
            # argpartition is ~10x cheaper than argsort over a 50k-260k vocabulary.
            top = np.argpartition(-logits, width - 1)[:width] if width < logits.size else np.arange(width)
            allowed = allowed_token_mask(self.prefix, top.tolist(), self._texts, self._eos)
            if allowed:
                break
        out = np.full_like(logits, -np.inf)
        out[allowed] = logits[allowed]
        return out

    def advance(self, token: int) -> None:
        self.prefix.feed(self._texts[token])


class JsonConstraint(PrefixConstraint[JsonPrefix]):
    """response_format json_object: any JSON object."""

    def __init__(self, tokenizer: Tokenizer, seed: str = "") -> None:
        super().__init__(tokenizer, JsonPrefix(), seed)


class SchemaConstraint(PrefixConstraint[SchemaPrefix]):
    """An instance of one JSON Schema (see json_schema for the supported subset)."""

    def __init__(self, tokenizer: Tokenizer, schema: Any, seed: str = "") -> None:
        super().__init__(tokenizer, SchemaPrefix(schema), seed)

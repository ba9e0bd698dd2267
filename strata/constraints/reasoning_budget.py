"""Reasoning budget: once a <think> block has run for `budget` tokens, force it closed.

This is Anthropic's `thinking.budget_tokens` and our mapping of OpenAI `reasoning_effort`. It acts
like a constraint: while forcing, every logit but the next closing token is masked.
"""

from __future__ import annotations

import numpy as np

from strata.text.tokenizer import Tokenizer

OPEN, CLOSE = "<think>", "</think>"


class ThinkBudget:
    def __init__(self, tokenizer: Tokenizer, budget: int, in_think: bool) -> None:
        self._tok = tokenizer
        self.budget = budget
        self.inside = in_think  # the prompt may already have opened the block
        self.used = 0
        self._tail = ""  # recent text, so tags split across tokens are still seen
        self._forcing: list[int] = []
        self._close_ids = tokenizer.encode(f"\n{CLOSE}\n\n", add_special=False, parse_special=True)

    @property
    def done(self) -> bool:
        return False  # a budget never ends generation by itself

    def mask(self, logits: np.ndarray) -> np.ndarray:
        if not self._forcing:
            return logits
        out = np.full_like(logits, -np.inf)
        out[self._forcing[0]] = 0.0
        return out

    def advance(self, token: int) -> None:
        if self._forcing:
            self._forcing.pop(0)
            if not self._forcing:
                self.inside, self._tail = False, ""
            return
        self._tail = (self._tail + self._tok.decode([token]))[-32:]
        if not self.inside:
            if OPEN in self._tail:
                self.inside, self.used, self._tail = True, 0, ""
            return
        if CLOSE in self._tail:
            self.inside, self._tail = False, ""
            return
        self.used += 1
        if self.used >= self.budget:
            self._forcing = list(self._close_ids)

"""GrammarConstraint: a sequence.Constraint that holds decoding to a compiled grammar.

Before each draw every token the grammar does not allow is set to -inf; each drawn token moves the
matcher on; the constraint is done once the grammar has ended (the JSON value closed). The mask
for the next step is computed as soon as a token is taken: on `pool` (the scheduler's mask thread)
it runs while the model computes the next window, since llguidance drops the GIL, and the draw
only waits for what is left of it. Only that thread touches the matcher while a mask is pending.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future

import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from strata.constraints.schema import Grammar
from strata.errors import StrataError


class ConstraintError(StrataError):
    """The matcher refused a token or failed (a resource limit): the request cannot go on."""


class GrammarConstraint:
    def __init__(self, grammar: Grammar, pool: Executor | None = None) -> None:
        """`pool`: where the next mask is computed; None computes it in advance() itself."""
        self._m = grammar.matcher
        self._n = grammar.n_vocab
        self._pool = pool
        self._bits = allocate_token_bitmask(1, self._n)  # [1, ceil(vocab / 32)] int32
        self._stopped = self._m.is_stopped()
        self._next: Future[np.ndarray] | np.ndarray = self._schedule()

    @property
    def done(self) -> bool:
        return self._stopped

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """logits [vocab] with every token the grammar does not allow set to -inf."""
        allowed = self._allowed()  # [n_vocab] bool
        out = np.full_like(logits, -np.inf)
        n = min(allowed.size, logits.size)  # logits past the tokenizer's vocabulary (padding) stay -inf
        np.copyto(out[:n], logits[:n], where=allowed[:n])
        return out

    def advance(self, token: int) -> None:
        self._allowed()  # the pending mask is done with the matcher before it moves on
        if not self._m.consume_token(token):
            raise ConstraintError(f"the grammar refused token {token}: {self._m.get_error()}")
        self._stopped = self._m.is_stopped()
        self._next = self._schedule()

    def _schedule(self) -> Future[np.ndarray] | np.ndarray:
        return self._pool.submit(self._compute) if self._pool is not None else self._compute()

    def _allowed(self) -> np.ndarray:
        pending = self._next
        return pending.result() if isinstance(pending, Future) else pending

    def _compute(self) -> np.ndarray:
        """[n_vocab] bool: the tokens the grammar allows next."""
        fill_next_token_bitmask(self._m, self._bits)
        if self._m.is_error():
            raise ConstraintError(f"the grammar failed: {self._m.get_error()}")
        return np.unpackbits(self._bits.view(np.uint8), count=self._n, bitorder="little").view(np.bool_)

"""Token-level prefix cache: finished sequences leave their state behind for later prompts.

Attention KV can be cut at any length, so a KV-only state serves any prompt sharing a prefix with
it. Recurrent state (DeltaNet, n-gram history) cannot be cut, so such a state serves only prompts
that extend its whole token list: for hybrid models the scheduler therefore also checkpoints a prompt
where the next turn of its conversation will part from it and one token before its end (the same prompt
again; `own_checkpoints`) and at every `every` tokens (a long shared prefix: system prompt
and tools). Entries are evicted least-recently-used under a byte budget.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from strata.runtime.passes import STEP_ROWS
from strata.runtime.state import Checkpoint, SequenceState

log = logging.getLogger("strata.prefix_cache")

# Shorter matches are not worth a state copy.
MIN_REUSE = 4
# Prompt positions, beside the last but one, where a hybrid model's state is kept while prefilling: multiples
# of this, or of the prefill chunk where that is longer (`checkpoint_every`), since a chunk ends at each one
CHECKPOINT_EVERY = 2048


def checkpoint_every(prefill_chunk: int) -> int:
    """The checkpoints' spacing for an engine reading prompts in prefill_chunk-token passes: a spacing below
    the chunk would cut every chunk short (on the GPU a pass under a VRAM budget costs its staging copies
    whatever its length, so a 4k prompt read as two 2k passes took twice as long)."""
    return max(CHECKPOINT_EVERY, prefill_chunk)


@dataclass(slots=True)
class _Entry:
    tokens: np.ndarray
    state: SequenceState
    nbytes: int


class PrefixCache:
    def __init__(self, budget_bytes: int, every: int | None = None, fold: int = 0) -> None:
        self.budget = budget_bytes
        self.every = every or CHECKPOINT_EVERY  # checkpoints' spacing (`checkpoint_every`)
        # no spaced checkpoint within `fold` tokens of the prompt's own: the pass that ends there takes them
        # in (passes.pass_rows; where the spacing is the chunk, a checkpoint just short of the prompt's end
        # would cost a pass)
        self.fold = fold
        self.used = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def snapshot(state: SequenceState, at: Checkpoint | None = None) -> SequenceState | None:
        """A copy of `state` (as it stood `at` a checkpoint inside its last pass) in host RAM to `keep`, None
        where one cannot be made (a cache never fails a request). Any thread may take it, while nothing
        changes the state."""
        try:
            return state.snapshot(at)
        except Exception:
            log.exception("prefix cache: could not snapshot a state of %d tokens", state.n_past)
            return None

    def keep(self, snap: SequenceState) -> None:
        """Keep a snapshot (from `snapshot`), dropping the entries it makes redundant and the least recently
        used ones over the budget."""
        size = snap.nbytes()
        if size > self.budget or snap.n_past < MIN_REUSE:
            return
        toks = np.asarray(snap.tokens, dtype=np.int64)
        for key, e in list(self._entries.items()):
            # the same tokens again, or a KV-only entry this one extends (it can be cut back to it), are
            # redundant; a shorter recurrent entry is not: it serves prompts that part from this one there
            extends = len(e.tokens) <= len(toks) and np.array_equal(e.tokens, toks[: len(e.tokens)])
            if extends and (len(e.tokens) == len(toks) or not e.state.layers):
                self._drop(key)
        while self.used + size > self.budget and self._entries:
            self._drop(next(iter(self._entries)))
        self._entries[self._next_key] = _Entry(toks, snap, size)
        self._next_key += 1
        self.used += size

    def lookup(self, prompt: list[int], fresh: SequenceState) -> int:
        """Restore into `fresh` the longest reusable prefix of `prompt`; returns its length (0 = none).

        At least one prompt token is always left to feed, since its logits start the reply.
        """
        want = np.asarray(prompt, dtype=np.int64)
        best_key, best_len = None, 0
        for key, e in self._entries.items():
            same = reusable(e.tokens, bool(e.state.layers), want)
            if same > best_len:
                best_key, best_len = key, same
        if best_key is None:
            return 0
        entry = self._entries[best_key]
        self._entries.move_to_end(best_key)
        try:
            fresh.restore(entry.state)
        except Exception:
            log.exception("prefix cache: could not restore %d cached tokens", best_len)
            return 0
        fresh.kv.truncate(best_len)
        fresh.n_past = best_len
        del fresh.tokens[best_len:]
        self.hits += 1
        self.reused_tokens += best_len
        return best_len

    def wants(self, state: SequenceState, prompt_len: int, turn_end: int | None = None) -> bool:
        """Whether a prefilling state at its current length is a checkpoint worth keeping."""
        n = state.n_past
        own = own_checkpoints(prompt_len, turn_end)
        return bool(state.layers) and n >= MIN_REUSE and (n in own or n % self.every == 0)

    def next_stop(
        self, state: SequenceState, prompt_len: int, turn_end: int | None = None, spaced: bool = True
    ) -> int:
        """The prompt position the next prefill chunk of a hybrid model must not pass: the next checkpoint
        (none within `fold` tokens of the prompt's own); spaced=False: the prompt's own only (a wide pass
        takes the spaced ones inside it, `marks`)."""
        n = state.n_past
        if not state.layers:
            return prompt_len
        own = own_checkpoints(prompt_len, turn_end)
        marks = self.marks(state, n + self.every + 1, prompt_len, turn_end) if spaced else []
        return min(v for v in [*own, *marks, prompt_len] if v > n)

    def marks(
        self, state: SequenceState, end: int, prompt_len: int, turn_end: int | None = None
    ) -> list[int]:
        """The spaced checkpoints of a hybrid prompt after the state's length and before `end`, none within
        `fold` tokens of the prompt's own."""
        if not state.layers:
            return []
        own = own_checkpoints(prompt_len, turn_end)
        first = (state.n_past // self.every + 1) * self.every
        return [p for p in range(first, end, self.every) if own[0] - p > self.fold]

    def _drop(self, key: int) -> None:
        self.used -= self._entries.pop(key).nbytes


def own_checkpoints(prompt_len: int, turn_end: int | None) -> tuple[int, ...]:
    """Where a hybrid model's prompt keeps its own state, in order: at the end of its conversation, before
    the generation prompt, where that is known (the next turn renders the answer its own way from there: a
    thinking template drops the empty think block of a reply without thoughts, a forced call's opening is
    rewritten with the call), and one token before its end (the same prompt again) where the generation
    prompt between them is read as decode steps (passes.STEP_ROWS: the stop costs a snapshot, not a pass;
    a forced call's opening is longer, and its prompt is seldom sent twice)."""
    if turn_end is None or not MIN_REUSE <= turn_end < prompt_len - 1:
        return (prompt_len - 1,)
    return (turn_end, prompt_len - 1) if prompt_len - 1 - turn_end <= STEP_ROWS else (turn_end,)


def reusable(tokens: np.ndarray, recurrent: bool, prompt: np.ndarray) -> int:
    """Prompt tokens a state that consumed `tokens` can stand for (0: none), one prompt token always left to
    feed: their common prefix, or nothing where recurrent state would have to be rewound."""
    n = min(len(tokens), len(prompt) - 1)
    same = int(np.argmin(np.append(tokens[:n] == prompt[:n], False)))  # common prefix length
    if recurrent and same < len(tokens):
        return 0
    return same if same >= MIN_REUSE else 0

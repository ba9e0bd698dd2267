"""One forward pass's bracket, for every CPU architecture: what must happen between passes, before the
layers run and after they did.

Before: each sequence's KV makes room for its rows (the --kv-resident window gives its oldest blocks to the
host, growth takes from the --kv-grow ledger, which may take expert slots), and the expert cache takes back
slots a finished KV left. Around: with expert tiers, long passes borrow slots, and the pass's counters are
credited to each sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from strata.runtime.state import SequenceState
from strata.runtime.weights import WeightStore


@contextmanager
def forward_pass(w: WeightStore, states: Sequence[SequenceState], lens: Sequence[int]) -> Iterator[None]:
    """Brackets one pass over the states' tokens (lens[i] rows each, in order)."""
    for s, n in zip(states, lens):
        s.kv.before_pass(n)
    cache = w.tiers
    if cache is None:
        yield
        return
    if cache.lender is not None:
        cache.lender.reclaim()
    cache.begin_pass(sum(lens))
    try:
        yield
    finally:
        cache.end_pass([s.experts for s in states], list(lens))

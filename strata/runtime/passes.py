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

# Rows a sequence's pass may carry past the prefill chunk: the few prompt tokens past a chunk, folded into it.
# A pass under a VRAM budget stages every expert the cache lacks whatever its length: a 4,116-token prompt
# read as 4,096 + 19 tokens spent 364 ms on the 19 beside 678 on the chunk (H100, the 80B at 24 GiB). The GPU
# plans its per-row buffers for chunk + PASS_SLACK rows, which also holds the decode rows of a window beside a
# prompt chunk.
PASS_SLACK = 64

# Rows a sequence may bring to a window that the GPU then runs as captured decode steps, a row a step, instead
# of an eager pass (strata/gpu/model.py). On the 80B a step replays one graph (4.4 ms all-resident, 12.7 at 24
# GiB on an H100) where an eager pass launches every kernel from Python (~35 ms) and at 24 GiB reads its rows'
# misses (9 rows 105 ms, 32 rows 327 ms): steps cost less up to ~8 rows either way (perf/host_stub.py's
# calibrations). A chat prompt's generation prompt, read after the checkpoint that ends its conversation
# (sched/prefix_cache.own_checkpoints), is 3 tokens, or 7 with an empty think block.
STEP_ROWS = 8


def pass_slack(chunk: int) -> int:
    """The rows a pass may fold in past a chunk: PASS_SLACK, at most an eighth of the chunk (a folded pass
    never runs much longer than a chunk does)."""
    return min(PASS_SLACK, chunk // 8)


def pass_rows(left: int, chunk: int, beside: int = 0) -> int:
    """Prompt tokens the next pass reads of the `left` still to read: all of them where they fit the chunk and
    the slack its `beside` decode rows leave, else the chunk."""
    return left if left <= chunk + max(0, pass_slack(chunk) - beside) else chunk


def pass_spans(n: int, chunk: int) -> Iterator[tuple[int, int]]:
    """The [start, end) of each pass that reads n prompt tokens alone (`pass_rows` each)."""
    s = 0
    while s < n:
        e = s + pass_rows(n - s, chunk)
        yield s, e
        s = e


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

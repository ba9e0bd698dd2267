"""The scheduler's wide windows: a prompt read alone goes in the engine's widest passes (Engine.prompt_rows),
and a hybrid prompt's spaced checkpoints are taken inside them (forward_marked) rather than ending them."""

from __future__ import annotations

import asyncio

import numpy as np
from sched_fakes import FakeEngine, FakeModel, drain, make, run, solo

from strata.runtime.kvcache import KVCache
from strata.runtime.state import Checkpoint, SequenceState
from strata.sched.prefix_cache import PrefixCache
from strata.sched.request import DoneEvent, ErrorEvent, RequestState
from strata.sched.scheduler import Scheduler


def test_a_prompt_read_alone_goes_in_the_engines_widest_passes() -> None:
    """Under tiers the GPU reads a lone prompt in passes wider than the chunk (Engine.prompt_rows: a layer's
    staged experts serve every chunk-sized part); beside a stream, or beside another prompt, the windows keep
    to the chunk."""

    async def go() -> None:
        eng = FakeEngine()
        eng.options.prefill_chunk, eng.wide_rows = 8, 32
        sch = Scheduler(eng, parallel=2)  # type: ignore[arg-type]
        sch.pacer.chunk = lambda max_chunk, left: min(max_chunk, left)  # type: ignore[method-assign]
        sch.start()
        alone = make(list(range(1, 31)) * 2, 3)  # 60 tokens: 32 and 28 alone
        sch.submit(alone)
        await drain(alone)
        assert [w for w in eng.model.windows if w and w[0] > 1][:2] == [[32], [28]]
        eng.model.windows.clear()
        runner = make([1, 2, 3], 40)
        sch.submit(runner)
        while runner.state is not RequestState.SOLO:
            await asyncio.sleep(0)
        beside = make(list(range(1, 31)), 2)
        sch.submit(beside)
        (t1, _), (t2, _) = await asyncio.gather(drain(runner), drain(beside))
        sch.stop()
        assert t1 == solo([1, 2, 3], 40) and t2 == solo(list(range(1, 31)), 2)
        shared = [w for w in eng.model.windows if len(w) == 2]
        assert shared and all(max(w) <= 8 for w in shared)

    run(go())


class _Sum:
    """A stand-in recurrent state: the sum of the tokens read so far (it cannot be cut back)."""

    def __init__(self, v: int = 0) -> None:
        self.v = v

    def copy(self) -> _Sum:
        return _Sum(self.v)


class _HybridModel(FakeModel):
    """The fake model with recurrent state; forward_marked also gives the state at positions inside a pass,
    as the GPU's wide passes take it."""

    def forward_batch(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        for t, st in zip(tokens, states):
            st.layers[("sum", 0)].v += int(np.sum(t))  # type: ignore[attr-defined]
        return super().forward_batch(tokens, states)

    def forward_marked(
        self, tokens: np.ndarray, state: SequenceState, marks: list[int]
    ) -> tuple[np.ndarray, list[Checkpoint]]:
        v, n0 = state.layers[("sum", 0)].v, state.n_past  # type: ignore[attr-defined]
        kept = [Checkpoint(m, {("sum", 0): _Sum(v + int(np.sum(tokens[: m - n0])))}) for m in marks]
        self.marked.append(list(marks))
        return self.forward_batch([tokens], [state])[0], kept


def test_a_hybrid_prompt_read_alone_keeps_its_checkpoints_inside_wide_passes() -> None:
    """A hybrid model's prompt read alone goes in the engine's wide passes, not one window a checkpoint: the
    spaced checkpoints inside a pass come from the model (forward_marked), join the prefix cache with the
    KV's cells before them, and serve a later prompt that shares only a prefix, as chunk windows' would."""

    async def go() -> None:
        eng = FakeEngine()
        eng.model = _HybridModel()
        eng.model.marked = []  # type: ignore[attr-defined]
        eng.options.prefill_chunk, eng.wide_rows = 8, 32
        eng.new_state = lambda: SequenceState(KVCache([0], 1, 1), layers={("sum", 0): _Sum()})  # type: ignore[method-assign]
        cache = PrefixCache(1 << 30, 8, 1)
        sch = Scheduler(eng, parallel=2, prefix_cache=cache, decode_ahead=False)  # type: ignore[arg-type]
        sch.start()
        first = list(range(1, 61))  # 60 tokens: 32 (marks 8, 16, 24), then 27 to its own checkpoint at 59
        toks, done = await drain_req(sch, first)
        assert toks == solo(first, 3) and isinstance(done, DoneEvent)
        reads = [w[0] for w in eng.model.windows if w and w[0] > 1]
        assert reads[:2] == [32, 27] and eng.model.marked == [[8, 16, 24], [40, 48, 56]]
        kept = {int(e.state.n_past): e.state for e in cache._entries.values()}
        assert {8, 16, 24, 32, 40, 48, 56, 59} <= set(kept)
        for n in (8, 24, 40, 56):  # the state the pass had there, the cells before it and no more
            assert kept[n].layers[("sum", 0)].v == sum(first[:n]) and kept[n].tokens == first[:n]
            assert kept[n].kv.length == {0: n}
        other = first[:44] + [7, 7, 7, 7]  # parts from the first prompt after 44 tokens: 40 is reused
        toks, done = await drain_req(sch, other)
        sch.stop()
        assert toks == solo(other, 3) and isinstance(done, DoneEvent) and done.cached_tokens == 40

    run(go())


async def drain_req(sch: Scheduler, prompt: list[int]) -> tuple[list[int], DoneEvent | ErrorEvent]:
    req = make(prompt, 3)
    sch.submit(req)
    return await drain(req)

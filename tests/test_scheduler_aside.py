"""A newcomer's prompt read on the model's second lane (sched/aside.py) while the running streams keep their
decode windows, on fabricated model outputs (tests/sched_fakes.py): no model, no HTTP. The GPU's lane itself
(GpuModel.read_aside beside captured decode steps) is tests/test_gpu_turns.py's."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from sched_fakes import FakeEngine, FakeModel, drain, make, run, solo

from strata.runtime.state import SequenceState
from strata.sched.request import DoneEvent, ErrorEvent, Request, RequestState
from strata.sched.scheduler import Scheduler

LONG = [(7 * i) % 43 + 1 for i in range(30)]  # 30 prompt tokens: 3 passes of the fake's 8-token chunk, then 6
STREAM = [3, 4, 5]


@dataclass
class AsideModel(FakeModel):
    """The fake model with a second lane: each pass there takes `pass_s` on a thread of the scheduler's, and
    records how many decode windows the first lane ran meanwhile."""

    aside: bool = True
    pass_s: float = 0.02
    window_s: float = 0.002  # a first-lane window's time: the stream's 60 tokens outlast the prompt's passes
    fail_on: int = -1  # the aside pass (0-based) that raises
    asides: list[int] = field(default_factory=list)  # rows of each aside pass
    beside: list[int] = field(default_factory=list)  # windows the first lane ran during each aside pass
    threads: set[str] = field(default_factory=set)

    def forward_batch(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        time.sleep(self.window_s)
        return super().forward_batch(tokens, states)

    def read_aside(self, tokens: np.ndarray, state: SequenceState) -> np.ndarray:
        self.threads.add(threading.current_thread().name)
        if len(self.asides) == self.fail_on:
            self.asides.append(len(tokens))
            raise RuntimeError("the aside pass failed")
        before = len(self.windows)
        time.sleep(self.pass_s)
        self.asides.append(len(tokens))
        out = FakeModel.forward_batch(self, [tokens], [state])[0]
        self.windows.pop()  # not a window of the first lane
        self.beside.append(len(self.windows) - before)
        return out


def aside_engine(**kw: object) -> FakeEngine:
    eng = FakeEngine()
    eng.model = AsideModel(**kw)  # type: ignore[arg-type]
    return eng


async def _stream_then_long(sch: Scheduler, n_stream: int = 60) -> tuple[list, list]:  # type: ignore[type-arg]
    """A stream running, then a long prompt; both drained."""
    first = make(STREAM, n_stream)
    sch.submit(first)
    ev = await asyncio.wait_for(first.events.get(), 5)  # the stream is decoding
    late = make(LONG, 6)
    sch.submit(late)
    a, b = await asyncio.gather(drain(first), drain(late))
    return [ev.token, *a[0]], [a[1], b[0], b[1]]


async def _streaming(pass_s: float) -> tuple[FakeEngine, Scheduler, Request]:
    """A scheduler over the fake with aside passes of pass_s, and a stream of 80 tokens that has begun."""
    eng = aside_engine(pass_s=pass_s)
    sch = Scheduler(eng, parallel=4)  # type: ignore[arg-type]
    sch.start()
    first = make(STREAM, 80)
    sch.submit(first)
    await asyncio.wait_for(first.events.get(), 5)
    return eng, sch, first


def test_a_prompt_beside_a_stream_is_read_aside_while_the_stream_decodes() -> None:
    async def go() -> None:
        eng = aside_engine()
        sch = Scheduler(eng, parallel=4)  # type: ignore[arg-type]
        sch.start()
        stream, (done, late, late_done) = await _stream_then_long(sch)
        sch.stop()
        m: AsideModel = eng.model  # type: ignore[assignment]
        assert stream == solo(STREAM, 60) and late == solo(LONG, 6)  # batched == solo for both
        assert isinstance(done, DoneEvent) and isinstance(late_done, DoneEvent)
        assert m.asides == [8, 8, 8]  # the prompt in chunks but its last STEP_ROWS, which the windows read
        assert all(n > 0 for n in m.beside), m.beside  # the stream decoded during every pass
        assert m.threads == {"strata-aside_0"}
        # the late prompt's first 24 tokens were in no window of the first lane (the stream's prompt, alone,
        # was), its last 6 were
        prompts = [n for w in m.windows for n in w if n > 1]
        assert prompts[0] == 3 and sum(prompts[1:]) <= 6
        assert max(len(w) for w in m.windows) == 2

    run(go())


def test_a_prompt_alone_or_with_the_lane_off_is_read_in_the_windows() -> None:
    async def go(aside_on: bool, beside_stream: bool) -> AsideModel:
        eng = aside_engine()
        sch = Scheduler(eng, parallel=4, prefill_aside=aside_on)  # type: ignore[arg-type]
        sch.start()
        if beside_stream:
            _, (_, late, _) = await _stream_then_long(sch)
        else:
            req = make(LONG, 6)
            sch.submit(req)
            late, _ = await drain(req)
        sch.stop()
        assert late == solo(LONG, 6)
        return eng.model  # type: ignore[return-value]

    alone = run(go(True, False))
    assert alone.asides == [] and alone.windows[:4] == [[8], [8], [8], [6]]
    off = run(go(False, True))
    assert off.asides == [] and any(n > 1 for w in off.windows for n in w)


def test_a_failed_aside_pass_fails_its_request_alone() -> None:
    async def go() -> None:
        eng = aside_engine(fail_on=1)
        sch = Scheduler(eng, parallel=4)  # type: ignore[arg-type]
        sch.start()
        stream, (done, late, late_done) = await _stream_then_long(sch)
        assert stream == solo(STREAM, 60) and isinstance(done, DoneEvent)
        assert late == [] and isinstance(late_done, ErrorEvent) and "aside pass failed" in late_done.reason
        # the server carries on: the next prompt beside a stream is read aside again
        _, (_, again, again_done) = await _stream_then_long(sch, 30)
        sch.stop()
        assert again == solo(LONG, 6) and isinstance(again_done, DoneEvent)
        assert sch.busy_slots == 0

    run(go())


def test_a_client_that_leaves_during_an_aside_read_is_reaped_after_its_pass() -> None:
    async def go() -> None:
        eng, sch, first = await _streaming(0.05)
        late = make(LONG, 6)
        sch.submit(late)
        await asyncio.sleep(0.07)  # within its second pass
        late.cancel()
        toks, done = await drain(late)
        m: AsideModel = eng.model  # type: ignore[assignment]
        assert toks == [] and isinstance(done, DoneEvent)
        assert 1 <= len(m.asides) < 3  # no pass after the one it left in
        rest, first_done = await drain(first)
        sch.stop()
        assert isinstance(first_done, DoneEvent) and len(rest) == len(solo(STREAM, 80)) - 1
        assert sch.busy_slots == 0

    run(go())


def test_a_request_that_comes_during_an_aside_read_waits_for_it() -> None:
    """One prompt pass at a time (the GPU plans room for one pass's buffers): a newcomer during an aside read
    is admitted once that read is done, and every request still equals its solo run."""

    async def go() -> None:
        _, sch, first = await _streaming(0.03)
        late, later = make(LONG, 6), make([9, 8, 7, 6, 5], 6)
        sch.submit(late)
        await asyncio.sleep(0.01)
        sch.submit(later)
        await asyncio.sleep(0.02)  # within the first aside pass
        assert later.state is RequestState.QUEUED
        results = await asyncio.gather(drain(first), drain(late), drain(later))
        sch.stop()
        assert results[1][0] == solo(LONG, 6) and results[2][0] == solo([9, 8, 7, 6, 5], 6)
        assert all(isinstance(done, DoneEvent) for _, done in results)

    run(go())

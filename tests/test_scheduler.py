"""Scheduler state machine on fabricated model outputs (tests/sched_fakes.py): no model, no HTTP."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from sched_fakes import PROMPTS, FakeEngine, drain, make, run, solo

from strata.runtime.finish import ANTHROPIC_STOP, OPENAI_FINISH, FinishReason
from strata.runtime.state import SequenceState
from strata.sampling.params import SamplingParams
from strata.sched.prefix_cache import PrefixCache
from strata.sched.request import DoneEvent, ErrorEvent, Request, RequestState
from strata.sched.scheduler import QueueFullError, Scheduler


def test_single_request_walks_the_states_and_matches_the_model() -> None:
    async def go() -> None:
        eng = FakeEngine()
        sch = Scheduler(eng, parallel=4)  # type: ignore[arg-type]
        sch.start()
        req = make(PROMPTS[1])
        assert req.state is RequestState.QUEUED
        sch.submit(req)
        toks, done = await drain(req)
        sch.stop()
        assert isinstance(done, DoneEvent) and done.reason is FinishReason.LENGTH
        assert toks == solo(PROMPTS[1], 6)
        assert req.state is RequestState.FINISHED
        assert eng.model.windows[0] == [8] and eng.model.windows[1] == [5]  # prompt in prefill chunks

    run(go())


def test_concurrent_requests_equal_solo_and_never_exceed_slots() -> None:
    async def go() -> None:
        eng = FakeEngine()
        sch = Scheduler(eng, parallel=4)  # type: ignore[arg-type]
        sch.start()
        reqs = [make(p, 8) for p in PROMPTS]
        for r in reqs:
            sch.submit(r)
        results = await asyncio.gather(*(drain(r) for r in reqs))
        sch.stop()
        for p, (toks, done) in zip(PROMPTS, results):
            assert toks == solo(p, 8)
            assert isinstance(done, DoneEvent)
        assert max(len(w) for w in eng.model.windows) <= 4
        # newcomers read their prompts together only while those fit one chunk (8 tokens)
        assert max(sum(n for n in w if n > 1) for w in eng.model.windows) <= 8

    run(go())


def test_requests_that_come_together_share_one_prompt_window() -> None:
    """A burst of short prompts is read in one window, not one window (and its fixed cost) each; prompts
    that do not fit one chunk beside the prompt being read wait for the next window."""

    async def go() -> None:
        eng = FakeEngine()
        eng.options.prefill_chunk = 16
        sch = Scheduler(eng, parallel=4)  # type: ignore[arg-type]
        prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[3], PROMPTS[4]]  # 3 + 1 + 2 + 3 tokens
        reqs = [make(p, 8) for p in prompts]
        for r in reqs:
            sch.submit(r)
        sch.start()
        results = await asyncio.gather(*(drain(r) for r in reqs))
        long = make(PROMPTS[1], 8)  # 13 tokens
        shorts = [make(PROMPTS[5], 8), make(PROMPTS[0], 8)]  # 4 + 3: the second no longer fits beside it
        for r in (long, *shorts):
            sch.submit(r)
        later = await asyncio.gather(*(drain(r) for r in (long, *shorts)))
        sch.stop()
        for p, (toks, done) in zip([*prompts, PROMPTS[1], PROMPTS[5], PROMPTS[0]], results + later):
            assert toks == solo(p, 8) and isinstance(done, DoneEvent)
        assert eng.model.windows[0] == [3, 1, 2, 3]
        # 13 + 4 > 16: the shorts wait for the long prompt's window, then share the next one
        i = eng.model.windows.index([13])
        assert eng.model.windows[i + 1] == [1, 4, 3]

    run(go())


def test_solo_request_becomes_batched_in_place() -> None:
    async def go() -> None:
        eng = FakeEngine()
        sch = Scheduler(eng, parallel=4)  # type: ignore[arg-type]
        sch.start()
        first = make(PROMPTS[0], 30)
        sch.submit(first)
        while first.state is not RequestState.SOLO:
            await asyncio.sleep(0)
        seen_prompt = len(eng.model.windows)
        second = make(PROMPTS[2], 4)
        sch.submit(second)
        while second.state not in (RequestState.BATCHED, RequestState.FINISHED):
            await asyncio.sleep(0)
        assert first.state in (RequestState.BATCHED, RequestState.FINISHED)
        (t1, _), (t2, _) = await asyncio.gather(drain(first), drain(second))
        sch.stop()
        assert t1 == solo(PROMPTS[0], 30) and t2 == solo(PROMPTS[2], 4)
        # after the first window the first request only ever fed one token per window: no re-read
        assert all(w[0] == 1 for w in eng.model.windows[seen_prompt:] if w)

    run(go())


def test_long_prompt_prefills_in_shared_chunks_while_others_decode() -> None:
    async def go() -> None:
        eng = FakeEngine()
        eng.options.prefill_chunk = 1000
        sch = Scheduler(eng, parallel=2)  # type: ignore[arg-type]
        sch.pacer.chunk = lambda max_chunk, left: min(16, left)  # type: ignore[method-assign]  # fake windows take no time
        sch.start()
        runner = make([1, 2, 3], 40)
        sch.submit(runner)
        while runner.state is not RequestState.SOLO:
            await asyncio.sleep(0)
        long = make(list(range(1, 40)) * 5, 2)
        sch.submit(long)
        await asyncio.gather(drain(runner), drain(long))
        sch.stop()
        shared = [w for w in eng.model.windows if len(w) == 2]
        assert shared and all(max(w) <= 16 for w in shared)
        assert max(max(w) for w in eng.model.windows) > 16  # alone, a prompt goes in full chunks

    run(go())


def test_queue_is_fifo_and_limit_raises() -> None:
    async def go() -> None:
        eng = FakeEngine()
        sch = Scheduler(eng, parallel=1, queue_limit=2)  # type: ignore[arg-type]
        a, b, c, d = make(PROMPTS[0], 3), make(PROMPTS[2], 3), make(PROMPTS[3], 3), make(PROMPTS[4], 3)
        for r in (a, b, c):  # a goes to the free slot; b and c are the two queued
            sch.submit(r)
        with pytest.raises(QueueFullError) as e:
            sch.submit(d)
        assert e.value.retry_after >= 1 and sch.queue_depth == 2
        sch.start()
        order = []

        async def track(r: Request) -> None:
            await drain(r)
            order.append(r)

        await asyncio.gather(track(a), track(b), track(c))
        sch.stop()
        assert order == [a, b, c]

    run(go())


def test_cancel_frees_the_slot_for_the_next_request() -> None:
    async def go() -> None:
        eng = FakeEngine()
        sch = Scheduler(eng, parallel=1)  # type: ignore[arg-type]
        sch.start()
        a, b = make(PROMPTS[0], 10_000), make(PROMPTS[2], 3)
        sch.submit(a)
        sch.submit(b)
        await a.events.get()
        a.cancel()
        toks, done = await drain(b)
        _, done_a = await drain(a)
        sch.stop()
        assert isinstance(done_a, DoneEvent) and done_a.reason is FinishReason.CANCELLED
        assert toks == solo(PROMPTS[2], 3) and isinstance(done, DoneEvent)

    run(go())


def test_window_fault_fails_in_flight_only_and_bumps_epoch() -> None:
    async def go() -> None:
        eng = FakeEngine()
        sch = Scheduler(eng, parallel=2)  # type: ignore[arg-type]
        sch.faults.arm()
        a, b, c = make(PROMPTS[0], 5), make(PROMPTS[1], 5), make(PROMPTS[3], 5)
        for r in (a, b, c):
            sch.submit(r)
        sch.start()
        (_, ea), (_, eb), (tc, ec) = await asyncio.gather(drain(a), drain(b), drain(c))
        sch.stop()
        assert isinstance(ea, ErrorEvent) and "injected" in ea.reason
        assert a.finish is FinishReason.ERROR and sch.epoch == 1
        # b was still queued (its prompt does not fit one chunk beside a's), so it and c are served normally
        assert isinstance(eb, DoneEvent) and isinstance(ec, DoneEvent)
        assert tc == solo(PROMPTS[3], 5)

    run(go())


def test_a_sticky_cuda_error_fails_everything_and_marks_the_device_lost() -> None:
    """A window that meets a sticky CUDA error (the process's context is gone: every later launch fails the
    same way) fails every request in flight or queued, `stalled` (/health's 503) names it, and new requests
    are refused; the H100 met one in a tool loop's second round."""
    from strata.sched.slots import DeviceLostError

    class Lost:
        def check(self) -> None:
            raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")

    async def go() -> None:
        sch = Scheduler(FakeEngine(), parallel=1)  # type: ignore[arg-type]
        sch.faults = Lost()  # type: ignore[assignment]
        a, b = make(PROMPTS[0], 5), make(PROMPTS[1], 5)
        for r in (a, b):
            sch.submit(r)
        sch.start()
        (_, ea), (_, eb) = await asyncio.gather(drain(a), drain(b))
        assert isinstance(ea, ErrorEvent) and "cudaErrorIllegalAddress" in ea.reason
        assert isinstance(eb, ErrorEvent) and "restart" in eb.reason  # b was queued, never ran
        assert "cudaErrorIllegalAddress" in (sch.stalled() or "")
        with pytest.raises(DeviceLostError):
            sch.submit(make(PROMPTS[2], 5))
        sch.stop()

    run(go())


def test_prefix_cache_reuses_and_reports_cached_tokens() -> None:
    async def go() -> None:
        eng = FakeEngine()
        sch = Scheduler(eng, parallel=1, prefix_cache=PrefixCache(1 << 20))  # type: ignore[arg-type]
        sch.start()
        first = make(PROMPTS[1], 3)
        sch.submit(first)
        t1, _d1 = await drain(first)
        again = make(PROMPTS[1] + t1 + [4, 4], 3)
        sch.submit(again)
        t2, d2 = await drain(again)
        sch.stop()
        # the decode pipeline fed the answer's last token before the host saw the request end, so the state
        # kept holds the whole answer
        assert isinstance(d2, DoneEvent) and d2.cached_tokens == len(PROMPTS[1]) + len(t1)
        assert t2 == solo(PROMPTS[1] + t1 + [4, 4], 3)

    run(go())


def test_snapshots_are_copied_off_the_loop_and_a_next_turn_waits_for_its_own(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A snapshot (a state's copy to host RAM, ~10-20 ms on the GPU) is taken on a worker thread: streams keep
    flowing meanwhile. The next turn, which the copy of the last answer's state serves, waits for it."""
    import threading
    import time

    threads: set[str] = set()
    real = SequenceState.snapshot

    def slow(self: SequenceState, at=None) -> SequenceState:  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name.split("_")[0])
        time.sleep(0.2)
        return real(self, at)

    monkeypatch.setattr(SequenceState, "snapshot", slow)

    async def go() -> None:
        eng = FakeEngine()
        sch = Scheduler(eng, parallel=2, prefix_cache=PrefixCache(1 << 20))  # type: ignore[arg-type]
        sch.start()
        runner, first = make(PROMPTS[0], 120), make(PROMPTS[1], 3)
        sch.submit(runner)
        stamps: list[float] = []

        async def watch() -> None:
            while not isinstance(await runner.events.get(), DoneEvent):
                stamps.append(time.perf_counter())
                await asyncio.sleep(0.005)  # a client's pace: the runner outlives the copies

        watching = asyncio.create_task(watch())
        sch.submit(first)
        t1, _ = await drain(first)
        again = make(PROMPTS[1] + t1 + [4, 4], 3)
        sch.submit(again)  # at once: the first's snapshot is still being copied
        t2, d2 = await drain(again)
        await watching
        sch.stop()
        assert isinstance(d2, DoneEvent) and d2.cached_tokens == len(PROMPTS[1]) + len(t1)
        assert t2 == solo(PROMPTS[1] + t1 + [4, 4], 3)
        assert threads == {"strata-snapshot"}
        assert max(b - a for a, b in itertools.pairwise(stamps)) < 0.1  # no copy stopped the runner

    run(go())


def test_every_finish_reason_maps_to_both_protocols() -> None:
    for reason in FinishReason:
        assert reason in OPENAI_FINISH and reason in ANTHROPIC_STOP


def test_decode_pipeline_runs_ahead_and_equals_plain_windows() -> None:
    """Decode windows go through the pipeline (sched/ahead.py: the next step runs on its worker while the loop
    takes the last one's tokens), and give the tokens of plain windows, sampled ones too, while requests come
    and go around it (two slots, six requests)."""
    import threading

    threads: set[str] = set()

    async def go(pipelined: bool) -> list[list[int]]:
        eng = FakeEngine()
        forward = eng.model.forward_batch

        def traced(tokens, states):  # type: ignore[no-untyped-def]
            threads.add(threading.current_thread().name.split("_")[0])
            return forward(tokens, states)

        eng.model.forward_batch = traced  # type: ignore[method-assign]
        sch = Scheduler(eng, parallel=2, decode_ahead=pipelined)  # type: ignore[arg-type]
        sch.start()
        reqs = [
            Request(list(p), SamplingParams(temperature=0.9, top_k=0 if i % 2 else 7, top_p=0.9), 12, seed=i)
            for i, p in enumerate(PROMPTS)
        ]
        for r in reqs:
            sch.submit(r)
        out = await asyncio.gather(*(drain(r) for r in reqs))
        sch.stop()
        assert all(isinstance(d, DoneEvent) for _, d in out)
        return [t for t, _ in out]

    plain = run(go(False))
    assert threads == {"strata-engine"}
    threads.clear()
    assert run(go(True)) == plain
    assert threads == {"strata-engine", "strata-ahead"}  # prompts in plain windows, decode ahead


class _Owing:
    """A pacer that owes the streams 3 decode-only windows after each 16-token chunk."""

    decode_s = None

    def __init__(self) -> None:
        self.owed = 0

    def cost(self) -> None:
        return None

    def observe(self, seconds: float, n_prefill: int, streams: bool = True) -> None:
        self.owed = 3 if n_prefill else max(0, self.owed - 1)

    def chunk(self, max_chunk: int, remaining: int) -> int:
        return 0 if self.owed else min(16, remaining)


def test_decode_windows_beside_a_waiting_prompt_are_pipelined() -> None:
    """While a newcomer's prompt sits out the windows the pacer owes the streams, those windows go through the
    pipeline (not plain windows sampled on the host), and every request gets the tokens it gets alone."""
    import threading

    async def go() -> None:
        eng = FakeEngine()
        eng.options.prefill_chunk = 1000
        forward = eng.model.forward_batch
        beside: list[str] = []  # the thread of each decode-only window while the long prompt waits

        def traced(tokens, states):  # type: ignore[no-untyped-def]
            if long.state is RequestState.ADMITTING and len(tokens) == 1:
                beside.append(threading.current_thread().name.split("_")[0])
            return forward(tokens, states)

        eng.model.forward_batch = traced  # type: ignore[method-assign]
        sch = Scheduler(eng, parallel=2)  # type: ignore[arg-type]
        sch.pacer = _Owing()  # type: ignore[assignment]
        sch.start()
        runner, long = make([3, 4, 5], 60), make(list(range(1, 40)) * 2, 4)
        sch.submit(runner)
        while runner.state is not RequestState.SOLO:
            await asyncio.sleep(0)
        sch.submit(long)
        (tr, _), (tl, _) = await asyncio.gather(drain(runner), drain(long))
        sch.stop()
        assert tr == solo([3, 4, 5], 60) and tl == solo(list(range(1, 40)) * 2, 4)
        assert len(beside) >= 3 * (78 // 16) and set(beside) == {"strata-ahead"}  # 3 owed after each chunk

    run(go())


def test_a_last_prompt_token_does_not_wait_for_owed_windows() -> None:
    """One prompt token left costs what a decode row costs (the window stays a decode step): it joins the next
    window, even while the streams are owed decode-only windows, and pays one of them back."""

    async def go() -> list[list[int]]:
        eng = FakeEngine()
        eng.options.prefill_chunk = 1000
        sch = Scheduler(eng, parallel=2)  # type: ignore[arg-type]
        sch.pacer = _Owing()  # type: ignore[assignment]
        sch.start()
        runner, late = make([3, 4, 5], 40), make(list(range(1, 18)), 2)  # 17 tokens: 16, then 1
        sch.submit(runner)
        while runner.state is not RequestState.SOLO:
            await asyncio.sleep(0)
        sch.submit(late)
        (tr, _), (tl, _) = await asyncio.gather(drain(runner), drain(late))
        sch.stop()
        assert tr == solo([3, 4, 5], 40) and tl == solo(list(range(1, 18)), 2)
        return eng.model.windows

    windows = run(go())
    i = windows.index([1, 16])
    assert windows[i + 1] == [1, 1]


def test_a_failing_pipelined_step_fails_its_requests_only() -> None:
    async def go() -> None:
        eng = FakeEngine()
        forward = eng.model.forward_batch
        calls = {"decode": 0}

        def flaky(tokens, states):  # type: ignore[no-untyped-def]
            if all(len(t) == 1 for t in tokens):
                calls["decode"] += 1
                if calls["decode"] == 4:
                    raise RuntimeError("the device fell over")
            return forward(tokens, states)

        eng.model.forward_batch = flaky  # type: ignore[method-assign]
        sch = Scheduler(eng, parallel=2)  # type: ignore[arg-type]
        sch.start()
        a, b = make(PROMPTS[0], 30), make(PROMPTS[2], 30)
        sch.submit(a)
        sch.submit(b)
        (_, ea), (_, eb) = await asyncio.gather(drain(a), drain(b))
        later = make(PROMPTS[3], 5)
        sch.submit(later)
        toks, done = await drain(later)
        sch.stop()
        assert isinstance(ea, ErrorEvent) and "fell over" in ea.reason
        assert isinstance(eb, ErrorEvent) and sch.epoch == 1
        assert toks == solo(PROMPTS[3], 5) and isinstance(done, DoneEvent)

    run(go())

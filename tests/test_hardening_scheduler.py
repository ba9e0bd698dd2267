"""Issue 13, item 1 and 5: the scheduler loop survives errors in one request, the watchdog sees a
stalled loop, and the queue limit counts only requests without a slot. On fabricated model
outputs (tests/sched_fakes.py): no model, no HTTP."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from llguidance import LLMatcher
from sched_fakes import PROMPTS, FakeEngine, drain, make, run, solo

from strata.constraints.schema import Grammar, grammar_text
from strata.constraints.vocab import byte_vocab
from strata.runtime.finish import FinishReason
from strata.runtime.sequence import ActiveSequence
from strata.sched.request import DoneEvent, ErrorEvent, Request
from strata.sched.scheduler import QueueFullError, Scheduler, ShuttingDownError


def _failed_grammar() -> Grammar:
    """A grammar whose matcher already refused a byte: its constraint cannot start."""
    text = grammar_text({"type": "integer"})
    matcher = LLMatcher(byte_vocab(), text, log_level=0)
    matcher.consume_token(ord("x"))
    return Grammar(text, matcher, byte_vocab().vocab_size)


def test_a_request_that_cannot_be_admitted_fails_alone_and_the_loop_serves_the_next() -> None:
    async def go() -> None:
        sch = Scheduler(FakeEngine(), parallel=2)  # type: ignore[arg-type]
        sch.start()
        bad = make(PROMPTS[0], 4)
        bad.grammar = _failed_grammar()
        good = make(PROMPTS[2], 4)
        sch.submit(bad)
        sch.submit(good)
        (_, e_bad), (toks, e_good) = await asyncio.gather(drain(bad), drain(good))
        assert isinstance(e_bad, ErrorEvent) and "ConstraintError" in e_bad.reason
        assert bad.finish is FinishReason.ERROR
        assert isinstance(e_good, DoneEvent) and toks == solo(PROMPTS[2], 4)
        assert sch.stalled() is None and sch.busy_slots == 0
        sch.stop()

    run(go())


def test_a_request_whose_commit_raises_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    poison = [9, 9, 9]
    real = ActiveSequence.accept

    def accept(self: ActiveSequence, logits: np.ndarray):  # type: ignore[no-untyped-def]
        if self.prompt == poison and self.result.tokens:
            raise IndexError("index 0 is out of bounds for axis 0 with size 0")  # the sampler crash
        return real(self, logits)

    monkeypatch.setattr(ActiveSequence, "accept", accept)

    async def go() -> None:
        # plain windows: every token goes through accept (the pipeline's draws through accept_token)
        sch = Scheduler(FakeEngine(), parallel=4, decode_ahead=False)  # type: ignore[arg-type]
        sch.start()
        reqs = [make(PROMPTS[0], 6), make(poison, 6), make(PROMPTS[3], 6)]
        for r in reqs:
            sch.submit(r)
        results = await asyncio.gather(*(drain(r) for r in reqs))
        assert isinstance(results[1][1], ErrorEvent) and "IndexError" in results[1][1].reason
        assert results[0] == (solo(PROMPTS[0], 6), results[0][1]) and isinstance(results[0][1], DoneEvent)
        assert results[2][0] == solo(PROMPTS[3], 6)
        late = make(PROMPTS[4], 3)  # the loop is still alive afterwards
        sch.submit(late)
        toks, done = await drain(late)
        assert isinstance(done, DoneEvent) and toks == solo(PROMPTS[4], 3)
        assert sch.counters.requests_failed == 1 and sch.busy_slots == 0
        sch.stop()

    run(go())


def test_an_error_anywhere_in_a_step_fails_in_flight_requests_not_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def go() -> None:
        sch = Scheduler(FakeEngine(), parallel=2)  # type: ignore[arg-type]
        real_plan, calls = sch._plan, [0]

        def plan():  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("a bug in planning")
            return real_plan()

        monkeypatch.setattr(sch, "_plan", plan)
        sch.start()
        a = make(PROMPTS[1], 5)
        sch.submit(a)
        _, ev = await drain(a)
        assert isinstance(ev, ErrorEvent) and "a bug in planning" in ev.reason
        b = make(PROMPTS[2], 3)
        sch.submit(b)
        toks, done = await drain(b)
        assert isinstance(done, DoneEvent) and toks == solo(PROMPTS[2], 3)
        assert sch.stalled() is None
        sch.stop()

    run(go())


def test_watchdog_reports_a_loop_that_makes_no_progress_while_work_waits() -> None:
    async def go() -> None:
        eng = FakeEngine()
        gate = threading.Event()
        real = eng.model.forward_batch

        def slow_forward(tokens, states):  # type: ignore[no-untyped-def]
            gate.wait(10)  # a hung engine step
            return real(tokens, states)

        eng.model.forward_batch = slow_forward  # type: ignore[method-assign]
        sch = Scheduler(eng, parallel=1, watchdog_s=0.2)  # type: ignore[arg-type]
        sch.start()
        await asyncio.sleep(0.3)
        assert sch.stalled() is None  # idle for longer than watchdog_s is healthy
        req = make(PROMPTS[0], 2)
        sch.submit(req)
        assert sch.stalled() is None
        await asyncio.sleep(0.4)
        reason = sch.stalled()
        assert reason is not None and "no progress" in reason
        gate.set()
        _, done = await drain(req)
        assert isinstance(done, DoneEvent) and sch.stalled() is None
        sch.stop()
        await asyncio.sleep(0)
        assert "stopped" in (sch.stalled() or "")

    run(go())


def test_watchdog_reports_a_dead_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        sch = Scheduler(FakeEngine(), parallel=1)  # type: ignore[arg-type]

        async def die() -> None:
            raise SystemError("the loop itself died")

        monkeypatch.setattr(sch, "_run", die)
        sch.start()
        await asyncio.sleep(0.01)
        assert "SystemError" in (sch.stalled() or "")

    run(go())


def test_queue_limit_counts_only_requests_without_a_slot() -> None:
    """The issue's burst: --parallel 4 --queue-limit 8 took 9 of 32 (prefill waiters counted as queued)."""

    async def go() -> None:
        sch = Scheduler(FakeEngine(), parallel=4, queue_limit=8)  # type: ignore[arg-type]
        accepted: list[Request] = []
        refused = 0
        for i in range(32):
            r = make(PROMPTS[i % len(PROMPTS)], 3)
            try:
                sch.submit(r)
                accepted.append(r)
            except QueueFullError:
                refused += 1
        assert (len(accepted), refused, sch.queue_depth) == (12, 20, 8)
        sch.start()
        done = await asyncio.gather(*(drain(r) for r in accepted))
        assert all(isinstance(ev, DoneEvent) for _, ev in done)
        sch.stop()

    run(go())


def test_draining_refuses_new_requests() -> None:
    sch = Scheduler(FakeEngine(), parallel=1)  # type: ignore[arg-type]
    sch.draining = True
    with pytest.raises(ShuttingDownError):
        sch.submit(make(PROMPTS[0], 1))

"""The scheduler's decode windows through the pipeline (sched/ahead.py): a window of every running stream is
launched before the host takes the last one's tokens, and drained (its last launch's tokens taken) before the
set of sequences changes. Part of Scheduler (sched/scheduler.py), apart so each file stays one job."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from strata.sched.ahead import Ahead
from strata.sched.metrics import Metrics
from strata.sched.pacer import PrefillPacer
from strata.sched.request import RequestState
from strata.sched.slots import Counters, Slot

log = logging.getLogger("strata.scheduler")


def describe(e: BaseException) -> str:
    """An error's text for a failed request's reason."""
    return f"{type(e).__name__}: {e}"[:500]  # a RecursionError's or a numpy error's text can be long


class PipelinedWindows:
    """Scheduler's pipelined decode windows."""

    _slots: list[Slot]
    _live: list[Slot] | None
    _ahead: Ahead
    _pool: ThreadPoolExecutor
    _decode_mark: float | None
    decode_ahead: bool
    epoch: int
    counters: Counters
    metrics: Metrics
    pacer: PrefillPacer

    async def _in_engine(self, fn):  # type: ignore[no-untyped-def]
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _cadence(self, seconds: float) -> float:
        """The streams' time per token at a decode-only window that took `seconds`: the time since the last
        one's tokens when it came straight before (the host's share of each token included)."""
        now = time.perf_counter()
        mark, self._decode_mark = self._decode_mark, now
        return now - mark if mark is not None else seconds

    def _may_continue(self) -> bool:
        """The pipeline's next launch would serve the same slots: nobody left, nobody waits for a slot, and a
        newcomer's prompt, if any, still sits out (the streams are owed decode-only windows)."""
        live = self._live
        assert live is not None
        return (
            live == self._decoding()
            and not any(s.req.cancelled for s in self._slots)
            and self._next_admission() is None
            and not self._prompt_due()
        )

    def _prompt_due(self) -> bool:
        """Whether the next window reads prompt tokens: the streams are owed no decode-only window, or every
        prompt being read has one token left, which rides along as a decode row does."""
        reading = self._reading()
        return bool(reading) and (self.pacer.owed == 0 or all(s.prompt_left == 1 for s in reading))

    def _pipelined(self, window: list[tuple[Slot, np.ndarray]]) -> bool:
        ahead = self._ahead
        return (
            self.decode_ahead
            and 0 < len(window) == len(self._decoding()) <= ahead.max_batch
            and all(
                s.req.state is not RequestState.ADMITTING
                and not s.seq.constraints
                and ahead.drawable(s.seq.params)
                for s, _ in window
            )
        )

    async def _ahead_window(self, window: list[tuple[Slot, np.ndarray]]) -> None:
        slots = [s for s, _ in window]
        epoch = self.epoch
        t0 = time.perf_counter()
        if self._live is None:
            tokens = [int(t[0]) for _, t in window]
            draws = [(s.seq.params, s.seq.seed) for s in slots]

            def first() -> np.ndarray:
                self._ahead.start([s.seq.state for s in slots], tokens, draws)
                return self._ahead.advance()

            step = first
        else:
            step = self._ahead.advance
        self._live = slots
        try:
            chosen = await self._in_engine(step)
        except Exception as e:
            self._window_failed(window, e)
            return
        if epoch != self.epoch:
            return
        seconds = time.perf_counter() - t0
        self.counters.add_window(seconds, 0, len(slots))
        self.metrics.window_done(seconds, 0)
        self.pacer.observe(self._cadence(seconds), 0)
        ended = self._take_tokens(slots, chosen)
        if ended or not self._may_continue():
            await self._drain()
        for slot in ended:
            self._finish(slot)

    def _take_tokens(self, slots: list[Slot], chosen: np.ndarray) -> list[Slot]:
        """Each slot's token from the pipeline; returns the slots it ended (not finished yet: the pipeline may
        still be writing their states)."""
        ended = []
        for slot, tok in zip(slots, chosen):
            if slot not in self._slots or slot.seq.finished:
                continue
            try:
                self._emit(slot, slot.seq.accept_token(int(tok)))
            except Exception as e:  # detokenizing this request failed: it alone ends
                log.exception("committing request %d failed", slot.req.id)
                self._slots.remove(slot)
                self._fail_request(slot.req, describe(e))
                continue
            if slot.seq.finished:
                ended.append(slot)
        return ended

    async def _drain(self) -> None:
        """Take the pipeline's launch in flight: its tokens go to the slots still running."""
        slots, self._live = self._live, None
        assert slots is not None
        epoch = self.epoch
        try:
            chosen = await self._in_engine(self._ahead.drain)
        except Exception as e:
            self._window_failed([(s, None) for s in slots], e)
            return
        if epoch != self.epoch:
            return
        for slot in self._take_tokens(slots, chosen):
            self._finish(slot)

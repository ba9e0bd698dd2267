"""The window scheduler: one asyncio task plans a window, awaits its forward pass, commits it.

A window is one engine step for every active request: one decode token per running slot plus a
chunk of the newcomers' prompts. Newcomers are admitted one at a time, or several together while
their prompts fit one chunk: requests that arrive together (a burst, or the queue when slots free
up) then pay one prompt window, not one each (on the H200 an eager pass costs ~36 ms however few
tokens it reads, and each admission also waited for the decode windows the pacer owed the streams).
The forward pass runs in the engine thread as an awaited future, so the loop keeps serving HTTP,
and the model sees every slot at once: dense weights are read once per window and MoE tokens are
grouped across slots.

A request that runs alone is SOLO; when others join it becomes BATCHED in place: its
SequenceState moves with it, so no prompt is ever re-read. A window that raises fails only the
requests in it (each gets the reason), bumps the epoch, and the queue carries on.

Decode-only windows run through a pipeline (sched/ahead.py; the windows' side in sched/pipeline.py): the next
step is queued before the host takes the last one's tokens, so sampling, detokenising and SSE never leave the
model idle. The decode-only windows the pacer gives running streams while a newcomer's prompt waits are
pipelined too (on the H200 those windows took 11.3 ms with host sampling, against 7.2 ms pipelined, and the
streams kept 35% of their pace instead of half). It is drained (its last step's tokens taken) before the set
of sequences changes: a request ends or leaves, another is admitted, a prompt chunk is due, or the server
stops.

The loop cannot die on a request: an error while admitting or committing one request fails that
request alone (slot freed, an ErrorEvent with the reason) and any other error inside a step fails
the requests in flight, never the loop. `stalled()` is the watchdog /health reads: it reports the
loop when it stopped, or when work is waiting and no step has finished for `watchdog_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from strata.engine import Engine
from strata.gpu.runtime import lost_context
from strata.runtime.finish import FinishReason
from strata.runtime.passes import pass_rows
from strata.runtime.sequence import ActiveSequence, Chunk
from strata.sched.ahead import Ahead, HostAhead
from strata.sched.constraints import request_constraints
from strata.sched.faults import FaultHook
from strata.sched.metrics import Metrics
from strata.sched.pacer import PrefillPacer, calibration_sizes
from strata.sched.pipeline import PipelinedWindows, describe
from strata.sched.prefix_cache import PrefixCache
from strata.sched.request import DoneEvent, ErrorEvent, Request, RequestState, TokenEvent
from strata.sched.slots import Counters, DeviceLostError, QueueFullError, ShuttingDownError, Slot
from strata.sched.snapshots import Snapshots
from strata.tiers.telemetry import hit_rate_line, note

__all__ = ["QueueFullError", "Scheduler", "ShuttingDownError"]

log = logging.getLogger("strata.scheduler")


class Scheduler(PipelinedWindows):
    def __init__(
        self,
        engine: Engine,
        parallel: int = 4,
        queue_limit: int = 0,
        prefix_cache: PrefixCache | None = None,
        watchdog_s: float = 60.0,
        decode_ahead: bool = True,
    ) -> None:
        self.engine = engine
        self.parallel = parallel
        self.queue_limit = queue_limit
        self.watchdog_s = watchdog_s
        self.draining = False  # SIGTERM: finish what is in flight, admit nothing new
        self.device_lost: str | None = None  # a sticky CUDA error's reason: nothing can run until a restart
        self.heartbeat = time.monotonic()  # when the loop last finished a step
        self.prefix_cache = prefix_cache
        self._snapshots = Snapshots(prefix_cache) if prefix_cache is not None else None
        self.counters = Counters()
        self.metrics = Metrics(self)
        self.epoch = 0
        self.faults = FaultHook()  # test hook (--test-hooks): windows to fail on purpose
        self.pacer = PrefillPacer()
        self._queue: deque[Request] = deque()
        self._slots: list[Slot] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="strata-engine")
        # grammar masks for the next token, computed while the engine thread runs the next window
        self._masks = ThreadPoolExecutor(1, thread_name_prefix="strata-mask")
        # the model's own pipeline (the GPU's draws inside the decode graph) or the host's, for any model
        make = getattr(engine.model, "decode_ahead", None)
        self._ahead: Ahead = (make() if make is not None else None) or HostAhead(engine.model, parallel)
        # False: every window waits for the host's work on the last (--decode-ahead off)
        self.decode_ahead = decode_ahead
        self._live: list[Slot] | None = None  # the slots of the pipeline's launch in flight
        self._reset_due = False  # a failed window left the pipeline with launches to drop
        self._decode_mark: float | None = None  # when the last decode-only window's tokens came (pacer)

    def calibrate(self) -> None:
        """Before serving (on the warm-up's thread): the pacer's cost model from prompt passes timed alone."""
        sizes = calibration_sizes(self.engine.options.prefill_chunk, self.engine.n_ctx)
        if sizes is not None:
            self.pacer.calibrate(self.engine.prefill_costs(sizes))

    # ---- public, on the loop ----------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="strata-scheduler")

    def stop(self) -> None:
        for r in [*self._queue, *(s.req for s in self._slots)]:
            r.cancel()
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._masks.shutdown(wait=False, cancel_futures=True)
        if self._snapshots is not None:
            self._snapshots.close()

    def abort(self, reason: str) -> None:
        """Fail every queued and running request with `reason` (shutdown after its grace period)."""
        while self._queue:
            self._fail_request(self._queue.popleft(), reason)
        self._fail_window([(s, None) for s in self._slots], reason)

    def submit(self, req: Request) -> None:
        """Queue a request (FIFO); raises QueueFullError when --queue-limit requests are already
        waiting without a slot, ShuttingDownError once draining, DeviceLostError once the GPU is lost."""
        if self.draining:
            raise ShuttingDownError("the server is shutting down")
        if self.device_lost is not None:
            raise DeviceLostError(self.device_lost)
        if self.queue_limit and self.queue_depth >= self.queue_limit:
            self._queue = deque(r for r in self._queue if not r.cancelled)  # clients that left free room
            if self.queue_depth >= self.queue_limit:
                raise QueueFullError(self.queue_limit, retry_after=max(1, self.queue_depth))
        if not self.in_flight:
            self.heartbeat = time.monotonic()  # the loop was idle until now, which is not a stall
        req.submitted = time.perf_counter()
        self._queue.append(req)
        self._wake.set()

    @property
    def queue_depth(self) -> int:
        """Requests that would not hold a slot even if every free slot took one now. Requests waiting
        for their turn to prefill while slots are free are not queued: they have a slot to go to."""
        return max(0, len(self._queue) - (self.parallel - len(self._slots)))

    @property
    def in_flight(self) -> int:
        return len(self._queue) + len(self._slots)

    def stalled(self) -> str | None:
        """Why the loop is unhealthy, or None: it has stopped, its GPU is lost, or work waits and no step
        finished."""
        if self.device_lost is not None:
            return self.device_lost
        if self._task is not None and self._task.done():
            exc = None if self._task.cancelled() else self._task.exception()
            return f"the scheduler loop stopped ({type(exc).__name__ if exc else 'cancelled'})"
        idle = time.monotonic() - self.heartbeat
        if self.in_flight and idle > self.watchdog_s:
            return f"the scheduler made no progress for {idle:.0f} s with {self.in_flight} requests waiting"
        return None

    @property
    def busy_slots(self) -> int:
        return len(self._slots)

    # ---- the loop -----------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self.heartbeat = time.monotonic()
            try:
                await self._step()
            except Exception as e:  # a bug in a step: fail what is in flight, keep the loop
                log.exception("scheduler step failed; failing %d in-flight requests", len(self._slots))
                self._window_failed([(s, None) for s in self._slots], e)
                await asyncio.sleep(0)  # never a hot loop that starves the HTTP side

    async def _step(self) -> None:
        if self._reset_due:
            self._reset_due = False
            await self._in_engine(self._ahead.reset)
        if self._live is not None and not self._may_continue():
            await self._drain()
        self._reap_cancelled()
        self._admit()
        if not self._slots:
            self._wake.clear()
            copies = self._copies_for_next()
            await (asyncio.wait(copies) if copies else self._wake.wait())
            return
        window = self._plan()
        if not window:  # every slot is a prompt waiting for its checkpoint's copy
            await asyncio.wait([s.copy for s in self._slots if s.copy is not None and s.copying])
            return
        if self._live is not None or self._pipelined(window):
            await self._ahead_window(window)
            return
        epoch = self.epoch
        t0 = time.perf_counter()
        try:
            logits = await asyncio.get_running_loop().run_in_executor(self._pool, self._forward, window)
        except Exception as e:  # the window failed: fail its requests, keep serving the rest
            self._window_failed(window, e)
            return
        if epoch == self.epoch:  # results of a failed epoch are never applied
            self._commit(window, logits, time.perf_counter() - t0)

    # ---- the slots by state --------------------------------------------------------------------
    def _decoding(self) -> list[Slot]:
        return [s for s in self._slots if s.req.state is not RequestState.ADMITTING]

    def _admitting(self) -> list[Slot]:
        return [s for s in self._slots if s.req.state is RequestState.ADMITTING]

    def _reading(self) -> list[Slot]:
        """The newcomers that may read their prompts in the next window: none waits for a copy."""
        return [s for s in self._admitting() if not s.copying]

    def _forward(self, window: list[tuple[Slot, np.ndarray]]) -> list[np.ndarray]:
        self.faults.check()
        if len(window) == 1 and window[0][0].marks:  # checkpoints inside a lone prompt's wide pass
            slot, tokens = window[0]
            marks, slot.marks = slot.marks, []  # this window's: the slot's next window plans its own
            logits, slot.kept = self.engine.model.forward_marked(tokens, slot.seq.state, marks)
            return [logits]
        return self.engine.model.forward_batch([t for _, t in window], [s.seq.state for s, _ in window])

    def _next_admission(self) -> Request | None:
        """The queued request `_admit` would take now: a slot is free, and no prompt is being read, or the
        prompts being read and this one fit one chunk together, and no snapshot still being copied could
        serve it (clients that left are dropped)."""
        while self._queue and self._queue[0].cancelled:
            self._queue.popleft()
        if not self._queue or len(self._slots) >= self.parallel:
            return None
        req = self._queue[0]
        left = sum(s.prompt_left for s in self._admitting())
        if left and left + len(req.prompt_ids) > self.engine.options.prefill_chunk:
            return None
        return None if self._copies_for_next() else req

    def _copies_for_next(self) -> list[asyncio.Future[Any]]:
        """The snapshots being copied that could serve the next request in the queue: it waits for them."""
        if self._snapshots is None or not self._queue:
            return []
        return self._snapshots.serving(self._queue[0].prompt_ids)

    def _admit(self) -> None:
        """Take queued requests into free slots, while `_next_admission` allows."""
        if self._snapshots is not None:
            self._snapshots.settle()
        while (req := self._next_admission()) is not None:
            self._queue.popleft()
            try:
                slot = self._new_slot(req)
            except Exception as e:  # this request cannot start (a bad schema, ...): it alone fails
                log.exception("admitting request %d failed", req.id)
                self._fail_request(req, describe(e))
                continue
            req.state = RequestState.ADMITTING
            self._slots.append(slot)
            self.metrics.admitted(req)

    def _new_slot(self, req: Request) -> Slot:
        state = self.engine.new_state()
        cached = self.prefix_cache.lookup(req.prompt_ids, state) if self.prefix_cache else 0
        seq = ActiveSequence(
            self.engine.tokenizer,
            state,
            req.prompt_ids,
            params=req.params,
            seed=req.seed,
            max_tokens=req.max_tokens,
            stop=req.stop,
            ignore_eos=req.ignore_eos,
            constraints=request_constraints(req, self.engine.tokenizer, self._masks),
            tiered=self.engine.expert_cache is not None,
        )
        return Slot(req, seq, cached)

    def _plan(self) -> list[tuple[Slot, np.ndarray]]:
        running = RequestState.SOLO if len(self._slots) == 1 else RequestState.BATCHED
        share = self._prompt_share(beside_streams=bool(self._decoding()))
        window = []
        for s in self._slots:
            if s.req.state is RequestState.ADMITTING:
                if share.get(s):  # 0: the streams are owed a decode-only window; none: it is copying
                    window.append((s, s.seq.next_input(share[s])))
            else:
                s.req.state = running
                window.append((s, s.seq.next_input(1)))
        return window

    def _prompt_share(self, beside_streams: bool) -> dict[Slot, int]:
        """Prompt tokens each newcomer feeds in the next window: the pacer's chunk beside running streams (a
        full chunk without them, the engine's widest pass for a prompt read alone), shared out in the order
        they came."""
        admitting = self._reading()
        left = [s.prompt_left for s in admitting]
        alone = len(admitting) == 1 and not self._decoding()
        rows = self.engine.prompt_rows if alone else self.engine.options.prefill_chunk
        # a hybrid prompt read in a wide pass has its spaced checkpoints taken inside the pass
        inside = rows > self.engine.options.prefill_chunk
        # the chunk, or the whole rest where it is a few tokens past it (passes.PASS_SLACK)
        full = pass_rows(sum(left), rows, len(self._decoding()))
        # a last prompt token costs what a decode row does (it is one): it never waits for owed windows
        paced = beside_streams and any(n > 1 for n in left)
        budget = self.pacer.chunk(full, sum(left)) if paced else full
        share = {}
        for s, n in zip(admitting, left):
            n = min(n, budget)
            s.marks = []
            if self.prefix_cache is not None:  # a hybrid model's chunk ends where its state is kept
                st, cache, end = s.seq.state, self.prefix_cache, len(s.seq.prompt)
                n = min(n, cache.next_stop(st, end, s.req.turn_end, spaced=not inside) - st.n_past)
                if inside:
                    s.marks = cache.marks(st, st.n_past + n, end, s.req.turn_end)
            share[s], budget = n, budget - n
        return share

    def _commit(
        self, window: list[tuple[Slot, np.ndarray]], logits: list[np.ndarray], seconds: float
    ) -> None:
        n_prefill = sum(len(t) for s, t in window if s.req.state is RequestState.ADMITTING)
        self.counters.add_window(seconds, n_prefill, len(window))
        self.metrics.window_done(seconds, n_prefill)
        # a prompt read beside streams, or alone (large ones still teach the per-token cost); single tokens,
        # of prompts or not, run as a decode step does
        if n_prefill and any(len(t) > 1 for _, t in window):
            streams = any(s.req.state is not RequestState.ADMITTING for s, _ in window)
            self.pacer.observe(seconds, n_prefill, streams=streams)
            self._decode_mark = None
        elif window:
            self.pacer.observe(self._cadence(seconds), 0)
        if n_prefill:
            log.debug(
                "window: %d rows, %d prompt tokens, %.1f ms; pacer fit %s, decode %s, owed %d",
                len(window),
                n_prefill,
                seconds * 1e3,
                self.pacer.cost(),
                self.pacer.decode_s,
                self.pacer.owed,
            )
        for (slot, _), row in zip(window, logits):
            try:
                self._commit_one(slot, row)
            except Exception as e:  # sampling or detokenizing this request failed: it alone ends
                log.exception("committing request %d failed", slot.req.id)
                self._slots.remove(slot)
                self._fail_request(slot.req, describe(e))

    def _commit_one(self, slot: Slot, row: np.ndarray) -> None:
        req, seq = slot.req, slot.seq
        if req.state is RequestState.ADMITTING and self._snapshots is not None:
            # the checkpoints its pass took inside, then the one it ends at: it sits out until they are copied
            copies = [self._snapshots.take(seq.state, at) for at in slot.kept]
            if self._snapshots.cache.wants(seq.state, len(seq.prompt), req.turn_end):
                copies.append(self._snapshots.take(seq.state))
            if copies:
                slot.copy = copies[0] if len(copies) == 1 else asyncio.gather(*copies)
        slot.kept = []
        self._emit(slot, seq.accept(row))
        if req.state is RequestState.ADMITTING and seq.state.n_past >= len(seq.prompt):
            req.state = RequestState.SOLO
        if seq.finished:
            self._finish(slot)

    def _emit(self, slot: Slot, chunks: list[Chunk]) -> None:
        """A window's text for the slot's stream; a sampled token in it counts for the latency histograms."""
        for chunk in chunks:
            slot.req.events.put_nowait(TokenEvent(chunk.token, chunk.text))
        if any(c.token is not None for c in chunks):
            self.metrics.token(slot)

    def _finish(self, slot: Slot) -> None:
        req, r = slot.req, slot.seq.result
        reason = r.finish_reason
        req.state, req.finish = RequestState.FINISHED, reason
        self._slots.remove(slot)
        self.counters.finished(r, reason)
        cache = self.engine.expert_cache
        if cache is not None and r.timings.experts is not None:  # the seeds' line, per request
            note(hit_rate_line(r.timings.experts.decode))
        if self._snapshots is not None and reason is not FinishReason.CANCELLED:
            self._snapshots.take(slot.seq.state)
        req.events.put_nowait(
            DoneEvent(
                reason, r.stop_string, len(req.prompt_ids), slot.cached, len(r.tokens), r.timings.to_dict()
            )
        )

    def _reap_cancelled(self) -> None:
        for slot in [s for s in self._slots if s.req.cancelled]:
            slot.seq.cancel()
            self._finish(slot)

    def _window_failed(self, window: list[tuple[Slot, np.ndarray | None]], e: Exception) -> None:
        """A window (or a step) raised: its requests fail with the reason. A sticky CUDA error fails every
        request in flight or queued too and marks the device lost (/health 503, new requests refused): every
        later window would fail the same way until the process restarts."""
        lost = lost_context(e)
        if lost is not None and self.device_lost is None:
            self.device_lost = f"the GPU's context is lost ({lost}): restart the server"
            log.error("%s", self.device_lost)
        self._fail_window(window, describe(e))
        if self.device_lost is not None:
            self._fail_window([(s, None) for s in self._slots], self.device_lost)
            while self._queue:
                self._fail_request(self._queue.popleft(), self.device_lost)

    def _fail_window(self, window: list[tuple[Slot, np.ndarray | None]], reason: str) -> None:
        """Every request in the failed window ends with the reason; their states are discarded."""
        self.epoch += 1
        if self._live is not None:  # its launches are dropped before the next window
            self._live, self._reset_due = None, True
        for slot, _ in window:
            if slot in self._slots:
                self._slots.remove(slot)
            self._fail_request(slot.req, reason)

    def _fail_request(self, req: Request, reason: str) -> None:
        req.state, req.finish = RequestState.FINISHED, FinishReason.ERROR
        req.events.put_nowait(ErrorEvent(reason))
        self.counters.ended(FinishReason.ERROR)

"""The scheduler: admission, a FIFO queue, and the engine thread that runs requests.

The asyncio loop never runs model code. Requests are handed to one engine thread; every token it
produces comes back to the loop with call_soon_threadsafe into the request's own queue, so HTTP
keeps being served while the model computes. Cancellation (a client disconnect) is a flag the
engine thread reads before each token, so a departed client costs at most one more token.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass

from strata.sched.request import DoneEvent, ErrorEvent, Event, FinishReason, Request, RequestState, TokenEvent
from strata.constrain import JsonConstraint
from strata.engine import Engine
from strata.errors import StrataError


class QueueFullError(StrataError):
    """Every slot is busy and the queue is at --queue-limit."""

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(f"server busy: {limit} requests already queued")
        self.retry_after = retry_after


@dataclass(slots=True)
class Counters:
    """Monotonic totals for /metrics."""

    requests: int = 0
    requests_failed: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0


class Scheduler:
    def __init__(self, engine: Engine, parallel: int = 4, queue_limit: int = 0) -> None:
        self.engine = engine
        self.parallel = parallel
        self.queue_limit = queue_limit
        self.counters = Counters()
        self._queue: deque[Request] = deque()
        self._running: list[Request] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- loop side ------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="strata-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            for r in [*self._queue, *self._running]:
                r.cancel()
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, req: Request) -> None:
        """Queue a request; raises QueueFullError when --queue-limit is reached."""
        with self._wake:
            if self.queue_limit and len(self._queue) >= self.queue_limit:
                raise QueueFullError(self.queue_limit, retry_after=max(1, len(self._queue)))
            self._queue.append(req)
            self._wake.notify()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def busy_slots(self) -> int:
        return len(self._running)

    # ---- engine thread --------------------------------------------------------------------
    def _emit(self, req: Request, ev: Event) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(req.events.put_nowait, ev)

    def _next(self) -> Request | None:
        with self._wake:
            while not self._queue and not self._stopping:
                self._wake.wait()
            if self._stopping:
                return None
            req = self._queue.popleft()
            self._running.append(req)
            return req

    def _run(self) -> None:
        while (req := self._next()) is not None:
            try:
                if not req.cancelled:
                    self._serve(req)
            except Exception as e:  # a failed request must not take the engine thread down
                self.counters.requests_failed += 1
                req.state, req.finish = RequestState.FINISHED, FinishReason.ERROR
                self._emit(req, ErrorEvent(f"{type(e).__name__}: {e}"))
            finally:
                with self._wake:
                    self._running.remove(req)

    def _serve(self, req: Request) -> None:
        req.state = RequestState.ADMITTING
        constraint = JsonConstraint(self.engine.tokenizer, req.json_seed) if req.json_mode else None
        gen = self.engine.generate(req.prompt_ids, max_tokens=req.max_tokens, params=req.params,
                                   stop=req.stop, ignore_eos=req.ignore_eos, constraint=constraint)
        req.state = RequestState.SOLO
        reason = FinishReason.LENGTH
        t0 = time.perf_counter()
        for chunk in gen:
            self._emit(req, TokenEvent(chunk.token, chunk.text))
            if req.cancelled:
                reason = FinishReason.CANCELLED
                break
        r = gen.result
        if reason is not FinishReason.CANCELLED and r.finish_reason == "stop":
            reason = FinishReason.STOP_STRING if r.stop_string is not None else FinishReason.EOS
        req.state, req.finish = RequestState.FINISHED, reason
        c = self.counters
        c.requests += 1
        c.prompt_tokens += r.timings.prompt_n
        c.generated_tokens += len(r.tokens)
        c.prompt_seconds += r.timings.prompt_ms / 1000
        c.decode_seconds += max(0.0, time.perf_counter() - t0 - r.timings.prompt_ms / 1000)
        self._emit(req, DoneEvent(reason, r.stop_string, len(req.prompt_ids), 0, len(r.tokens),
                                  r.timings.to_dict()))

"""A newcomer's prompt read on the engine's second lane while the running streams keep their decode windows.

Beside running streams the scheduler otherwise takes turns: a window reads a chunk of the prompt (the streams
wait for it), then the pacer owes the streams decode-only windows. The two shares then add up to one: on the
H100 at 24 GiB a 4k prompt beside three streams read at 37% of the engine's prefill rate while the streams
kept 55% of their pace. A decode step, though, leaves most of the GPU's SMs idle (a few rows against every
layer's weights), and a prompt pass fills them: where the model has a second lane (GpuModel.read_aside, at
the device's least priority, where a pass shares nothing with the steps but the weights) the prompt is read
there in whole chunks, one pass after another on a thread of its own, while the engine's thread replays the
decode steps at the greatest priority. The prompt's last STEP_ROWS tokens or fewer go back to the windows,
which take them as decode steps; until then the newcomer is in none of them, and a client that leaves is
reaped between its passes.

Part of Scheduler (sched/scheduler.py), apart so each file stays one job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from strata.gpu.runtime import lost_context
from strata.runtime.passes import STEP_ROWS, pass_rows
from strata.sched.metrics import Metrics
from strata.sched.pipeline import describe
from strata.sched.prefix_cache import PrefixCache
from strata.sched.slots import Counters, Slot

log = logging.getLogger("strata.scheduler")


class AsideReads:
    """Scheduler's prompt reads on the model's second lane."""

    _slots: list[Slot]
    _wake: asyncio.Event
    counters: Counters
    metrics: Metrics
    prefix_cache: PrefixCache | None
    engine: Any

    def _init_aside(self, model: Any, on: bool) -> None:
        lane = getattr(model, "aside", None)
        # the model's pass on its second lane, or None: every prompt is read in the windows
        self._read_aside: Callable[[np.ndarray, Any], np.ndarray] | None = (
            model.read_aside if on and lane is not None else None
        )
        self._aside_pool = (
            ThreadPoolExecutor(1, thread_name_prefix="strata-aside") if self._read_aside is not None else None
        )
        self._aside: Slot | None = None  # the newcomer whose prompt is being read aside
        self._aside_task: asyncio.Task[None] | None = None

    def _start_aside(self, reading: list[Slot], streams: bool) -> None:
        """Read the first newcomer's prompt aside, where streams run and it is longer than the decode steps a
        window takes it in (passes.STEP_ROWS)."""
        if self._read_aside is None or self._aside is not None or not streams:
            return
        slot = next((s for s in reading if s.prompt_left > STEP_ROWS), None)
        if slot is not None:
            self._aside = slot
            self._aside_task = asyncio.get_running_loop().create_task(self._aside_passes(slot))

    async def _aside_passes(self, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        read = self._read_aside
        assert read is not None
        try:
            # the last few tokens (a chat prompt's generation prompt after its checkpoint) go back to the
            # windows, which read them as decode steps beside the streams' rows
            while slot in self._slots and not slot.req.cancelled and slot.prompt_left > STEP_ROWS:
                n = pass_rows(slot.prompt_left, self.engine.options.prefill_chunk, 0)
                st = slot.seq.state
                if self.prefix_cache is not None:  # a hybrid model's pass ends where its state is kept
                    stop = self.prefix_cache.next_stop(st, len(slot.seq.prompt), slot.req.turn_end)
                    n = min(n, stop - st.n_past)
                tokens = slot.seq.next_input(n)
                t0 = time.perf_counter()
                row = await loop.run_in_executor(self._aside_pool, read, tokens, st)
                if slot not in self._slots:  # failed or aborted meanwhile: nothing to commit
                    return
                seconds = time.perf_counter() - t0
                self.counters.add_window(seconds, len(tokens), 1)
                self.metrics.window_done(seconds, len(tokens))
                self._commit_one(slot, row)
                if slot.copy is not None and slot.copying:  # the checkpoint's copy: the state waits for it
                    await asyncio.wait([slot.copy])
        except Exception as e:
            self._aside_failed(slot, e)
        finally:
            self._aside = self._aside_task = None
            if slot in self._slots and slot.req.cancelled:
                slot.seq.cancel()
                self._finish(slot)
            self._wake.set()

    def _aside_failed(self, slot: Slot, e: Exception) -> None:
        """A pass on the second lane raised: its request alone fails, unless the GPU is lost (then all do)."""
        if lost_context(e) is not None:
            self._window_failed([(slot, None)], e)
            return
        log.exception("reading request %d's prompt aside failed", slot.req.id)
        if slot in self._slots:
            self._slots.remove(slot)
        self._fail_request(slot.req, describe(e))

    def _stop_aside(self) -> None:
        if self._aside_pool is not None:
            self._aside_pool.shutdown(wait=False, cancel_futures=True)

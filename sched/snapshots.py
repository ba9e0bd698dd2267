"""Prefix-cache snapshots taken off the event loop.

A snapshot copies a state to host RAM: on the 80B shape 75.5 MB of DeltaNet state and 24 KiB of KV a
token, over PCIe, ~10-20 ms a request and more for long prompts. Taken on the loop, that stopped the
HTTP side and, since the loop plans every window, the GPU. They are taken on a worker thread instead,
one at a time, and join the cache on the loop, in the order they were taken, once copied. The state
must not change meanwhile: a finished request's no longer does, and a prompt being read sits out the
windows until its checkpoint is copied (the scheduler sees to both).

A request whose prompt a pending snapshot could serve (the next turn of a conversation, whose
request can come before its last answer's state is copied) waits for it, so it reuses what it would
have reused with the copy made on the loop.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from strata.runtime.state import Checkpoint, SequenceState
from strata.sched.prefix_cache import PrefixCache, reusable


class Snapshots:
    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="strata-snapshot")
        self._pending: list[tuple[asyncio.Future[SequenceState | None], SequenceState]] = []

    def take(
        self, state: SequenceState, at: Checkpoint | None = None
    ) -> asyncio.Future[SequenceState | None]:
        """Copy `state` (as it stood `at` a checkpoint inside its last pass) on the worker (the caller keeps
        it unchanged until the future is done); it joins the cache at a later `settle`."""
        fut = asyncio.get_running_loop().run_in_executor(self._worker, PrefixCache.snapshot, state, at)
        self._pending.append((fut, state))
        return fut

    def settle(self) -> None:
        """Keep the snapshots copied so far, in the order they were taken."""
        while self._pending and self._pending[0][0].done():
            fut, _ = self._pending.pop(0)
            snap = None if fut.cancelled() else fut.result()  # snapshot() reports its own failures
            if snap is not None:
                self.cache.keep(snap)

    def serving(self, prompt: list[int]) -> list[asyncio.Future[SequenceState | None]]:
        """The pending snapshots that could serve `prompt`."""
        want = np.asarray(prompt, dtype=np.int64)
        return [
            f
            for f, st in self._pending
            if not f.done() and reusable(np.asarray(st.tokens, np.int64), bool(st.layers), want)
        ]

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

"""A borrowing prefill chunk on the GPU (strata.tiers.borrow plans it): each layer's missing experts are
copied into borrowed slots on the tiers' copy stream while earlier layers compute; the compute stream
waits for layer l's copy before its experts run, and the copy into a buffer waits for the layer that used
it last (events, no host waits). The chunk's end gives the borrowed slots their own experts back. Copies
run on the copy engines, contiguous runs as one copy each: a gather kernel would have to win SMs from the
GEMMs it is meant to overlap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from strata.gpu.runtime import cupy_module
from strata.gpu.slots import engine_copies
from strata.tiers.borrow import Staging
from strata.tiers.ring import split_rows

if TYPE_CHECKING:
    from strata.gpu.tiers import GpuTiers


class BorrowingPrefill:
    """One chunk at a time (the model's passes run in turn): begin, then before_layer and after_layer around
    each MoE layer's experts, then end."""

    def __init__(self, tiers: GpuTiers) -> None:
        self.tiers = tiers
        self._rows: list[np.ndarray] = []  # each MoE layer's staging copies
        self._staged: list[Any] = []  # events: layer l's copies landed
        self._done: list[Any] = []  # events: layer l's experts launched (its buffer may take the next layer)

    def begin(self) -> Staging | None:
        """Plan a borrowing chunk, put its prefill table on the device and stage the first layers."""
        cp = cupy_module()
        t = self.tiers
        staging = t.cache.staging()
        if staging is None:
            return None
        t.ptab.set(staging.table)
        self._rows = [t.cache.stage_rows(staging, li) for li in range(len(t.layout.layers))]
        self._staged = [cp.cuda.Event(disable_timing=True) for _ in self._rows]
        self._done = [cp.cuda.Event(disable_timing=True) for _ in self._rows]
        start = cp.cuda.Event(disable_timing=True)
        start.record()  # the copies overwrite borrowed slots: not before earlier work that read them
        t.copy_stream.wait_event(start)
        for li in range(min(staging.buffers, len(self._rows))):
            self._stage(li)
        return staging

    def _stage(self, li: int) -> None:
        """Layer li's staging copies on the copy stream."""
        t, rows = self.tiers, self._rows[li]
        if t.ring is not None:  # the low-RAM mode: the mapped-only experts through the bounce ring
            rows, mapped = split_rows(rows, t.slots.ranges)
            t.ring.copy(mapped, t.copy_stream)
        engine_copies(rows, t.layout.strides, t.copy_stream)
        self._staged[li].record(t.copy_stream)

    def before_layer(self, li: int) -> None:
        cupy_module().cuda.get_current_stream().wait_event(self._staged[li])

    def after_layer(self, staging: Staging, li: int) -> None:
        """Layer li's experts have been launched: the buffer it used may take layer li + buffers."""
        self._done[li].record()
        nxt = li + staging.buffers
        if nxt < len(self._rows):
            self.tiers.copy_stream.wait_event(self._done[li])
            self._stage(nxt)

    def end(self, staging: Staging) -> np.ndarray:
        """The chunk is over: borrowed slots get their experts back (on the compute stream). Returns the
        bytes staged, the experts of them from the file's mapping and their bytes [3]."""
        c = self.tiers.cache
        self.tiers.slots.copy_rows(c.restore_rows(staging))
        return sum(
            (c.staged_counts(staging, li, r) for li, r in enumerate(self._rows)),
            np.zeros(3, np.int64),
        )

"""The bounce ring on the GPU (tiers/ring.py says why): pinned buffers, device copies out of them queued on a
given stream with cudaMemcpyAsync, and an event per buffer that the host waits on before it refills it.

The low-RAM mode (`--ram-budget-mib`, tiers/ram.py) sends every copy whose source is only in the file's
mapping through it: the start-up fill of the slots, a borrowing prefill chunk's staging (on the copy stream,
layer by layer, while earlier layers compute) and the borrowed slots' restore. The host memcpy out of the
mapping runs on the thread that launches the pass, so a layer's copies from a cold page cache hold the
launches until they are queued; the GPU keeps running what was queued before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.errors import ConfigError
from strata.gpu.runtime import HOST_TO_DEVICE, cupy_module
from strata.tiers.ring import RING_BUFFERS, BounceRing


class GpuRing:
    def __init__(self, size: int) -> None:
        cp = cupy_module()
        try:
            self._mem = [cp.cuda.alloc_pinned_memory(max(size, 1)) for _ in range(RING_BUFFERS)]
        except (cp.cuda.runtime.CUDARuntimeError, MemoryError) as err:
            raise ConfigError(
                "ram_budget_mib",
                "-",
                f"could not pin the bounce ring's {RING_BUFFERS} x {size / 2**20:,.1f} MiB ({err})",
            ) from err
        self._events: list[Any] = [None] * RING_BUFFERS
        self._stream: Any = None
        self.ring = BounceRing([int(m.ptr) for m in self._mem], size, self._put, self._mark, self._wait)

    @property
    def bytes(self) -> int:
        return self.ring.bytes

    def nbytes(self) -> int:
        return RING_BUFFERS * self.ring.size

    def copy(self, rows: np.ndarray, stream: Any = None) -> None:
        """Queue copies [n, 3] (source in the mapping, destination in VRAM, bytes) on `stream` (default: the
        current one), in order with its other work."""
        if not len(rows):
            return
        self._stream = stream if stream is not None else cupy_module().cuda.get_current_stream()
        self.ring.copy(rows)

    def _put(self, dst: int, src: int, n: int) -> None:
        cupy_module().cuda.runtime.memcpyAsync(dst, src, n, HOST_TO_DEVICE, self._stream.ptr)

    def _mark(self, b: int) -> None:
        ev = cupy_module().cuda.Event(disable_timing=True)
        ev.record(self._stream)
        self._events[b] = ev

    def _wait(self, b: int) -> None:
        if self._events[b] is not None:
            self._events[b].synchronize()

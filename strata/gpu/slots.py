"""The expert cache's slot store in VRAM and the copies that fill it (strata/gpu/tiers.py's bytes).

Slots come in segments (strata/tiers/store.py: one, or --kv-grow's); copies from the arena are `gather_rows`
launches on the current stream (zero-copy reads of pinned memory), or, from a pageable arena that no kernel
can read, the driver's copies; copies between slots (the cache's compaction) are gathers either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.gpu.ring import GpuRing
from strata.gpu.runtime import HOST_TO_DEVICE, Kernels, cupy_module, launch
from strata.tiers.ring import split_rows
from strata.tiers.store import Segments

MAX_ROWS_PER_LAUNCH = 60000  # gridDim.y limit is 65535
BLOCKS_PER_ROW = 4  # an expert part is ~0.2-2 MB: a few blocks each keep enough reads in flight


def _device_bytes(nbytes: int) -> tuple[Any, int]:
    a = cupy_module().empty(nbytes, cupy_module().uint8)
    return a, int(a.data.ptr)


class DeviceSlots(Segments):
    """The slot store in VRAM (segments of part-major slots, tiers/store.py); copies are gathers on the
    current stream, or, from a pageable arena (which no kernel can read), the driver's copies."""

    def __init__(
        self,
        n_slots: int,
        strides: tuple[int, int, int],
        kernels: Kernels,
        pageable: bool,
        ring: GpuRing | None = None,
        per: int | None = None,
    ) -> None:
        self.ring = ring  # the low-RAM mode: copies from outside `ranges` (the pinned arena's) go through it
        self.ranges: list[tuple[int, int]] = []
        self.kernels = kernels
        self.pageable = pageable
        self._keep: list[Any] = []  # row lists in flight, freed at the next sync
        super().__init__(n_slots, strides, _device_bytes, per)

    def copy_rows(self, rows: np.ndarray) -> None:
        if self.ring is not None:
            rows, mapped = split_rows(rows, self.ranges)
            self.ring.copy(mapped)
            if not len(rows):
                return
        if not self.pageable:
            gather(self.kernels, rows, self._keep)
            return
        engine_copies(rows, self.strides, cupy_module().cuda.get_current_stream())

    def move_rows(self, rows: np.ndarray) -> None:
        """Slot to slot: both ends in VRAM, so a gather whatever the arena is."""
        gather(self.kernels, np.asarray(rows, np.int64).reshape(-1, 3), self._keep)

    def sync(self) -> None:
        cupy_module().cuda.get_current_stream().synchronize()


def gather(kernels: Kernels, rows: np.ndarray, keep: list[Any]) -> None:
    """Launch gather_rows over (source, destination, bytes) rows [n, 3] on the current stream."""
    cp = cupy_module()
    for r0 in range(0, len(rows), MAX_ROWS_PER_LAUNCH):
        part = cp.asarray(
            np.ascontiguousarray(rows[r0 : r0 + MAX_ROWS_PER_LAUNCH].T)
        )  # [3, n]: src, dst, bytes
        keep.append(part)
        n = part.shape[1]
        launch(kernels["gather_rows"], (BLOCKS_PER_ROW, n), 256, (part[0], part[1], part[2]))


def engine_copies(rows: np.ndarray, strides: tuple[int, int, int], stream: Any) -> None:
    """Copy rows [n, 3] (source, destination, bytes) host to device on the copy engines, queued on `stream`:
    one `cudaMemcpyAsync` per contiguous run."""
    rt = cupy_module().cuda.runtime
    for src, dst, n in coalesce(rows, strides):
        rt.memcpyAsync(dst, src, n, HOST_TO_DEVICE, stream.ptr)


def coalesce(rows: np.ndarray, strides: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """Merge copies [n, 3] (three parts per expert, in order) whose sources and destinations both step by
    the part's stride into one copy each (the padding between rows is copied along, harmlessly)."""
    out: list[tuple[int, int, int]] = []
    for p, stride in enumerate(strides):
        run: list[int] | None = None
        for src, dst, n in rows[p::3].tolist():
            if run is not None and src - run[3] == stride and dst - run[4] == stride:
                run[2], run[3], run[4] = src + n - run[0], src, dst
                continue
            if run is not None:
                out.append((run[0], run[1], run[2]))
            run = [src, dst, n, src, dst]  # first src, first dst, length so far, last src, last dst
        if run is not None:
            out.append((run[0], run[1], run[2]))
    return out

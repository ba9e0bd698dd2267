"""The bounce ring: how bytes from the mmap tier reach a slot.

An expert that is neither in a slot nor in the pinned arena lives only in the file's mapping (the page cache,
or the disk), which the GPU cannot read in place, and a copy engine reads pageable memory at a fraction of its
pinned rate while holding the host thread. So such copies go through a few small pinned buffers: the host
copies a buffer's worth from the mapping (memcpy, faulting pages in from the disk if need be), queues the
device copy out of it, and fills the next buffer meanwhile; a buffer is reused once its device copy is done.

`BounceRing` takes the two device steps as functions, so the CPU stand-in runs the same ring with memmoves
(tests/test_low_ram.py): `put(dst, src, n)` queues a copy out of a buffer, `mark(b)` records that buffer b's
copies are queued, `wait(b)` blocks until they are done.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

RING_BUFFERS = 2  # one filling on the host while the other's device copy runs
RING_EXPERTS = 4  # experts one buffer holds: each device copy moves a few MB (80B shape: 4 x 1.7 MB)


def ring_buffer_bytes(slot_bytes: int) -> int:
    return RING_EXPERTS * slot_bytes


def batches(rows: np.ndarray, size: int) -> list[list[tuple[int, int, int, int]]]:
    """Copies [n, 3] (source, destination, bytes) cut into buffer loads of at most `size` bytes: per load,
    (source, offset in the buffer, destination, bytes) pieces; a copy longer than what is left is split."""
    out: list[list[tuple[int, int, int, int]]] = []
    cur: list[tuple[int, int, int, int]] = []
    used = 0
    for src, dst, n in np.asarray(rows, np.int64).reshape(-1, 3).tolist():
        while n > 0:
            if used == size:
                out.append(cur)
                cur, used = [], 0
            k = min(n, size - used)
            cur.append((src, used, dst, k))
            src, dst, n, used = src + k, dst + k, n - k, used + k
    if cur:
        out.append(cur)
    return out


def merged(load: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int]]:
    """One load's device copies (offset in the buffer, destination, bytes), pieces that continue each other in
    both merged."""
    out: list[list[int]] = []
    for _, off, dst, n in load:
        if out and out[-1][0] + out[-1][2] == off and out[-1][1] + out[-1][2] == dst:
            out[-1][2] += n
        else:
            out.append([off, dst, n])
    return [(a, b, c) for a, b, c in out]


class BounceRing:
    def __init__(
        self,
        buffers: list[int],
        size: int,
        put: Callable[[int, int, int], None],
        mark: Callable[[int], None],
        wait: Callable[[int], None],
    ) -> None:
        """buffers: the host addresses of RING_BUFFERS buffers of `size` bytes each."""
        self.buffers, self.size = buffers, size
        self.put, self.mark, self.wait = put, mark, wait
        self._next = 0
        self.bytes = 0  # copied through the ring since start
        self.loads = 0

    def copy(self, rows: np.ndarray) -> None:
        """Queue copies [n, 3] (source in the mmap, destination, bytes), in order with the device's work."""
        for load in batches(rows, self.size):
            b = self._next
            self._next = (b + 1) % len(self.buffers)
            self.wait(b)  # the buffer's last device copy has read it
            base = self.buffers[b]
            for src, off, _, n in load:
                ctypes.memmove(base + off, src, n)
            for off, dst, n in merged(load):
                self.put(dst, base + off, n)
            self.mark(b)
            self.bytes += sum(p[3] for p in load)
            self.loads += 1


def host_ring(size: int) -> tuple[BounceRing, list[np.ndarray]]:
    """The CPU stand-in's ring: numpy buffers, device copies as memmoves (done at once)."""
    bufs = [np.zeros(max(size, 1), np.uint8) for _ in range(RING_BUFFERS)]
    ring = BounceRing(
        [int(b.ctypes.data) for b in bufs],
        size,
        lambda d, s, n: ctypes.memmove(d, s, n),
        lambda b: None,
        lambda b: None,
    )
    return ring, bufs


def split_rows(rows: np.ndarray, ranges: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Copies [n, 3] split by source: those inside one of the (start, end) ranges (pinned rows), and the rest
    (the mmap's), each in its original order."""
    rows = np.asarray(rows, np.int64).reshape(-1, 3)
    inside = np.zeros(len(rows), bool)
    for lo, hi in ranges:
        inside |= (rows[:, 0] >= lo) & (rows[:, 0] < hi)
    return rows[inside], rows[~inside]

"""The slot store's memory: slots in segments, so the expert cache can give VRAM back to a growing KV.

Slot s of part p (gate, up, down) is at `segments[s // per][p] + (s % per) * strides[p]`: each segment holds
`per` slots of every part, part-major like the arena. A store of one segment is the plain layout; with
`--kv-grow` segments are ~SEGMENT_BYTES each, and the cache shrinks (or grows back) by whole segments, each
one an allocation of its own that the device's pool can hand to the KV (tiers/grow.py).

`Segments` does the address arithmetic and the bookkeeping over an allocator; a store built on it copies:
`copy_rows` brings experts from their home (the arena, or the mapping through a bounce ring), `move_rows`
copies between slots (the cache's compaction before it frees its last segments).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from strata.tiers.ring import BounceRing, split_rows

# A segment's bytes under --kv-grow: the KV takes VRAM from the cache in steps of this, or of 1/64 of all
# experts where that is less (80B shape: 75 slots of 1.7 MB): small enough that the cache keeps most of its
# slots while a context grows, large enough that a 24 GB card's cache is ~100 allocations
SEGMENT_BYTES = 128 << 20
SEGMENTS_MIN = 64


def per_segment(slot_bytes: int, n_slots: int, n_total: int, grow: bool) -> int:
    """Slots a segment holds: all of them in one without --kv-grow, else SEGMENT_BYTES' worth, at most
    1/SEGMENTS_MIN of all experts."""
    if not grow:
        return max(n_slots, 1)
    return max(1, min(SEGMENT_BYTES // max(slot_bytes, 1), -(-n_total // SEGMENTS_MIN)))


Alloc = Callable[[int], tuple[Any, int]]  # nbytes -> (an array that owns them, their address)


class Segments:
    """Slots in segments of `per` slots, each part's bytes from `alloc`."""

    def __init__(
        self, n_slots: int, strides: tuple[int, int, int], alloc: Alloc, per: int | None = None
    ) -> None:
        self.strides, self.alloc = strides, alloc
        self.per = max(1, per if per is not None else n_slots)
        self.arrays: list[Any] = []  # every segment's part arrays, segment-major (three a segment)
        self.segments: list[tuple[int, int, int]] = []  # each segment's part base addresses
        self.resize(n_slots)

    @property
    def capacity(self) -> int:
        return len(self.segments) * self.per

    def addr(self, p: int, s: int) -> int:
        return self.segments[s // self.per][p] + (s % self.per) * self.strides[p]

    def resize(self, n_slots: int) -> None:
        """Hold whole segments for n_slots (at least one): new ones are allocated, the last ones freed (the
        caller moved what they held)."""
        want = max(1, -(-n_slots // self.per))
        while len(self.segments) > want:
            self.segments.pop()
            del self.arrays[-3:]
        while len(self.segments) < want:
            made = [self.alloc(self.per * s) for s in self.strides]
            self.arrays += [a for a, _ in made]
            self.segments.append(tuple(ptr for _, ptr in made))  # type: ignore[arg-type]

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)


def _host_bytes(nbytes: int) -> tuple[np.ndarray, int]:
    a = np.zeros(nbytes, np.uint8)
    return a, int(a.ctypes.data)


class NumpyBytes(Segments):
    """Slots in host memory: the CPU stand-in for VRAM. With a ring (the low-RAM mode), copies from outside
    the RAM tier's `ranges` pass through it, as the GPU's do."""

    def __init__(self, n_slots: int, strides: tuple[int, int, int], per: int | None = None) -> None:
        self.ring: BounceRing | None = None
        self.ring_buffers: list[np.ndarray] = []  # the ring's memory
        self.ranges: list[tuple[int, int]] = []  # the RAM tier's row stores
        super().__init__(n_slots, strides, _host_bytes, per)

    def copy_rows(self, rows: np.ndarray) -> None:
        if self.ring is not None:
            rows, mapped = split_rows(rows, self.ranges)
            self.ring.copy(mapped)
        self.move_rows(rows)

    def move_rows(self, rows: np.ndarray) -> None:
        for src, dst, n in np.asarray(rows, np.int64).reshape(-1, 3).tolist():
            ctypes.memmove(dst, src, n)

    def sync(self) -> None:
        pass

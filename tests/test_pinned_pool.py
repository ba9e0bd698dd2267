"""The snapshot pool (strata/gpu/pinned.py) on host memory standing in for the driver's pinned blocks: size
classes, reuse of freed blocks across nearby sizes, views keeping their block, the cap on freed bytes (and
that the blocks over it are dropped at the next allocation, not when freed), and its counts under threads."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from strata.gpu.pinned import MIN_CLASS, PinnedPool, size_class


class Driver:
    """Blocks as numpy byte arrays, each watched, so a test sees which were asked for and which let go."""

    def __init__(self) -> None:
        self.blocks: list[weakref.ref[np.ndarray]] = []
        self.sizes: list[int] = []

    def __call__(self, n: int) -> tuple[np.ndarray, int]:
        b = np.zeros(n, np.uint8)
        self.blocks.append(weakref.ref(b))
        self.sizes.append(n)
        return b, b.ctypes.data

    def alive(self) -> int:
        gc.collect()
        return sum(r() is not None for r in self.blocks)

    def alive_bytes(self) -> int:
        gc.collect()
        return sum(n for r, n in zip(self.blocks, self.sizes) if r() is not None)


@pytest.mark.parametrize("n", [1, 4096, MIN_CLASS, MIN_CLASS + 1, 75_500_000, 3 << 30, (1 << 20) * 9 + 7])
def test_size_classes_hold_the_request_within_an_eighth(n):
    s = size_class(n)
    assert s >= n and s >= MIN_CLASS
    if n >= MIN_CLASS:
        assert s <= n * 1.125
    assert size_class(s) == s  # a class is its own class: a freed block fits what it was made for


def test_a_freed_block_serves_the_next_snapshot_of_about_its_size():
    drv = Driver()
    pool = PinnedPool(drv)
    a = pool.empty((1000, 257), np.float32)
    addr = a.ctypes.data
    a[...] = 1.5
    del a
    gc.collect()
    assert pool.held_bytes == 0 and pool.free_bytes == size_class(1000 * 257 * 4)
    b = pool.empty((1001, 257), np.float32)  # four more cells of KV: the same class
    assert pool.allocs == 1 and b.ctypes.data == addr and b.shape == (1001, 257) and b.dtype == np.float32
    c = pool.empty((4000, 257), np.float32)  # another class: a block of its own
    assert pool.allocs == 2 and c.ctypes.data != addr


def test_a_view_keeps_its_block():
    pool = PinnedPool(Driver())
    a = pool.empty((8, 1 << 16), np.uint8)
    view = a[2:4]
    del a
    gc.collect()
    assert pool.free_bytes == 0  # the view still reads it
    del view
    gc.collect()
    assert pool.free_bytes == size_class(8 << 16)


def test_freed_bytes_past_the_cap_go_back_at_the_next_allocation():
    drv = Driver()
    sizes = [1 << 20, 2 << 20, 4 << 20]
    pool = PinnedPool(drv, cap=(4 << 20) + (2 << 20))
    arrays = [pool.empty((s,), np.uint8) for s in sizes]
    while arrays:  # freed in the order they were made
        arrays.pop(0)
    gc.collect()
    # the oldest freed (1 MiB) is over the cap: out of the pool, but held until an allocation drops it
    assert pool.free_bytes == 6 << 20 and drv.alive() == 3
    keep = pool.empty((2 << 20,), np.uint8)  # reuses the 2 MiB block and drops the 1 MiB one
    assert pool.allocs == 3 and drv.alive() == 2 and pool.free_bytes == 4 << 20
    del keep


def test_counts_stay_exact_under_threads():
    drv = Driver()
    pool = PinnedPool(drv, cap=8 << 20)
    rng = np.random.default_rng(0)
    # snapshots of prompts around a few common lengths (a system prompt and tools, then a question) of 1 KiB
    # KV cells a token
    common = np.array([1500, 2200, 3000]) << 10
    plans = [rng.choice(common, 200) + (rng.integers(0, 200, 200) << 10) for _ in range(4)]

    def worker(sizes: np.ndarray) -> None:
        held = []
        for i, n in enumerate(sizes):
            a = pool.empty((int(n),), np.uint8)
            a[:8] = i % 251
            held.append(a)
            if len(held) > 3:
                held.pop(0)

    threads = [threading.Thread(target=worker, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert pool.held_bytes == 0
    assert pool.free_bytes <= pool.cap
    assert pool.allocs < sum(len(p) for p in plans) / 2  # most snapshots reuse a freed block
    pool.empty((1,), np.uint8)  # drops what went over the cap
    assert drv.alive_bytes() <= pool.cap + size_class(1)  # what the driver still holds: the freed, capped


def test_spares_are_pinned_ahead_for_the_classes_asked_lately():
    drv = Driver()
    pool = PinnedPool(drv, cap=64 << 20, spares=3)
    kept = [pool.empty((10 << 20,), np.uint8)]  # a snapshot the cache keeps: its block never comes back
    assert pool.refilled(10)
    assert pool.allocs == 1 and pool.spare_allocs == 3 and pool.free_bytes == 3 * size_class(10 << 20)
    kept += [pool.empty((10 << 20,), np.uint8) for _ in range(3)]  # a burst of three finds theirs pinned
    assert pool.allocs == 1
    assert pool.refilled(10)
    # the cap bounds the spares: 64 MiB holds the three of 10 MiB and three of 16 MiB, not three of 20 MiB
    kept += [pool.empty((16 << 20,), np.uint8), pool.empty((20 << 20,), np.uint8)]
    assert pool.refilled(10)
    assert pool.free_bytes <= pool.cap and pool.held_bytes == 4 * (10 << 20) + (16 << 20) + (20 << 20)
    assert drv.alive_bytes() == pool.held_bytes + pool.free_bytes  # nothing pinned outside the counts


def test_spares_that_cannot_be_pinned_leave_the_snapshots_theirs():
    asked = []

    def refusing(n: int) -> tuple[np.ndarray, int]:
        asked.append(n)
        if len(asked) > 1:
            raise MemoryError("pinned memory over the limit")
        b = np.zeros(n, np.uint8)
        return b, b.ctypes.data

    pool = PinnedPool(refusing, spares=2)
    a = pool.empty((1 << 20,), np.uint8)
    assert pool.refilled(10) and pool.spares == 0 and pool.free_bytes == 0
    a[:] = 7
    assert pool.held_bytes == size_class(1 << 20)


@pytest.mark.gpu
def test_snapshots_land_in_page_locked_blocks_that_come_back():
    import cupy as cp

    from strata.gpu.pinned import size_class, snapshot_pool, to_pinned

    pool = snapshot_pool()
    dev = cp.arange(3 * 1000 * 64, dtype=cp.float32).reshape(3, 1000, 64)
    host = to_pinned(dev[:, :900])
    assert np.array_equal(host, dev[:, :900].get())
    attrs = cp.cuda.runtime.pointerGetAttributes(host.ctypes.data)
    assert attrs.type == cp.cuda.runtime.memoryTypeHost  # page-locked: the copy ran as DMA
    size = size_class(host.nbytes)
    del host
    gc.collect()
    assert pool.refilled(30)  # the class's spares, pinned ahead
    allocs = pool.allocs
    # ten more cells, the same size class: a freed or spare block of it, no pinning on demand. (950 cells,
    # 2026-12-05 on an H100, crossed into the next class, which a block of this one cannot serve.)
    again = to_pinned(dev[:, :910])
    assert size_class(again.nbytes) == size and pool.allocs == allocs
    assert np.array_equal(again, dev[:, :910].get())

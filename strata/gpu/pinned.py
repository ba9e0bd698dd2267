"""Page-locked host buffers for the prefix cache's snapshots (copies of a sequence's KV and recurrent state).

cupy's pinned pool keeps every freed block for a later request of exactly the same rounded size. Snapshots
come in every size (a KV snapshot grows with its prompt), so the blocks of evicted snapshots were seldom used
again and that cache only grew, in memory that cannot be swapped out (a server bench with `--cache-ram-mib
4096` grew RSS from 45.2 to 51 GB; the pool's part of it was not measured apart). This pool rounds a request
up to a size class (eight a power of two: at most 12.5% more), a freed block serves a later snapshot of its
size or up to a fifth smaller, and the pool keeps at most `cap` bytes of freed blocks. Past that, the blocks
freed longest ago go back to the driver at the next allocation: allocations run on the snapshot worker, and a
block can be freed on the event loop (an eviction), where `cudaFreeHost`, which waits for the device, must
not run.

Pinning fresh pages is the slow part of a snapshot: the driver locks them at a few GB/s, where the copy itself
runs at PCIe speed. Snapshots the cache keeps never come back to the pool, so until the cache is full every
snapshot pinned its own pages, and a burst of newcomers (four slots filling at once) waited for each other's
pinning on the one snapshot worker. So the pool keeps `spares` blocks of each size class asked lately pinned
ahead, allocated by a thread of its own while the GPU works, within the same cap. Pinning holds a lock of the
driver's that copies wait for (on an H100 four 75.5 MB snapshots in a row took 58, 28, 26 and 103 ms with
spares being pinned beside them, 1.7 ms each without), so that thread pins only once no block has been asked
for in QUIET seconds: while the streams decode, not while newcomers arrive. (50 ms was too short: the host
bench's four newcomers came 40-100 ms apart, and their copies waited for spares being pinned.)
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

log = logging.getLogger("strata.gpu")

# Freed snapshot blocks kept for reuse, spares included: SPARES 80B-shape recurrent states (75.5 MB of
# DeltaNet state each; KV is 24 KiB a token) and small KV parts, so the next turn's copy does not wait for the
# driver to pin fresh pages (~GB/s)
FREE_CAP = 1024 << 20
MIN_CLASS = 1 << 16
# blocks of each size class kept pinned ahead: two per batch slot (of 4), since a request keeps two snapshots,
# its prompt's checkpoint and its answer's. With one per slot, a request that had just finished (the bench's
# first) took two, and two of the four newcomers behind it pinned their own, one after the other on the
# snapshot worker: the host bench's 4-stream TTFT p50 0.141-0.147 s, p99 0.19 (0.104 and 0.12 with two)
SPARES = 8
WANTED = 8  # the size classes asked lately that spares are kept for
QUIET = 0.5  # seconds since the last block was asked for before spares are pinned


def size_class(nbytes: int) -> int:
    """The block size a request of nbytes gets: a multiple of an eighth of the power of two below it."""
    n = max(int(nbytes), MIN_CLASS)
    step = (1 << (n.bit_length() - 1)) // 8
    return -(-n // step) * step


class _Lease:
    """One handing-out of a block: the base of the array `empty` returns. Numpy collapses a view's base to the
    first array that does not take its memory from another array, here the one made from this lease, so the
    lease lives exactly as long as any view of the snapshot does; its end gives the block back."""

    __slots__ = ("__array_interface__", "__weakref__", "block")

    def __init__(self, block: Any, address: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.block = block
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "data": (address, False),
            "version": 3,
        }


class PinnedPool:
    """Blocks from `alloc` (size -> (the object owning the block's memory, its address)) handed out as numpy
    arrays; a block comes back when its array and every view of it are gone."""

    def __init__(self, alloc: Callable[[int], tuple[Any, int]], cap: int = FREE_CAP, spares: int = 0) -> None:
        self._alloc = alloc
        self.cap = cap
        self.spares = spares
        self._free: OrderedDict[int, tuple[int, Any]] = OrderedDict()  # id -> (size, block), oldest first
        self._release: list[Any] = []  # over the cap: dropped at the next allocation, on its thread
        self._lock = threading.Lock()
        self._wanted: OrderedDict[int, None] = OrderedDict()  # size classes asked lately, newest last
        self._due = threading.Event()  # a class may be short of spares
        self._idle = threading.Event()  # the refill thread has nothing to do
        self._idle.set()
        self._refill: threading.Thread | None = None
        self._asked = 0.0  # time.monotonic() of the last request
        self.free_bytes = 0
        self.held_bytes = 0
        self.allocs = 0  # blocks asked of the driver for a request that found none free
        self.spare_allocs = 0  # blocks pinned ahead

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        size = size_class(nbytes)
        with self._lock:
            release, self._release = self._release, []
            block, size = self._take(size)
            self.held_bytes += size
            self._asked = time.monotonic()
            if self.spares:
                self._wanted[size] = None
                self._wanted.move_to_end(size)
                while len(self._wanted) > WANTED:
                    self._wanted.popitem(last=False)
        del release  # the driver's frees, here and not under the lock
        if block is None:
            try:
                block = self._alloc(size)
            except BaseException:
                with self._lock:
                    self.held_bytes -= size
                raise
            with self._lock:  # other threads allocate too
                self.allocs += 1
        if self.spares:  # after this request's own pinning, which the driver would queue behind the spares'
            self._wake()
        lease = _Lease(block, block[1], tuple(int(v) for v in shape), dtype)
        weakref.finalize(lease, self._give_back, block, size)
        return np.asarray(lease)

    def _take(self, size: int) -> tuple[Any, int]:
        """The smallest freed block of `size` to a quarter more (the request is at most a fifth smaller), and
        its size; else (None, size)."""
        fits = [(s, key) for key, (s, _) in self._free.items() if size <= s <= size + size // 4]
        if not fits:
            return None, size
        s, key = min(fits)
        self.free_bytes -= s
        return self._free.pop(key)[1], s

    def refilled(self, timeout: float | None = None) -> bool:
        """Wait until the spares are pinned (or could not be); False on timeout."""
        return self._idle.wait(timeout)

    def _wake(self) -> None:
        self._idle.clear()
        self._due.set()
        with self._lock:
            if self._refill is None:
                self._refill = threading.Thread(target=self._refill_loop, name="strata-pin", daemon=True)
                self._refill.start()

    def _refill_loop(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            while (size := self._short()) is not None:
                try:
                    block = self._alloc(size)
                except Exception:  # pinnable memory ran out: snapshots pin their own, as without spares
                    log.warning("pinning blocks ahead failed; snapshots pin their own", exc_info=True)
                    self.spares = 0
                    break
                with self._lock:
                    self.spare_allocs += 1
                    self.held_bytes += size  # _give_back counts it out again
                self._give_back(block, size)
            if not self._due.is_set():
                self._idle.set()

    def _short(self) -> int | None:
        """The newest class asked lately with fewer than `spares` free blocks of it, if the cap has room, once
        no block has been asked for in QUIET seconds."""
        while (wait := self._asked + QUIET - time.monotonic()) > 0:
            time.sleep(wait)
        with self._lock:
            for size in reversed(self._wanted):
                have = sum(1 for s, _ in self._free.values() if s == size)
                if have < self.spares and self.free_bytes + size <= self.cap:
                    return size
        return None

    def _give_back(self, block: Any, size: int) -> None:
        with self._lock:
            self.held_bytes -= size
            self._free[id(block)] = (size, block)
            self.free_bytes += size
            while self.free_bytes > self.cap:
                _, (s, old) = self._free.popitem(last=False)
                self.free_bytes -= s
                self._release.append(old)


@functools.cache
def snapshot_pool() -> PinnedPool:
    from strata.gpu.runtime import cupy_module

    cp = cupy_module()

    def alloc(n: int) -> tuple[Any, int]:
        mem = cp.cuda.PinnedMemory(n)
        return mem, int(mem.ptr)

    return PinnedPool(alloc, spares=SPARES)


def to_pinned(a: Any) -> np.ndarray:
    """A device array's copy in page-locked host memory from the snapshot pool: its DMA runs at PCIe speed
    where the driver stages a pageable copy at ~3 GB/s. For the prefix cache's snapshots, whose copy time a
    repeated prompt or the next turn waits on."""
    out = snapshot_pool().empty(a.shape, a.dtype)
    a.get(out=out)
    return out

"""Admission riding the misses' reads (tiers/ride.py), on the CPU: the cache's bookkeeping driven through the
GPU kernels' numpy twins (tier_count, admit) over one byte array standing in for VRAM and pinned RAM, so every
address the host hands the device is checked byte for byte. The GPU runs the kernels themselves in
tests/test_gpu_tiers.py."""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels import tiers as kt
from strata.tiers.layout import ExpertLayer, ExpertLayout, Part
from strata.tiers.slots import ExpertCache

N_L, N_E, A, N_SLOTS = 2, 8, 2, 6
PARTS = (Part("g", 8, 4, 32, 48), Part("u", 8, 4, 32, 48), Part("d", 8, 8, 16, 32))  # 192, 192, 256 bytes
LAYOUT = ExpertLayout(N_E, A, tuple(ExpertLayer(i, PARTS) for i in range(N_L)), (192, 192, 256))
SLOT_BASE = (0, 2048, 4096)  # slot s of part p at SLOT_BASE[p] + s * stride
ARENA = 8192  # expert e of layer l, part p: ARENA + ((l * 3 + p) * N_E + e) * 256


class Memory:
    """The slot store and the arena as offsets into one byte array (the twins' addresses)."""

    def __init__(self) -> None:
        self.bytes = np.zeros(ARENA + N_L * 3 * N_E * 256, np.uint8)
        self.bytes[ARENA:] = np.random.default_rng(0).integers(1, 256, N_L * 3 * N_E * 256)
        self.bases = np.array([[ARENA + (li * 3 + p) * N_E * 256 for p in range(3)] for li in range(N_L)])
        self.strides = np.full((N_L, 3), 256, np.int64)

    def addr(self, p: int, s: int) -> int:
        return SLOT_BASE[p] + s * LAYOUT.strides[p]

    def copy_rows(self, rows: np.ndarray) -> None:
        for src, dst, n in rows.tolist():
            self.bytes[dst : dst + n] = self.bytes[src : src + n]

    def sync(self) -> None:
        pass


class Device:
    """What GpuTiers keeps on the GPU (table, where, pend), pushed whole from the bookkeeping, and the decode
    layers' tier_count and admit launches, by their twins."""

    def __init__(self, cache: ExpertCache, mem: Memory) -> None:
        self.cache, self.mem = cache, mem
        self.push()

    def push(self) -> np.ndarray:
        """The tables as the host has them; returns the riders this push leaves (ExpertCache.riders)."""
        c = self.cache
        self.table, self.where, self.pend = c.table.copy(), c.where_kinds(), c.pend.copy()
        return c.riders()

    def decode_pass(self, ids: np.ndarray) -> np.ndarray:
        """One decode row routing ids [L, A]: each layer counted, then its riders admitted; the route rows."""
        routes = np.zeros((N_L, 1, A), np.int64)
        sizes = tuple(p.nbytes for p in PARTS)
        for li in range(N_L):
            counted = kt.ref_tier_count(ids[li], A, self.where[li], 640, 1)
            hit = self.where[li][ids[li]] >= 0
            assert int(counted[0, 1]) == hit.sum()
            routes[li, 0] = ids[li] | np.where(hit, kt.ROUTE_HIT, 0)
            self.mem.bytes, self.where[li], self.table[li] = kt.ref_admit(
                self.mem.bytes, ids[li], self.where[li], self.table[li], self.pend[li], sizes
            )
        return routes


def _cache() -> tuple[ExpertCache, Memory]:
    mem = Memory()
    cache = ExpertCache(LAYOUT, N_SLOTS, mem, mem)  # type: ignore[arg-type]
    cache.fill(None)  # experts 0-2 of each layer resident
    cache.dirty = []
    return cache, mem


def _holds_its_expert(cache: ExpertCache, mem: Memory) -> None:
    """Every slot the tables read holds its expert's bytes."""
    for li, e in zip(*np.nonzero(cache.where >= 0)):
        for p in range(3):
            n, slot, home = int(cache.sizes[li, p]), int(cache.table[li, p, e]), int(cache.home[li, p, e])
            assert np.array_equal(mem.bytes[slot : slot + n], mem.bytes[home : home + n]), (li, e, p)


def test_a_rider_lands_in_the_pass_that_routes_it_and_costs_that_pass_one_read():
    cache, mem = _cache()
    dev = Device(cache, mem)
    s = int(cache.booked[1, 0])
    cache.ride([(s, 1, 6)])  # expert 6 of layer 1 into the slot of layer 1's expert 0
    assert cache.where[1, 0] == -1 and cache.booked[1, 6] == s and cache.riding[1, 6]
    assert cache.where_kinds()[1, 6] == -3 - s and cache.pend[1, :, 6].tolist() == [
        mem.addr(p, s) for p in range(3)
    ]
    held = dev.push()
    # a pass that does not route it leaves it waiting; one that does copies it and reads it as a miss
    routes = dev.decode_pass(np.array([[0, 1], [3, 4]]))
    assert cache.land_rides(routes & (kt.ROUTE_HIT - 1), held) == 0 and cache.riding[1, 6]
    routes = dev.decode_pass(np.array([[0, 1], [6, 3]]))
    assert not routes[1, 0, 0] & kt.ROUTE_HIT  # the read that brought it: a miss
    assert dev.where[1, 6] == s and (dev.table[1, :, 6] == cache.pend[1, :, 6]).all()
    assert cache.land_rides(routes & (kt.ROUTE_HIT - 1), held) == 1
    assert cache.where[1, 6] == s and not cache.riding[1, 6] and not cache.pend[1].any()
    assert cache.rides == 1 and cache.ride_bytes == 640
    # the device's own flip and the host's bookkeeping agree, and the slot holds the expert
    assert (dev.table == cache.table).all() and (dev.where == cache.where_kinds()).all()
    _holds_its_expert(cache, mem)
    routes = dev.decode_pass(np.array([[0, 1], [6, 3]]))
    assert routes[1, 0, 0] & kt.ROUTE_HIT  # the next pass hits


def test_only_a_pass_that_held_the_rider_lands_it():
    """The decode pipeline: a pass launched before the push that made the rider (or after the host moved it)
    did not copy it, and the host must not point the tables at a slot nobody filled."""
    cache, mem = _cache()
    dev = Device(cache, mem)
    before = dev.push()  # the pass in flight holds no rider
    s = int(cache.booked[1, 0])
    cache.ride([(s, 1, 6)])
    routes = dev.decode_pass(np.array([[0, 1], [6, 3]]))  # runs on the old tables
    assert cache.land_rides(routes & (kt.ROUTE_HIT - 1), before) == 0 and cache.riding[1, 6]
    held = dev.push()
    routes = dev.decode_pass(np.array([[0, 1], [6, 3]]))  # copies it into slot s ...
    cache.ride([(s, 1, 7)])  # ... while the host gives slot s to another newcomer
    assert cache.land_rides(routes & (kt.ROUTE_HIT - 1), held) == 0
    assert cache.where[1, 6] == -1 and cache.booked[1, 6] == -1 and cache.riding[1, 7]
    held = dev.push()  # the device reads 6 from the arena again; 7 rides into slot s
    assert dev.where[1, 6] == -1 and dev.table[1, 0, 6] == cache.home[1, 0, 6]
    routes = dev.decode_pass(np.array([[0, 1], [7, 6]]))
    assert cache.land_rides(routes & (kt.ROUTE_HIT - 1), held) == 1
    _holds_its_expert(cache, mem)


def test_riders_no_pass_routed_are_copied_instead():
    cache, mem = _cache()
    dev = Device(cache, mem)
    s0, s1 = int(cache.booked[0, 0]), int(cache.booked[1, 1])
    cache.ride([(s0, 0, 5), (s1, 1, 7)])
    dev.push()
    late = cache.stop_riding()
    assert sorted(late) == sorted([(s0, 0, 5), (s1, 1, 7)])
    assert (
        not cache.riding.any() and not cache.pend.any() and (cache.booked[[0, 1], [5, 7]] == [s0, s1]).all()
    )
    assert (cache.where_kinds()[[0, 1], [5, 7]] == -1).all()
    cache.load(late)  # the copy path: copies, then the tables flip
    assert (cache.where[[0, 1], [5, 7]] == [s0, s1]).all()
    _holds_its_expert(cache, mem)
    held = dev.push()
    routes = dev.decode_pass(np.array([[5, 1], [7, 3]]))  # nothing rides now: both hit, nothing copied again
    assert (routes[:, 0, 0] & kt.ROUTE_HIT).all() and cache.land_rides(routes & (kt.ROUTE_HIT - 1), held) == 0


def test_admit_twin_copies_each_routed_rider_once():
    rng = np.random.default_rng(1)
    mem = rng.integers(0, 256, 4096).astype(np.uint8)
    where = np.array([-1, 0, -3 - 4, -2, -3 - 5, 1], np.int32)  # experts 2 and 4 ride into slots 4 and 5
    tab = np.array([[100 * (j + 1) + 16 * e for e in range(6)] for j in range(3)], np.int64) * 4
    pend = np.zeros((3, 6), np.int64)
    pend[:, 2], pend[:, 4] = [2048, 2304, 2560], [3072, 3328, 3584]
    got, w, t = kt.ref_admit(mem, np.array([2, 0, 2, 3]), where, tab, pend, (48, 48, 64))
    assert w.tolist() == [-1, 0, 4, -2, -8, 1]  # 4 was not routed: still riding
    assert (t[:, 2] == pend[:, 2]).all() and (t[:, 4] == tab[:, 4]).all()
    for j, n in enumerate((48, 48, 64)):
        assert np.array_equal(got[pend[j, 2] : pend[j, 2] + n], mem[tab[j, 2] : tab[j, 2] + n])
    untouched = np.ones(4096, bool)
    for j, n in enumerate((48, 48, 64)):
        untouched[pend[j, 2] : pend[j, 2] + n] = False
    assert np.array_equal(got[untouched], mem[untouched])
    counted = kt.ref_tier_count(np.array([2, 0, 4, 3]), 2, where, 10, 2)
    # riders are read over PCIe like any miss, the CPU's are not: row 0 a rider and a miss, row 1 a rider and
    # one of the CPU's
    assert counted[:, 2].tolist() == [20, 10]

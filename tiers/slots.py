"""The expert cache: slots, the (layer, expert) -> address table the MoE kernels read, and slot
borrowing for long prefill chunks.

The cache is bookkeeping over two byte stores it does not own: the slot store (VRAM on the GPU, a
numpy stand-in on the CPU) and the arena (pinned RAM on the GPU, the mmap on the CPU). `table[l, p, e]`
is where the kernels read part p (gate, up, down) of expert e of MoE layer l: a slot when the expert
is resident, else its place in the arena (a zero-copy read on the GPU). Kernels only ever read the
table, so a captured CUDA graph stays valid while the cache's contents change; the table changes
between windows.

Some misses may be the CPU's share (`cpu[l, e]`, set by `share_with_cpu`): decode rows compute them on the
CPU pool beside the GPU, so the decode table points them at a slot of zeros (their GPU contribution is
exactly 0, and the kernels need no branch), while `full`, the table of passes with more rows, still reads
them from the arena.

Under `--ram-budget-mib` (tiers/ram.py) the arena holds only some experts and the rest are read from the
file's mapping: `in_ram[l, e]` says which. Those mapped-only misses are the CPU's in decode rows (`cpu`, the
GPU's graph cannot read pageable memory; the CPU stand-in reads them in place and counts them so), and every
pass of more rows stages its misses into borrowed slots (`borrow_min` drops to the first row count past
decode), copies from the mapping passing through the bounce ring (tiers/ring.py).

Long prefill chunks borrow slots (tiers/borrow.py); under --kv-grow the cache changes size (tiers/grow.py);
the CPU stand-in counts its passes on the host (tiers/host_pass.py): parts of ExpertCache kept in their own
files.

Legend: L = MoE layers, E = experts per layer, P = 3 parts, S = slots.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.tiers.borrow import BORROW_MIN, Borrowing, Staging
from strata.tiers.budget import cache_request
from strata.tiers.grow import Resizing
from strata.tiers.host_pass import COLS, HostPass
from strata.tiers.layout import ExpertLayout
from strata.tiers.lookahead import PrefetchCounts
from strata.tiers.policy import Policy, check_policy, make
from strata.tiers.profile import Profile
from strata.tiers.ride import Riding
from strata.tiers.ring import host_ring, ring_buffer_bytes
from strata.tiers.store import NumpyBytes, per_segment
from strata.tiers.telemetry import TierUse, note
from strata.tiers.trace import Recorder

if TYPE_CHECKING:
    from strata.tiers.grow import SlotLender


class Bytes(Protocol):
    """The slot store (tiers/store.py): `addr(p, s)` is slot s of part p; `resize` holds room for n slots."""

    def addr(self, p: int, s: int) -> int: ...

    def resize(self, n_slots: int) -> None: ...

    def copy_rows(self, rows: np.ndarray) -> None:
        """Copy rows [n, 3] of (source address, destination address, bytes) from experts' homes, in order with
        the kernels."""

    def move_rows(self, rows: np.ndarray) -> None:
        """Copy rows [n, 3] between slots, in order with the kernels."""

    def sync(self) -> None:
        """Wait until the copies issued so far are done."""


class Arena(Protocol):
    """Where every expert lives: expert e of MoE layer l, part p at `bases[l, p] + e * strides[l, p]`, or,
    when the arena has `addrs` (int64 [L, P, E]), there; an arena with `held` ([L, E] bool) holds only
    those in RAM."""

    bases: np.ndarray  # int64 [L, P]
    strides: np.ndarray  # int64 [L, P]


def homes(arena: Arena, n_e: int) -> tuple[np.ndarray, np.ndarray]:
    """The arena's address of every expert part [L, P, E] and which experts it holds in RAM [L, E]."""
    addrs = getattr(arena, "addrs", None)
    if addrs is None:
        addrs = arena.bases[:, :, None] + np.arange(n_e, dtype=np.int64) * arena.strides[:, :, None]
    held = getattr(arena, "held", None)
    in_ram = np.ones(addrs.shape[::2], bool) if held is None else np.asarray(held)
    return np.asarray(addrs, np.int64), in_ram


class ExpertCache(Borrowing, Resizing, HostPass, Riding):
    def __init__(
        self, layout: ExpertLayout, n_slots: int, slots: Bytes, arena: Arena, borrow_min: int = BORROW_MIN
    ) -> None:
        self.layout = layout
        self.n_slots = n_slots
        self.slots = slots
        self.arena = arena
        self.borrow_min = borrow_min
        n_l, n_e = len(layout.layers), layout.n_expert
        self.where = np.full((n_l, n_e), -1, np.int32)  # [L, E] slot holding the expert, -1: arena only
        self.booked = np.full((n_l, n_e), -1, np.int32)  # [L, E] slot held or being filled for the expert
        self.owner = np.full((n_slots, 2), -1, np.int32)  # [S, 2] (layer, expert) each slot holds
        self.sizes = np.array([[p.nbytes for p in l.parts] for l in layout.layers], np.int64)  # [L, P]
        self.expert_bytes = self.sizes.sum(axis=1)  # [L]
        self.layer_of = layout.index()  # model layer -> MoE layer
        self.use = TierUse()  # engine-wide counters
        self.prefetch = PrefetchCounts()  # the lookahead (tiers/lookahead.py), engine-wide
        self.home, self.in_ram = homes(arena, n_e)  # [L, P, E] where experts live; [L, E] in the RAM tier
        self.full = self.home.copy()  # [L, P, E]: slot or arena
        self.table = self.full.copy()  # [L, P, E]: decode rows' table (the CPU's share -> the zero slot)
        self.cpu = np.zeros((n_l, n_e), bool)  # [L, E]: misses the CPU computes for decode rows
        self.zero: tuple[int, int, int] | None = None  # the zero slot's part addresses, once shared
        self.pcie_frac = 1.0  # share of the misses the GPU reads over PCIe (the rest: the CPU's)
        self.version = 0  # bumped whenever the table changes, so device copies know to refresh
        # (layer, expert) whose entries changed since a device copy took them; None: no device copy to keep up
        self.dirty: list[tuple[int, int]] | None = None
        self.by_name = {l.parts[0].name: li for li, l in enumerate(layout.layers)}  # gate tensor -> MoE layer
        self._rows = np.zeros((0, COLS), np.int64)  # this pass's per-row counts (see settle)
        self._staging: Staging | None = None
        self._staged = np.zeros(3, np.int64)  # this pass's staged bytes; experts, bytes of those mapped
        self.recorder: Recorder | None = None  # --record-routes (the CPU stand-in's passes)
        self.policy: Policy | None = (
            None  # --cache-policy lru|adaptive: every layer's residents, between windows
        )
        self.swap_budget: int | None = None  # experts a window may bring in
        self.swaps = 0  # experts the policy brought in since start
        self.swap_bytes = 0
        # the GPU's admissions riding the misses' reads (tiers/ride.py): riders, their slots' part addresses,
        # how many landed that way and their bytes (of swap_bytes, those no copy moved)
        self.riding = np.zeros((n_l, n_e), bool)  # [L, E]
        self.pend = np.zeros((n_l, 3, n_e), np.int64)  # [L, P, E]
        self.rides = 0
        self.ride_bytes = 0
        self.profile: Profile | None = None  # counts every pass's routing (--routing-profile)
        self.layer_lookups = np.zeros(n_l, np.int64)  # [L] since start, decode and prefill
        self.layer_hits = np.zeros(n_l, np.int64)
        self.started = time.monotonic()
        self._pass_ids: list[
            np.ndarray | None
        ] = []  # this pass's routed ids [T, A] per layer (recorded, learned)
        # the CPU stand-in's lookahead (--prefetch K): K staging slots, this pass's predictions [T, A] a layer
        self.ahead_k = 0
        self._ahead_store: Bytes | None = None
        self._ahead: tuple[int, np.ndarray, np.ndarray] | None = None  # (layer, staged, its table [P, E])
        self._ahead_ns = 0
        self._pass_pred: list[np.ndarray | None] = []
        self.predicting = False  # this pass's layers predict their experts (decode rows, something missing)
        self.fill_rank = np.zeros((n_l, n_e))  # [L, E] what resize keeps first without a policy (set by fill)
        self.lender: SlotLender | None = None  # --kv-grow: lends slots to the KV (tiers/grow.py)

    # ---- addresses ----
    def _arena_row(self, li: int, p: int, e: np.ndarray | int) -> np.ndarray:
        return self.home[li, p, e]

    def _slot_addr(self, p: int, s: int) -> int:
        return self.slots.addr(p, s)

    def _copies(self, li: int, e: int, slot: int) -> list[tuple[int, int, int]]:
        """(source, destination, bytes) of expert e of layer li's three parts, arena -> slot."""
        return [
            (int(self._arena_row(li, p, e)), self._slot_addr(p, slot), int(self.sizes[li, p]))
            for p in range(3)
        ]

    # ---- contents ----
    def _evict(self, slot: int) -> None:
        """The slot's expert (if any) is read from the arena from now on; the slot is free."""
        old_l, old_e = (int(v) for v in self.owner[slot])
        if old_l >= 0:
            self._unride(old_l, old_e)
            self.where[old_l, old_e] = self.booked[old_l, old_e] = -1
            for p in range(3):
                self.full[old_l, p, old_e] = self.table[old_l, p, old_e] = self._arena_row(old_l, p, old_e)
            if self.cpu[old_l, old_e]:
                self._to_cpu(old_l, old_e)
            if self.dirty is not None:
                self.dirty.append((old_l, old_e))
        self.owner[slot] = (-1, -1)
        self.version += 1

    def _release(self, slot: int, li: int, e: int) -> None:
        """Book `slot` for expert e of MoE layer li: its old expert goes back to the arena now; e is read from
        the arena until `_land` (the slot's bytes may still be in flight)."""
        self._evict(slot)
        self.owner[slot] = (li, e)
        self.booked[li, e] = slot
        self.version += 1

    def _land(self, slot: int, li: int, e: int) -> None:
        """The slot holds expert e now: the tables read it from there."""
        self._land_all(np.array([li]), np.array([e]), np.array([slot]), self._slot_addrs([slot]))

    def _slot_addrs(self, slots: Iterable[int]) -> np.ndarray:
        """[n, P] the part addresses of slots [n]."""
        return np.array([[self._slot_addr(p, int(s)) for p in range(3)] for s in slots], np.int64).reshape(
            -1, 3
        )

    def _land_all(self, li: np.ndarray, e: np.ndarray, slots: np.ndarray, addrs: np.ndarray) -> None:
        """Slots [n] hold the experts (li, e) [n] now, their parts at addrs [n, P]: the tables read them there
        (riders among them ride no more)."""
        self.riding[li, e] = False
        self.pend[li, :, e] = 0
        self.where[li, e] = slots
        for p in range(3):
            self.full[li, p, e] = self.table[li, p, e] = addrs[:, p]
        if self.dirty is not None:
            self.dirty.extend(zip(li.tolist(), e.tolist()))
        self.version += 1

    def release(self, placements: list[tuple[int, int, int]]) -> np.ndarray:
        """Book each (slot, layer, expert) (see `_release`); the copies [n, 3] that fill the slots. Call
        `land` once they are done."""
        for s, li, e in placements:
            self._release(s, li, e)
        return self._fill_rows(placements)

    def _fill_rows(self, placements: list[tuple[int, int, int]]) -> np.ndarray:
        """The copies [n, 3] that put each (slot, layer, expert)'s expert into its slot."""
        return np.asarray([r for s, li, e in placements for r in self._copies(li, e, s)], np.int64).reshape(
            -1, 3
        )

    def land(self, placements: list[tuple[int, int, int]]) -> None:
        """Their copies are done: point the tables at the slots still booked for them (a later release may
        have taken a slot back before its copy landed)."""
        kept = [(s, li, e) for s, li, e in placements if tuple(int(v) for v in self.owner[s]) == (li, e)]
        if kept:
            s_, li_, e_ = (np.array(v, np.int64) for v in zip(*kept))
            self._land_all(li_, e_, s_, self._slot_addrs(s_))

    def load(self, placements: list[tuple[int, int, int]]) -> None:
        """Make each (slot, layer, expert) hold that expert: bookkeeping, then one batch of copies."""
        rows = self.release(placements)
        if len(rows):
            self.slots.copy_rows(rows)
        self.land(placements)

    def fill(self, profile: Profile | None) -> None:
        """Spread the slots evenly over the layers; each layer's share holds its most used experts in
        `profile`, else (the static fill) its lowest ids. Under uniform routing any choice hits equally
        often."""
        n_l, n_e = self.where.shape
        order = [(li, e) for e in range(n_e) for li in range(n_l)]  # expert-major: every layer gets its share
        # what resize keeps first without a policy: the fill's order, or the profile's counts (equal over the
        # layers: every token routes every layer), that order breaking ties
        self.fill_rank = -(np.arange(n_e)[None, :] * n_l + np.arange(n_l)[:, None]) / float(n_l * n_e + 1)
        if profile is not None:
            per = np.bincount([li for li, _ in order[: self.n_slots]], minlength=n_l)
            keep = profile.top(per)
            order = [(li, e) for e in range(n_e) for li in range(n_l) if keep[li, e]]
            self.fill_rank = self.fill_rank + profile.uses
        t = time.perf_counter()
        self.load([(s, li, e) for s, (li, e) in enumerate(order[: self.n_slots])])
        self.slots.sync()  # timed whole: the start-up line says what the fill cost
        dt = max(time.perf_counter() - t, 1e-9)
        nbytes = int(self.expert_bytes[[li for li, _ in order[: self.n_slots]]].sum())
        how, counted = (
            ("from the profile", f"; {profile.tokens:,} tokens counted")
            if profile is not None
            else ("(static fill)", "")
        )
        note(
            f"pre-filled {self.n_slots:,} of {self.n_slots:,} slots {how} in {dt:.1f} s "
            f"({nbytes / dt / 1e6:,.0f} MB/s{counted})"
        )

    def resident(self) -> int:
        return int((self.where >= 0).sum())

    def use_policy(self, name: str, swap_budget: int | None = None) -> None:
        """Let `name` (tiers/policy.py) decide the residents between windows, starting from the fill; each
        layer keeps the number of slots the fill gave it. swap_budget: bytes a window may copy into slots
        (None: any)."""
        check_policy(name)
        if name == "static":
            return
        if self.low_ram:  # a leaver only the mapping holds would become a miss the GPU cannot read in place
            raise ConfigError(
                "cache_policy",
                name,
                "with experts only in the file's mapping "
                "(ram_budget_mib) the cache keeps its fill (static): their misses are the CPU "
                "share's, which cannot follow a policy's swaps; give ram_budget_mib room for "
                "every expert, or 0",
            )
        self.policy = make(name, 0, self.layout.n_expert, start=self.booked >= 0)
        self.swap_budget = (
            None if swap_budget is None else int(swap_budget // max(int(self.expert_bytes.max()), 1))
        )

    def learn(self, ids: np.ndarray) -> list[tuple[int, int, int]]:
        """After a window: the policy learns from its routing [T, L, A]; the (slot, layer, expert) placements
        that make the slots what it chose, each newcomer in the slot of a layer's leaver."""
        assert self.policy is not None
        before = self.policy.resident.copy()
        self.policy.update(ids, self.swap_budget)
        moves = []
        for li in np.flatnonzero((before != self.policy.resident).any(axis=1)).tolist():
            out = np.flatnonzero(before[li] & ~self.policy.resident[li])
            new = np.flatnonzero(self.policy.resident[li] & ~before[li])
            moves += [(int(self.booked[li, o]), li, int(e)) for o, e in zip(out, new)]
        self.swaps += len(moves)
        self.swap_bytes += sum(int(self.expert_bytes[li]) for _, li, _ in moves)
        return moves

    def use_prefetch(self, k: int, store: Bytes) -> None:
        """Host lookahead (tiers/lookahead.py): decode passes stage up to k predicted misses a layer into
        `store` (k slots, part-major like the slots) before the layer's experts run."""
        self.ahead_k, self._ahead_store = k, store

    def record(self, path: Path, prefetch: int | None = None, passes: int = 1) -> Recorder:
        """Record every pass's routing into `path` (written at exit and by `recorder.save()`), with the
        lookahead's predictions when it runs (prefetch: the GPU's K; default the host lookahead's) and the
        policy's windows of `passes` passes."""
        import atexit

        k = self.ahead_k if prefetch is None else prefetch
        where = self.where >= 0
        self.recorder = Recorder(
            path, self.layout.n_expert, where, self.swap_budget, k, self.expert_bytes, passes
        )
        atexit.register(self.recorder.save)
        return self.recorder

    # ---- the CPU's share of the misses ----
    def share_with_cpu(self, cpu_frac: float, zero: tuple[int, int, int]) -> None:
        """Give the CPU `cpu_frac` of each layer's non-resident experts (the highest ids, so the ones the
        GPU still reads stay one contiguous run in the arena), and always those only the mapping holds
        (`in_ram` false: the GPU cannot read them in place); decode rows' table points them at `zero`,
        the part addresses of a slot of zero bytes (every quant type decodes those to 0.0)."""
        self.zero = zero
        self.cpu[:] = False
        owned = 0
        for li in range(self.where.shape[0]):
            missing = np.flatnonzero(self.where[li] < 0)
            forced = missing[~self.in_ram[li, missing]]
            rest = missing[self.in_ram[li, missing]]
            k = max(0, round(cpu_frac * len(missing)) - len(forced))
            owned += len(forced) + min(k, len(rest))
            for e in np.concatenate([forced, rest[len(rest) - k :] if k else rest[:0]]):
                self.cpu[li, e] = True
                self._to_cpu(li, int(e))
        n_miss = int((self.where < 0).sum())
        self.pcie_frac = 1.0 - owned / n_miss if n_miss else 1.0 - cpu_frac
        self.version += 1

    def _to_cpu(self, li: int, e: int) -> None:
        assert self.zero is not None
        for p in range(3):
            self.table[li, p, e] = self.zero[p]

    def staged_counts(self, staging: Staging, li: int, rows: np.ndarray) -> np.ndarray:
        """(bytes, experts from the mapping, their bytes) [3] that layer li's staging copies `rows` move."""
        es = np.array([e for e, _ in staging.per_layer[li]], np.int64)
        mapped = int((~self.in_ram[li, es]).sum()) if len(es) else 0
        return np.array([int(rows[:, 2].sum()), mapped, mapped * int(self.expert_bytes[li])], np.int64)

    def settle(
        self, rows: np.ndarray, staged: np.ndarray | int, states: list[TierUse], lens: list[int]
    ) -> None:
        """Credit per-row counts [N, COLS] (lookups, hits, PCIe bytes, CPU expert calls, experts read from the
        mapping, their bytes) to each sequence and to the engine. A sequence that fed one token decoded; more,
        it prefilled. When the pass staged experts, prefill rows read them from their slots: `staged` [3]
        (bytes staged, experts of them from the mapping, their bytes; an int: bytes only) is what crossed
        PCIe, shared among the prefill rows."""
        st = np.zeros(3, np.int64)
        st[: np.size(staged)] = np.asarray(staged, np.int64).reshape(-1)
        n_prefill = sum(n for n in lens if n > 1)
        start = 0
        for use, n in zip(states, lens):
            got = np.zeros(COLS, np.int64)
            got[: rows.shape[1]] = rows[start : start + n].sum(axis=0)
            lk, hits, nbytes, calls, mapped, mapped_bytes = (int(v) for v in got)
            start += n
            prefill = n > 1
            if prefill and st[0]:
                nbytes = int(st[0]) * n // n_prefill
                mapped += int(st[1]) * n // n_prefill
                mapped_bytes += int(st[2]) * n // n_prefill
            for c in (use.of(prefill), self.use.of(prefill)):
                c.add(lk, hits, nbytes, calls, mapped, mapped_bytes)

    # ---- the low-RAM mode (tiers/ram.py) ----
    @property
    def low_ram(self) -> bool:
        """Some experts are in neither the slots' nor the RAM tier's reach but the file's mapping."""
        return not bool(self.in_ram.all())

    @property
    def mapped_misses(self) -> bool:
        """Some expert not in a slot is read from the file's mapping (what the GPU's graph cannot read)."""
        return bool((~self.in_ram & (self.where < 0)).any())

    def rehome(self, arena: Arena, decode_rows: int) -> None:
        """Read every non-resident expert from `arena` from now on (the low-RAM mode's, chosen after the
        fill). With misses it does not hold, every pass of more than decode_rows rows stages its misses: the
        device reads no mapped-only expert in place."""
        self.arena = arena
        self.home, self.in_ram = homes(arena, self.layout.n_expert)
        away = self.booked < 0  # [L, E]
        for p in range(3):
            self.full[:, p][away] = self.home[:, p][away]
            self.table[:, p][away & ~self.cpu] = self.home[:, p][away & ~self.cpu]
        if self.mapped_misses:
            self.borrow_min = min(self.borrow_min, decode_rows + 1)
        self.version += 1


def cpu_tiers(
    gguf: GGUFFile,
    expert_cache: str,
    profile: Profile | None = None,
    ram_budget_mib: float = 0,
    prefetch: int = 0,
    kv_grow: bool = False,
) -> ExpertCache:
    """The tier manager on the CPU: numpy slots stand in for VRAM, the file's mapping for pinned RAM, so
    the slot table, borrowing, lookahead (`prefetch` staging slots) and counters run (and are tested)
    without a GPU. Under a RAM budget that cannot hold every expert, the three tiers of the GPU: numpy copies
    of some experts stand in for the pinned arena, the rest are read from the mapping, and copies from it pass
    through a bounce ring of numpy buffers (the lookahead is off there: its staging reads the arena). With
    `kv_grow` the slots come in segments a KV ledger can take (tiers/grow.py)."""
    from strata.tiers.arena import MmapArena, RowArena
    from strata.tiers.ram import DECODE_ROWS, arena_rows, choose_held

    layout = ExpertLayout.from_gguf(gguf)
    if layout is None:
        raise ConfigError("expert_cache", expert_cache, f"{gguf.architecture} has no routed experts to cache")
    n_slots = cache_request(expert_cache, layout.slot_bytes, layout.n_total)
    assert n_slots is not None, "auto keeps every expert resident on the CPU: no tiers"
    per = per_segment(layout.slot_bytes, n_slots, layout.n_total, kv_grow)
    n_slots -= n_slots % per  # --kv-grow lends whole segments: the ledger counts every slot it holds
    rows = arena_rows(layout, ram_budget_mib) if n_slots < layout.n_total else None
    slots = NumpyBytes(n_slots, layout.strides, per)
    cache = ExpertCache(layout, n_slots, slots, MmapArena(gguf, layout))
    if rows is not None:  # the fill reads the mapping through the ring, as the GPU's does
        slots.ring, slots.ring_buffers = host_ring(ring_buffer_bytes(layout.slot_bytes))
    cache.fill(profile)
    if rows is not None:
        held = choose_held(cache.where >= 0, cache.borrowed_residents(), rows, profile)
        arena = RowArena(gguf, layout, held)
        slots.ranges = arena.ranges()
        cache.rehome(arena, DECODE_ROWS)  # as the GPU: passes past its decode rows stage
    elif prefetch:
        cache.use_prefetch(prefetch, NumpyBytes(prefetch, layout.strides))
    return cache

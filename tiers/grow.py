"""--kv-grow: the KV takes VRAM from the expert cache as contexts grow, and the cache takes it back after.

Without it the plan keeps room for every sequence's KV at the whole context before the cache gets the rest:
a 24 GB card set up for 4 x 64k positions of the 80B shape (int8: 3 GiB) holds that room empty while requests
are short, ~1,800 slots that could be serving hits. With it the plan keeps room for each sequence's first
chunk (`floor_positions`) and the cache takes the rest, in whole segments (tiers/store.py). When a KV's
growth finds the ledger full, `SlotLender.lend` shrinks the cache by enough segments (the residents of
lowest keep_rank go first: tiers/slots.py `resize`) and the ledger counts their bytes as free; between
passes `reclaim` grows it back where the ledger has had room beyond `slack` segments (a finished request's
KV), up to its start size. The worst case, every sequence at the whole context, must still fit beside the
dense part: the plan refuses it otherwise (`worst_case`), and `strata plan` shows the cache left then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from strata.errors import ConfigError
from strata.tiers.budget import MIB, Ledger, VramPlan
from strata.tiers.store import per_segment
from strata.tiers.telemetry import note

if TYPE_CHECKING:
    from strata.tiers.layout import ExpertLayout
    from strata.tiers.slots import ExpertCache

SLACK_SEGMENTS = 1  # reclaim leaves this much free for the KV's next doubling


def floor_positions(n_ctx: int, chunk: int) -> int:
    """The KV room a sequence's plan keeps under --kv-grow: its first prefill chunk (the rest is lent)."""
    return min(n_ctx, max(chunk, 1))


def worst_case(budget: int, dense_without_kv: int, kv_full: int, slot_bytes: int, flag: str) -> int:
    """Slots the cache keeps when every sequence's KV is full; ConfigError naming `flag` when even an empty
    cache leaves too little room for it."""
    room = budget - dense_without_kv - kv_full
    if room < 0:
        raise ConfigError(
            flag,
            budget // MIB,
            f"--kv-grow: every sequence's KV at the whole context needs {kv_full / MIB:,.1f} MiB beside a "
            f"dense part of {dense_without_kv / MIB:,.1f} MiB, {-room / MIB:,.1f} MiB more than the budget "
            f"of {budget / MIB:,.1f} MiB even with no expert slot; shorten the context, serve fewer "
            "sequences, or use int8 KV",
        )
    return room // max(slot_bytes, 1) if slot_bytes else 0


def plan_worst_case(plan: VramPlan, kv_full: int, layout: ExpertLayout, flag: str) -> None:
    """A --kv-grow plan: its cache in whole segments, and `worst_slots`, what it keeps when the KV is full
    (kv_full bytes for every sequence at the whole context); refused (ConfigError) when that cannot fit."""
    kv_floor = sum(v for k, v in plan.parts.items() if k.startswith("KV cache"))
    plan.worst_slots = worst_case(plan.budget, plan.dense - kv_floor, kv_full, layout.slot_bytes, flag)
    plan.kv_full = kv_full
    per = per_segment(layout.slot_bytes, plan.n_slots, layout.n_total, True)
    plan.n_slots -= plan.n_slots % per
    plan.worst_slots = min(plan.worst_slots, plan.n_slots)


class Resizing:
    """ExpertCache's resizing: what it keeps when it gives slots up, what it brings back."""

    policy: object
    fill_rank: np.ndarray
    owner: np.ndarray
    where: np.ndarray
    booked: np.ndarray
    cpu: np.ndarray
    n_slots: int

    def keep_rank(self) -> np.ndarray:
        """[L, E]: which experts deserve a slot most, higher first: the policy's decayed counts (adaptive) or
        recency (lru), else the fill's rank."""
        for name in ("score", "stamp"):
            got = getattr(self.policy, name, None)
            if got is not None:
                return np.asarray(got, np.float64)
        return self.fill_rank

    def resize(self, n: int) -> None:
        """Hold n slots. Shrinking drops the residents of lowest keep_rank, moves the kept ones out of the
        slots past n (slot to slot) and lets the store free those; growing fills the new slots with the best
        experts not resident. Between passes only: no chunk is borrowing, every slot's copy has landed."""
        assert self._staging is None, "resize while a prefill chunk borrows slots"
        n = max(0, min(int(n), self.layout.n_total))
        held = np.flatnonzero(self.owner[:, 0] >= 0)
        li, e = self.owner[held, 0], self.owner[held, 1]
        assert (self.where[li, e] == held).all(), "resize before every slot's copy has landed"
        if n < self.n_slots:
            order = np.lexsort((held, -self.keep_rank()[li, e]))  # best first; ties: the lower slot
            keep = held[order[:n]]
            for s in held[order[n:]].tolist():
                self._evict(s)
            movers = keep[keep >= n].tolist()
            targets = sorted(set(range(n)) - set(keep[keep < n].tolist()))[: len(movers)]
            pairs = list(zip(movers, targets))
            rows = [
                (self._slot_addr(p, a), self._slot_addr(p, b), int(self.sizes[self.owner[a, 0], p]))
                for a, b in pairs
                for p in range(3)
            ]
            if rows:
                self.slots.move_rows(np.asarray(rows, np.int64))
            for a, b in pairs:
                ml, me = (int(v) for v in self.owner[a])
                self.owner[b], self.owner[a] = (ml, me), (-1, -1)
                self.booked[ml, me] = b
                self._land(b, ml, me)
            self.owner = self.owner[:n].copy()
            self.n_slots = n
            self.slots.resize(n)
        elif n > self.n_slots:
            self.slots.resize(n)
            self.owner = np.concatenate([self.owner, np.full((n - self.n_slots, 2), -1, np.int32)])
            self.n_slots = n
            free = np.flatnonzero(self.owner[:, 0] < 0)
            # the CPU share's experts stay the CPU's (its set is fixed when the split is chosen)
            away = np.flatnonzero(((self.booked < 0) & ~self.cpu).reshape(-1))
            best = away[np.argsort(-self.keep_rank().reshape(-1)[away], kind="stable")][: len(free)]
            n_e = self.layout.n_expert
            self.load([(int(s), int(k) // n_e, int(k) % n_e) for s, k in zip(free, best)])
        if self.policy is not None:
            self.policy.resized(self.booked >= 0)


class SlotLender:
    """Lends the expert cache's memory to the ledger's KV. `quiesce` (the GPU: wait for in-flight swaps)
    runs before every resize."""

    def __init__(self, cache: ExpertCache, ledger: Ledger, quiesce: Callable[[], None] | None = None) -> None:
        if cache.low_ram:  # a lent slot's expert must stay readable where the misses are read from
            raise ConfigError(
                "kv_grow",
                True,
                "with some experts only in the file's mapping (ram_budget_mib) a slot lent to the KV could "
                "leave its expert where the GPU cannot read it: --kv-grow needs every expert in RAM; give "
                "ram_budget_mib room for all of them (0: no limit), or leave --kv-grow off",
            )
        self.cache, self.ledger, self.quiesce = cache, ledger, quiesce
        self.per = cache.slots.per  # type: ignore[attr-defined]
        self.segment_bytes = self.per * cache.layout.slot_bytes
        self.start_slots = cache.n_slots  # what reclaim grows back to
        self.lends = self.reclaims = 0  # since start
        ledger.lender = cache.lender = self

    @property
    def lent_segments(self) -> int:
        """Segments the KV holds now: the cache's shortfall from its start size."""
        return -(-(self.start_slots - self.cache.n_slots) // self.per)

    def _resize(self, n: int) -> None:
        if self.quiesce is not None:
            self.quiesce()
        self.cache.resize(n)

    def lend(self, need: int) -> int:
        """Free at least `need` bytes from the cache (whole segments, the last ones); the bytes freed (fewer
        once the cache is empty). The ledger counts them free."""
        have = self.cache.n_slots
        k = min(-(-need // self.segment_bytes), -(-have // self.per))
        if k <= 0:
            return 0
        n = max(0, (-(-have // self.per) - k) * self.per)
        freed = (have - n) * self.cache.layout.slot_bytes
        self._resize(n)
        self.ledger.used -= freed
        self.lends += 1
        note(
            f"kv-grow: the KV took {k} segment(s) of the expert cache ({freed / MIB:,.0f} MiB); it holds "
            f"{n:,} of {self.start_slots:,} slots"
        )
        return freed

    def reclaim(self) -> int:
        """Between passes: grow the cache back by the whole segments the ledger has room for beyond SLACK, up
        to its start size; the slots added."""
        if not self.lent_segments:
            return 0
        room = self.ledger.budget - self.ledger.used - SLACK_SEGMENTS * self.segment_bytes
        k = min(int(room // self.segment_bytes), self.lent_segments)
        if k <= 0:
            return 0
        have = self.cache.n_slots
        n = min(self.start_slots, have + k * self.per)
        self.ledger.used += (n - have) * self.cache.layout.slot_bytes
        self._resize(n)
        self.reclaims += 1
        note(
            f"kv-grow: the expert cache took back {k} segment(s); it holds {n:,} of {self.start_slots:,} "
            "slots"
        )
        return n - have

    def status(self) -> dict[str, int]:
        """/v1/status's `kv_grow`: slots at start and now, bytes lent to the KV, lends and reclaims so far."""
        return {
            "slots_start": self.start_slots,
            "slots": self.cache.n_slots,
            "lent_bytes": (self.start_slots - self.cache.n_slots) * self.cache.layout.slot_bytes,
            "lends": self.lends,
            "reclaims": self.reclaims,
        }

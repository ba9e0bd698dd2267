"""Which experts the cache's slots keep: pure functions of the routing stream, so the simulator (sim.py)
replays exactly what a policy would do.

A policy covers every MoE layer at once ([L, E] arrays, one numpy pass per window: the GPU learns between
decode windows of ~10 ms, so a per-layer Python loop would cost more than it saves). Layer l keeps at most
`slots[l]` experts. The cache changes between windows, never inside one: a window's lookups hit or miss
against `resident` as the window found it, and `update` then learns from the window's routing and decides
what the slots hold next (a simulator that gives every token a window of its own sees the per-token policy).

- `static`: a fixed set (a routing profile's most used experts, or the fill); never swaps.
- `lru`: every expert a window used is admitted, evicting the least recently used; the set after a window is
  each layer's `slots` most recently used experts, as an ordered per-token LRU would hold.
- `adaptive`: a decayed use count per expert (`score = score * decay + uses`, per token), the recency of LRU
  and the frequency of a profile in one number; a newcomer takes a slot only when its score beats the
  resident it would evict by `margin` (hysteresis: an expert seen once does not push out one that is used all
  the time).

Both admit through `_admit`: each layer's candidates, best first, are paired with its free slots and then
with its residents, worst first; a pair swaps while the candidate wins. `budget` caps the experts brought in
by one update over all layers (each one a copy over PCIe), the best candidates first.

Legend: L = MoE layers, E = experts per layer, T = tokens of a window, A = experts a token routes to.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

POLICIES = ("static", "lru", "adaptive")


class Policy(Protocol):
    """`resident` [L, E] is what the slots hold during a window; `update` learns from the window's routing
    [T, L, A] (in token order) and changes `resident`, bringing in at most `budget` experts (None: no cap)."""

    resident: np.ndarray  # bool [L, E]

    def update(self, ids: np.ndarray, budget: int | None = None) -> None: ...

    def resized(self, resident: np.ndarray) -> None:
        """The cache changed size (--kv-grow): it now holds `resident`, each layer as many as it holds."""


def window_hits(p: Policy, ids: np.ndarray) -> np.ndarray:
    """Per layer [L], the lookups of a window's routed ids [T, L, A] that found their expert resident."""
    layer = np.arange(ids.shape[1])[None, :, None]
    return p.resident[layer, ids].sum(axis=(0, 2))


def _admit(
    resident: np.ndarray,
    prio: np.ndarray,
    cand: np.ndarray,
    slots: np.ndarray,
    margin: float,
    budget: int | None,
) -> None:
    """Swap candidates (bool [L, E], not resident) in, in place: per layer the best candidates fill free
    slots, then replace the weakest residents while `prio[c] > prio[r] * (1 + margin)`."""
    if budget == 0:
        return
    grow = 1.0 + margin
    n_l = len(slots)
    free = slots - resident.sum(axis=1)  # [L]
    weakest = np.where(resident, prio, np.inf).min(axis=1)
    best = np.where(cand, prio, -np.inf).max(axis=1)
    # only candidates that beat their layer's weakest resident (or find a free slot) can enter, and only
    # residents that lose to their layer's best candidate can leave: both sets are small once the cache
    # settled
    cr, ce = np.nonzero(cand & ((prio > (weakest * grow)[:, None]) | (free > 0)[:, None]))
    if not len(cr):
        return
    cv = prio[cr, ce]
    o = np.lexsort((-cv, cr))  # by layer, best first
    cr, ce, cv = cr[o], ce[o], cv[o]
    rr, re = np.nonzero(resident & (prio * grow < best[:, None]))
    rv = prio[rr, re]
    o = np.lexsort((rv, rr))  # by layer, weakest first
    rr, re, rv = rr[o], re[o], rv[o]
    r_start = np.searchsorted(rr, np.arange(n_l))
    r_count = np.bincount(rr, minlength=n_l)
    c_start = np.searchsorted(cr, cr)
    j = (
        np.arange(len(cr)) - c_start - free[cr]
    )  # candidate takes a free slot (j < 0) or its layer's j-th weakest
    has = (j >= 0) & (j < r_count[cr])
    paired = np.full(len(cr), np.inf)
    paired[has] = rv[r_start[cr[has]] + j[has]]
    ok = (j < 0) | (has & (cv > paired * grow))
    fails = np.cumsum(~ok)
    ok &= fails == fails[c_start] - (~ok)[c_start]  # no failure earlier in its layer: a prefix per layer
    took = np.flatnonzero(ok)
    if budget is not None and len(took) > budget:  # the best candidates over all layers get the copies
        took = np.sort(took[np.argsort(-cv[took], kind="stable")[:budget]])
    resident[cr[took], ce[took]] = True
    out = np.maximum(0, np.bincount(cr[took], minlength=n_l) - free)  # [L]: residents each layer gives up
    gone = np.arange(len(rr)) - r_start[rr] < out[rr]
    resident[rr[gone], re[gone]] = False


class Static:
    def __init__(self, resident: np.ndarray) -> None:
        self.resident = np.asarray(resident, bool).copy()

    def update(self, ids: np.ndarray, budget: int | None = None) -> None:
        pass

    def resized(self, resident: np.ndarray) -> None:
        self.resident = np.asarray(resident, bool).copy()


class _Sized:
    """Lru's and Adaptive's per-layer slot counts follow the cache's size."""

    slots: np.ndarray
    resident: np.ndarray

    def resized(self, resident: np.ndarray) -> None:
        self.resident = np.asarray(resident, bool).copy()
        self.slots = self.resident.sum(axis=1).astype(np.int64)


class Lru(_Sized):
    """Recency as a stamp per (layer, expert): the i-th lookup of a window gets clock + i."""

    def __init__(self, slots: np.ndarray, start: np.ndarray) -> None:
        self.slots = np.asarray(slots, np.int64)
        self.resident = np.asarray(start, bool).copy()
        self.stamp = np.full(start.shape, -np.inf)
        for li, row in enumerate(self.resident):  # the fill's experts, lowest id least recent
            held = np.flatnonzero(row)
            self.stamp[li, held] = np.arange(len(held)) - len(held)
        self.clock = 0

    def update(self, ids: np.ndarray, budget: int | None = None) -> None:
        t, n_l, a = ids.shape
        n_e = self.stamp.shape[1]
        key = (np.arange(n_l)[None, :, None] * n_e + ids).reshape(
            -1
        )  # (t, l, slot) order: later is more recent
        order = np.broadcast_to(
            self.clock + np.arange(t)[:, None, None] * a + np.arange(a), ids.shape
        ).reshape(-1)
        uniq, last = np.unique(key[::-1], return_index=True)  # each expert's last lookup of the window
        self.stamp.reshape(-1)[uniq] = order[::-1][last]
        used = self.stamp >= self.clock
        self.clock += t * a
        _admit(self.resident, self.stamp, used & ~self.resident, self.slots, 0.0, budget)


class Adaptive(_Sized):
    # decay 0.85 measured best of 0.8-0.9 on the calibrated synthetic trace (tests/test_tier_sim.py)
    def __init__(
        self, slots: np.ndarray, start: np.ndarray, decay: float = 0.85, margin: float = 0.25
    ) -> None:
        self.slots = np.asarray(slots, np.int64)
        self.decay, self.margin = decay, margin
        self.resident = np.asarray(start, bool).copy()
        self.score = np.zeros(start.shape)

    def update(self, ids: np.ndarray, budget: int | None = None) -> None:
        t, n_l, _ = ids.shape
        self.score *= self.decay**t
        w = np.broadcast_to((self.decay ** np.arange(t - 1, -1, -1.0))[:, None, None], ids.shape).reshape(-1)
        key = (np.arange(n_l)[None, :, None] * self.score.shape[1] + ids).reshape(-1)
        self.score += np.bincount(key, weights=w, minlength=self.score.size).reshape(self.score.shape)
        _admit(self.resident, self.score, ~self.resident & (self.score > 0), self.slots, self.margin, budget)


def check_policy(name: str, flag: str = "--cache-policy") -> None:
    if name not in POLICIES:
        from strata.errors import ConfigError

        raise ConfigError(flag, name, f"must be one of {', '.join(POLICIES)}")


def make(
    name: str,
    slots: np.ndarray | int,
    n_expert: int,
    profile: np.ndarray | None = None,
    start: np.ndarray | None = None,
    n_layers: int = 1,
) -> Policy:
    """A policy over every layer. `start` [L, E] bool: what the slots hold at the start (the engine's fill),
    which every policy takes over, each layer keeping as many slots; else `slots` per layer, empty at the
    start except for static, whose set is each layer's `slots` most used experts in `profile` (use counts
    [L, E])."""
    if start is None:
        n_l = profile.shape[0] if profile is not None else n_layers
        per = np.broadcast_to(np.asarray(slots, np.int64), (n_l,))
        start = np.zeros((n_l, n_expert), bool)
        if name == "static" and profile is not None:
            for li, k in enumerate(per.tolist()):
                start[li, np.argsort(-profile[li], kind="stable")[:k]] = True
    else:
        per = start.sum(axis=1)
    if name == "static":
        return Static(start)
    if name == "lru":
        return Lru(per, start)
    if name == "adaptive":
        return Adaptive(per, start)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")

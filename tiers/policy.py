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
- `adaptive`: each expert's expected uses while it holds a slot, from two time scales: recency (the tokens
  it has left in the recent window that routing keeps reusing from) and a slowly decayed popularity (how often
  it comes back to that window after leaving it). A newcomer takes a slot only when its score beats the
  resident it would evict by `margin` (hysteresis: no copy for a near tie). See Adaptive for the formula.

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
    """Per token and layer [T, L], the lookups of a window's routed ids [T, L, A] that found their expert
    resident."""
    layer = np.arange(ids.shape[1])[None, :, None]
    return p.resident[layer, ids].sum(axis=2)


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
    """Scores (layer, expert) by the uses it can expect, discounted, and keeps each layer's best.

    Why this score: routing reuses, with a high chance, experts of the last few tokens, picked about evenly
    among them, and otherwise draws from a skewed popularity that drifts slowly (tiers/trace.py's router,
    calibrated on published traces). So an expert used within the last `window` tokens ("recent") is used
    next at a rate p = q + z, q the layer's reuse rate shared by its recent experts, z its own popularity;
    one that left the window only at rate z. A decayed use count mixes the two (a burst of reuse looks
    like popularity) and lost to LRU at 64 slots; LRU alone keeps recent experts but nothing of popularity.

    - z: returns per token away, `came / away` over decayed counts (time scale 1 / (1 - decay) tokens, the
      popularity drifts slowly): a return is a use after more than `window` tokens away, so reuse bursts
      do not count; shrunk toward the layer's pooled rate by `prior` tokens so that one return is no proof.
    - q: the lookups per token that returns do not explain, spread over the layer's recent experts.
    - left: tokens an expert still stays recent without another use (0 once it left).
    - g: the horizon, 1 - (copies per token) / slots: how long an expert will hold its slot. With few slots
      that is a few tokens, so popularity decides; with many, whether it leaves the window does.

    score = p - (g (1 - p))^left (p - z): the discounted use rate while recent, less what is lost if the
    window closes before the next use (the chance to stay unused for `left` tokens, discounted), after which
    only z remains. Measured on the calibrated trace (tests/test_tier_sim.py), it hits at least as often as
    LRU at 32-256 slots with no more copies; decay 0.999 and prior 50 the best of 0.995-0.9995 and 10-200;
    margin 0.05 brings the copies at 32 slots to half of LRU's (0.6-0.8 of them without it), hits within the
    noise of a few tens.

    The window: at least `window` tokens (16, the calibrated trace's reuse), and per_slot * slots / top-k with
    more slots. Routing whose experts drift (the synth locality router at the published LRU and static
    figures, perf/README.md) keeps an expert in use for ~50 tokens; a 16-token window then scores experts a
    large cache should keep as gone, and lost to LRU by 3.8 and 2.4 points at 128 and 232 slots. A window of
    3 slots / top-k is about how long an expert stays in an LRU of that size at the published hit rates (a
    third of the lookups new): there it hits as LRU does at 64-256 slots with a fifth fewer copies, and on
    the calibrated trace it keeps to at least LRU.

    Only experts the window used are candidates (a copy is made for a lookup that missed, as LRU does)."""

    def __init__(
        self,
        slots: np.ndarray,
        start: np.ndarray,
        decay: float = 0.999,
        margin: float = 0.05,
        window: int = 16,
        prior: float = 50.0,
        per_slot: float = 3.0,
    ) -> None:
        self.slots = np.asarray(slots, np.int64)
        self.decay, self.margin, self.window, self.prior = decay, margin, window, prior
        self.per_slot = per_slot
        self.resident = np.asarray(start, bool).copy()
        self.last = np.full(start.shape, -np.inf)  # token of the last use
        self.came = np.zeros(start.shape)  # decayed returns
        self.away = np.zeros(start.shape)  # decayed tokens spent out of the window: the returns' exposure
        self.turnover = np.zeros(start.shape[0])  # copies per token [L]; ~50 tokens of memory follow a resize
        self.clock = 0

    def update(self, ids: np.ndarray, budget: int | None = None) -> None:
        t, n_l, a = ids.shape
        c, n_e = self.clock, self.last.shape[1]
        w = np.maximum(self.window, np.round(self.per_slot * self.slots / a))[:, None]  # [L, 1]: the window
        wf = np.broadcast_to(w, self.last.shape).reshape(-1)
        key = (np.arange(n_l)[None, :, None] * n_e + ids).reshape(-1)
        tok = np.broadcast_to(c + np.arange(t)[:, None, None], ids.shape).reshape(-1)
        uniq, first = np.unique(key, return_index=True)  # each expert's first use in the window
        last = self.last.reshape(-1)
        # an expert is away from its last use + window + 1 until its next use; a window longer than `window`
        # tokens could see it leave and return again: counted once (prefill), decode windows are shorter
        until = np.full(last.size, float(c + t))
        until[uniq] = tok[first]
        fade = self.decay**t
        self.away *= fade
        self.away += np.maximum(until - np.maximum(c, last + wf + 1), 0).reshape(self.away.shape)
        came = np.zeros(last.size)
        came[uniq] = (tok[first] - last[uniq] > wf[uniq]) * self.decay ** (c + t - 1 - tok[first])
        self.came *= fade
        self.came += came.reshape(self.came.shape)
        np.maximum.at(last, key, tok)
        self.clock = c + t
        pooled = self.came.sum(axis=1, keepdims=True) / np.maximum(self.away.sum(axis=1, keepdims=True), 1.0)
        z = (self.came + self.prior * pooled) / (self.away + self.prior)
        left = (self.last - (self.clock - 1 - w)).reshape(-1)
        # only the recent experts need p and the power (the costly part); the others score z
        at = np.flatnonzero(left > 0)
        row = at // self.last.shape[1]
        q = np.maximum(a - z.sum(axis=1), 0) / np.maximum(np.bincount(row, minlength=n_l), 1)
        g = np.clip(1 - self.turnover / np.maximum(self.slots, 1), 0.0, 1.0)
        zr = z.reshape(-1)[at]
        p = np.minimum(q[row] + zr, 1.0)
        score = z.copy()
        score.reshape(-1)[at] = p - (g[row] * (1 - p)) ** left[at] * (p - zr)
        before = self.resident.copy()
        _admit(self.resident, score, ~self.resident & (self.last >= c), self.slots, self.margin, budget)
        f = 0.98**t
        self.turnover = self.turnover * f + (1 - f) / t * (self.resident & ~before).sum(axis=1)


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

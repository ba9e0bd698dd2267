"""Replay a routing trace through a cache policy: hit rates per layer and overall, and the swaps it made.

`simulate(ids, n_expert, slots, policy)`: each layer gets `slots` slots (one policy covers them all); the
static policy's set comes from the first `profile_share` of the trace (a profile learned on part of the
workload), and every policy is scored on the rest, so they are compared on the same tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from strata.tiers import policy


@dataclass(frozen=True, slots=True)
class Result:
    policy: str
    slots: int  # per layer
    lookups: int
    hits: int
    swaps: int  # experts brought into slots between windows (each one a copy)
    per_layer: list[float]  # hit rate of each layer

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def json(self) -> dict[str, object]:
        return {**asdict(self), "hit_rate": self.hit_rate}


def simulate(ids: np.ndarray, n_expert: int, slots: int, name: str, profile_share: float = 0.5,
             resident: np.ndarray | None = None, windows: np.ndarray | None = None,
             budget: int | None = None) -> Result:
    """ids [T, L, A]: the trace; slots per layer; each token its own window unless `windows` (tokens per
    window, as the engine's passes were) says otherwise; `budget`: experts brought in per window at most.
    `resident` [L, E]: the placement the engine started from (then the whole trace is scored, as the engine's
    own counters were)."""
    t, n_l, a = ids.shape
    split = 0 if resident is not None else int(t * profile_share)
    head, tail = ids[:split], ids[split:]
    counts = np.stack([np.bincount(head[:, li].reshape(-1), minlength=n_expert) for li in range(n_l)])
    p = policy.make(name, slots, n_expert, counts, resident)
    for row in head:  # warm the cache on the profile part; not scored
        p.update(row[None], budget)
    bounds = np.cumsum(windows if windows is not None else np.ones(t, np.int64))[:-1]
    hits, swaps = np.zeros(n_l, np.int64), 0
    for w in np.split(tail, bounds[bounds > split] - split if resident is None else bounds):
        hits += policy.window_hits(p, w)
        before = p.resident.copy()
        p.update(w, budget)
        swaps += int((p.resident & ~before).sum())  # experts copied in between windows, as the engine does
    per_layer = (hits / max(len(tail) * a, 1)).tolist()
    return Result(name, slots, len(tail) * n_l * a, int(hits.sum()), swaps, per_layer)


def sweep(ids: np.ndarray, n_expert: int, sizes: list[int], names: tuple[str, ...] = policy.POLICIES) -> list[Result]:
    """The hit-rate vs cache-size curve of every policy."""
    return [simulate(ids, n_expert, s, n) for s in sizes for n in names]

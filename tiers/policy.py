"""Which experts a layer's slots keep: pure functions of the routing stream, so the simulator (sim.py) replays
exactly what a policy would do.

A policy sees one token's routed experts of one layer at a time (`step(ids) -> hits`) and keeps at most
`slots` experts resident.

- `static`: a fixed set (a routing profile's most used experts); never swaps.
- `lru`: every miss is admitted, evicting the least recently used.
- `adaptive`: a decayed use count per expert (`score = score * decay + uses`), the recency of LRU and the
  frequency of a profile in one number; a miss is admitted only when its score beats the weakest resident's
  by `margin` (hysteresis: an expert seen once does not push out one that is used all the time), so it
  swaps far less than LRU for the same or a better hit rate.

Legend: E = experts per layer, A = experts a token routes to, S = slots.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np

POLICIES = ("static", "lru", "adaptive")


class Policy(Protocol):
    swaps: int  # experts admitted after the initial fill

    def step(self, ids: np.ndarray) -> int:
        """One token's routed experts [A] of this layer: how many were resident (then update)."""


class Static:
    def __init__(self, resident: np.ndarray) -> None:
        self.resident = {int(e) for e in resident}
        self.swaps = 0

    def step(self, ids: np.ndarray) -> int:
        return sum(int(e) in self.resident for e in ids)


class Lru:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.order: OrderedDict[int, None] = OrderedDict()
        self.swaps = 0

    def step(self, ids: np.ndarray) -> int:
        hits = 0
        for e in (int(v) for v in ids):
            if e in self.order:
                hits += 1
                self.order.move_to_end(e)
            elif self.slots:
                if len(self.order) >= self.slots:
                    self.order.popitem(last=False)
                    self.swaps += 1
                self.order[e] = None
        return hits


class Adaptive:
    def __init__(self, slots: int, n_expert: int, decay: float = 0.9, margin: float = 0.25) -> None:
        self.slots = slots
        self.decay, self.margin = decay, margin
        self.score = np.zeros(n_expert, np.float64)  # [E]
        self.resident = np.zeros(n_expert, bool)  # [E]
        self.swaps = 0

    def step(self, ids: np.ndarray) -> int:
        hits = int(self.resident[ids].sum())
        self.score *= self.decay
        self.score[ids] += 1.0
        for e in ids[~self.resident[ids]]:  # misses, in routing order
            n = int(self.resident.sum())
            if n < self.slots:
                self.resident[e] = True
                continue
            if not self.slots:
                continue
            held = np.flatnonzero(self.resident)
            weakest = held[np.argmin(self.score[held])]
            if self.score[e] > self.score[weakest] * (1.0 + self.margin):
                self.resident[weakest], self.resident[e] = False, True
                self.swaps += 1
        return hits


def make(name: str, slots: int, n_expert: int, profile: np.ndarray | None = None) -> Policy:
    """A policy for one layer; `profile` (use counts [E]) picks the static set."""
    if name == "static":
        counts = profile if profile is not None else np.zeros(n_expert)
        return Static(np.argsort(-counts, kind="stable")[:slots])
    if name == "lru":
        return Lru(slots)
    if name == "adaptive":
        return Adaptive(slots, n_expert)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")

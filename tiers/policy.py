"""Which experts a layer's slots keep: pure functions of the routing stream, so the simulator (sim.py) replays
exactly what a policy would do.

A policy keeps at most `slots` experts of a layer resident. The cache changes between windows, never
inside one: a window's lookups hit or miss against `resident` as the window found it, and `update` then
learns from the window's routing, token by token, and decides what the slots hold next (a simulator that
gives every token a window of its own sees the classic per-token policy).

- `static`: a fixed set (a routing profile's most used experts); never swaps.
- `lru`: every miss is admitted, evicting the least recently used.
- `adaptive`: a decayed use count per expert (`score = score * decay + uses`), the recency of LRU and the
  frequency of a profile in one number; a miss is admitted only when its score beats the weakest resident's
  by `margin` (hysteresis: an expert seen once does not push out one that is used all the time), so it
  hits about as often as LRU on the calibrated synthetic trace (tests/test_tier_sim.py).

Legend: E = experts per layer, A = experts a token routes to, S = slots.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np

POLICIES = ("static", "lru", "adaptive")


class Policy(Protocol):
    """One layer's cache: `resident` [E] is what the layer's slots hold during a window; `update` learns from
    the window's routing [T, A] (in token order) and changes `resident` between windows."""

    resident: np.ndarray  # bool [E]

    def update(self, ids: np.ndarray) -> None: ...


def window_hits(p: Policy, ids: np.ndarray) -> int:
    """Lookups of a window's routed ids [T, A] that found their expert resident."""
    return int(p.resident[ids].sum())


class Static:
    def __init__(self, resident: np.ndarray, n_expert: int) -> None:
        self.resident = np.zeros(n_expert, bool)
        self.resident[np.asarray(resident, np.int64)] = True

    def update(self, ids: np.ndarray) -> None:
        pass


class Lru:
    def __init__(self, slots: int, n_expert: int) -> None:
        self.slots = slots
        self.order: OrderedDict[int, None] = OrderedDict()
        self.resident = np.zeros(n_expert, bool)

    def update(self, ids: np.ndarray) -> None:
        for e in (int(v) for v in np.asarray(ids).reshape(-1)):
            if e in self.order:
                self.order.move_to_end(e)
            elif self.slots:
                if len(self.order) >= self.slots:
                    old, _ = self.order.popitem(last=False)
                    self.resident[old] = False
                self.order[e] = None
                self.resident[e] = True


class Adaptive:
    # decay 0.85 measured best of 0.8-0.9 on the calibrated synthetic trace (tests/test_tier_sim.py)
    def __init__(self, slots: int, n_expert: int, decay: float = 0.85, margin: float = 0.25) -> None:
        self.slots = slots
        self.decay, self.margin = decay, margin
        self.score = np.zeros(n_expert, np.float64)  # [E]
        self.resident = np.zeros(n_expert, bool)  # [E]

    def update(self, ids: np.ndarray) -> None:
        for row in np.asarray(ids).reshape(-1, np.asarray(ids).shape[-1]):  # one token at a time
            self.score *= self.decay
            self.score[row] += 1.0
            for e in row[~self.resident[row]]:  # misses, in routing order
                if int(self.resident.sum()) < self.slots:
                    self.resident[e] = True
                    continue
                if not self.slots:
                    continue
                held = np.flatnonzero(self.resident)
                weakest = held[np.argmin(self.score[held])]
                if self.score[e] > self.score[weakest] * (1.0 + self.margin):
                    self.resident[weakest], self.resident[e] = False, True


def check_policy(name: str, flag: str = "--cache-policy") -> None:
    if name not in POLICIES:
        from strata.errors import ConfigError

        raise ConfigError(flag, name, f"must be one of {', '.join(POLICIES)}")


def make(name: str, slots: int, n_expert: int, profile: np.ndarray | None = None,
         start: np.ndarray | None = None) -> Policy:
    """A policy for one layer; `profile` (use counts [E]) picks the static set; `start` [E] bool: what the
    slots hold at the start (the engine's fill), which every policy then takes over."""
    if start is not None:  # the slots are those the fill gave the layer
        p = make(name, int(np.count_nonzero(start)), n_expert)
        held = np.flatnonzero(start)
        if isinstance(p, Lru):
            p.order.update((int(e), None) for e in held)
        elif isinstance(p, Static):
            p.resident[:] = False
        p.resident[held] = True
        return p
    if name == "static":
        counts = profile if profile is not None else np.zeros(n_expert)
        return Static(np.argsort(-counts, kind="stable")[:slots], n_expert)
    if name == "lru":
        return Lru(slots, n_expert)
    if name == "adaptive":
        return Adaptive(slots, n_expert)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")

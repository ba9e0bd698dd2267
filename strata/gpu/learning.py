"""The GPU side of a cache that learns (`--cache-policy lru|adaptive`, tiers/policy.py): counting each pass's
routing, letting the policy choose swaps beside the next pass, and bringing the newcomers in.

`tier_count` leaves each pass's routed ids in `routes`, each hit marked (kernels/tiers.py ROUTE_HIT), so the
per-layer counts are the device's own. Every LEARN_EVERY passes the policy learns from them and picks at most
the swap budget's experts to bring in, while the GPU runs the next pass (`overlap`, called between a pass's
launch and its wait). A swap points the leaving expert's table entries at the arena (a patch queued behind the
running pass, so every later pass reads it from there) and brings the newcomer in one of two ways:

- riding (tiers/ride.py), where the decode graph reads misses in place: the newcomer waits in its slot's
  booking until a decode pass routes it, whose `admit` launch copies the bytes it reads into the slot and
  flips the table; the host lands it after that pass. A rider waits until routed, or until the policy lets it
  go.
- by copy, with the arena in pageable memory (the graph reads none of it), and for the riders still waiting
  when the cache resizes (`quiesce`): the copy stream fills the slot once the running pass is done with it,
  and `publish` flips the newcomer's entries at the first pass that starts after the copy landed.

Decode never waits for a swap, nor for the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.gpu.kernels import tiers as kt
from strata.gpu.ops import GEMV_ROWS
from strata.gpu.runtime import cupy_module, ptr
from strata.gpu.slots import engine_copies
from strata.tiers.layout import ExpertLayout
from strata.tiers.ride import Placement
from strata.tiers.slots import ExpertCache
from strata.tiers.trace import Recorder

# passes per policy window: a decode pass is ~10 ms at b=1, and an update of every layer's policy 1-4 ms of
# host time (2-core machine, 4-token windows; it runs beside the next pass); the budget of a window is this
# many passes' worth
LEARN_EVERY = 4


@dataclass(frozen=True, slots=True)
class RideHook:
    """What a decode MoE layer's `admit` launch reads: its rows of the decode table, `pend` and `arrive`."""

    table: Any  # device address of int64 [3, E]
    pend: Any  # device address of int64 [3, E]
    arrive: Any  # device address of int32 [E]
    part_bytes: tuple[int, int, int]
    n_expert: int


def split_routes(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tier_count's route rows [L, n, A]: (the expert ids, whether each was a hit)."""
    return raw & (kt.ROUTE_HIT - 1), (raw & kt.ROUTE_HIT) != 0


class PolicySide:
    """GpuTiers' cache policy: learning between windows and the swaps it starts."""

    cache: ExpertCache
    layout: ExpertLayout
    table: Any
    routes: Any
    lookahead: Any
    copy_stream: Any
    pageable: bool

    def _start_policy(self) -> None:
        """After the tables are on the device: the policy's state; the riders' arrays when newcomers ride."""
        cp = cupy_module()
        self._seen: list[np.ndarray] = []  # routed ids [n, L, A] of this policy window's passes
        self._passes = 0
        self._learn_due = False  # a policy window is complete: learn from it beside the next pass
        self._swapping: list[tuple[list[Placement], Any]] = []  # placements, their copies' event
        self.ride_on = self.cache.policy is not None and not self.pageable
        n_l, n_e = len(self.layout.layers), self.layout.n_expert
        self.pend = cp.zeros((n_l, 3, n_e) if self.ride_on else (1,), cp.int64)
        self.arrive = cp.zeros((n_l, n_e) if self.ride_on else (1,), cp.int32)
        self._pass_riders = self.cache.riders()  # [L, E] what the device held for the last pass published

    def ride_hook(self, li: int) -> RideHook | None:
        """Layer li's `admit` arguments, when newcomers ride decode passes."""
        if not self.ride_on:
            return None
        n_e = self.layout.n_expert
        return RideHook(
            ptr(self.table, 8 * li * 3 * n_e),
            ptr(self.pend, 8 * li * 3 * n_e),
            ptr(self.arrive, 4 * li * n_e),
            tuple(int(v) for v in self.cache.sizes[li]),  # type: ignore[arg-type]
            n_e,
        )

    def quiesce(self) -> None:
        """Before the cache resizes (--kv-grow): no rider left waiting, every swap's copy done and landed."""
        if self.cache.riding.any():
            self._copy(self.cache.stop_riding())
        if self._swapping:
            self.copy_stream.synchronize()
            while self._swapping:
                self.cache.land(self._swapping.pop(0)[0])

    def after_pass(self, n: int) -> None:
        """A pass of n rows is over (its stream synchronised): count its routing per layer and into the
        profile, and every LEARN_EVERY passes let the policy choose swaps and start them."""
        pred = None
        if self._recording_pred(n):
            assert self.lookahead is not None
            pred = self.lookahead.pred[:, :n].get()
            self.lookahead.pred[:, :n].fill(-1)
        self._routed(self.routes[:, :n].get(), self._pass_riders, pred)

    def record_routes(self, path: Path) -> Recorder:
        """--record-routes on the GPU: every pass's routed ids and, on decode rows, the lookahead's
        predictions (set before the decode graphs are captured: their forks copy the picks); a learning
        policy's windows are LEARN_EVERY passes."""
        if self.lookahead is not None:
            self.lookahead.recording = True
        passes = LEARN_EVERY if self.cache.policy is not None else 1
        return self.cache.record(path, self.lookahead.k if self.lookahead is not None else 0, passes)

    def _recording_pred(self, n: int) -> bool:
        """Whether a pass of n rows hands the lookahead's predictions to --record-routes (decode rows)."""
        ahead = self.lookahead
        return self.cache.recorder is not None and ahead is not None and n <= ahead.pred.shape[1]

    def _routed(self, raw: np.ndarray, riders: np.ndarray, pred: np.ndarray | None = None) -> None:
        """One pass's route rows [L, n, A] (ids, hits marked), with the riders [L, E] the device held for it;
        pred: the lookahead's predictions [L, n, A] (-1 where a layer did not predict), when routes are
        recorded. Riders a decode pass routed landed in it."""
        c = self.cache
        routed, hit = split_routes(raw)
        ids = routed.transpose(1, 0, 2)  # [n, L, A]
        c.layer_lookups += hit.shape[1] * hit.shape[2]
        c.layer_hits += hit.sum(axis=(1, 2))
        if self.ride_on and routed.shape[1] <= GEMV_ROWS:
            c.land_rides(routed, riders)
        if c.profile is not None:
            c.profile.add_all(ids)
        if c.recorder is not None:
            c.recorder.end_pass(list(routed), None if pred is None else list(pred))
        if c.policy is None:
            return
        self._seen.append(ids)
        self._passes += 1
        self._learn_due = self._passes % LEARN_EVERY == 0

    def overlap(self) -> None:
        """A pass has been launched: learn from the last policy window meanwhile and start its swaps."""
        if not self._learn_due:
            return
        self._learn_due = False
        moves = self.cache.learn(np.concatenate(self._seen).astype(np.int64))
        self._seen.clear()
        if not moves:
            return
        if self.ride_on:
            self.cache.ride(moves)
            self._push()  # behind the running pass: the next one reads the leavers from the arena
        else:
            self._copy(moves)

    def _copy(self, moves: list[Placement]) -> None:
        """Point the leavers at the arena behind the running pass, then fill the slots on the copy stream once
        that pass is done with them; `publish` lands them when the copies are done."""
        cp = cupy_module()
        rows = self.cache.release(moves)
        self._push()
        after = cp.cuda.Event(disable_timing=True)
        after.record()  # the running pass and the patch: the slots are free from here
        self.copy_stream.wait_event(after)
        engine_copies(rows, self.layout.strides, self.copy_stream)
        done = cp.cuda.Event(disable_timing=True)
        done.record(self.copy_stream)
        self._swapping.append((moves, done))

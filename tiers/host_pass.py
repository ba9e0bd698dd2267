"""ExpertCache's forward pass on the host (the CPU stand-in; the GPU counts on the device, gpu/tiers.py):
each MoE layer's table for the pass (its misses staged first when the pass borrows), the routed ids counted
per row, the lookahead's staging slots, and the pass's end, which gives borrowed slots back and credits the
counts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from strata.tiers.lookahead import AHEAD_ROWS, pick, score

if TYPE_CHECKING:
    from strata.tiers.borrow import Staging
    from strata.tiers.telemetry import TierUse

# per-row counts: lookups, hits, PCIe bytes, CPU expert calls, experts read from the mapping, their bytes
COLS = 6


class HostPass:
    """The pass's state lives on ExpertCache (its __init__ makes it); these are its methods."""

    _rows: np.ndarray  # [N, COLS] this pass's per-row counts
    _staging: Staging | None
    _ahead: Any  # (layer, picked experts, its table) while a lookahead's staging serves a layer

    def begin_pass(self, n_rows: int) -> None:
        """A pass over n_rows tokens starts: zero its counters, and borrow slots if it is long enough."""
        self._rows = np.zeros((n_rows, COLS), np.int64)
        self._pass_ids = [None] * len(self.layout.layers)
        self._pass_pred = [None] * len(self.layout.layers)
        self._staging = self.staging() if n_rows >= self.borrow_min else None
        self._staged = np.zeros(3, np.int64)
        self.predicting = (
            self.ahead_k > 0
            and n_rows <= AHEAD_ROWS
            and self._staging is None
            and self.resident() < self.layout.n_total
        )

    def layer_table(self, li: int) -> np.ndarray:
        """The addresses [P, E] MoE layer li reads this pass (its misses staged first when borrowing)."""
        if self._ahead is not None and self._ahead[0] == li:
            return self._ahead[2]
        if self._staging is None:
            return self.full[li]
        rows = self.stage_rows(self._staging, li)
        self.slots.copy_rows(rows)
        self._staged += self.staged_counts(self._staging, li, rows)
        return self._staging.table[li]

    def count_rows(self, li: int, ids: np.ndarray) -> None:
        """Count the routed ids [T, A] of MoE layer li into this pass's per-row counters (and record them)."""
        if self.recorder is not None or self.policy is not None:
            self._pass_ids[li] = np.asarray(ids)
        if self.profile is not None:
            self.profile.add(li, ids)
        hit = self.where[li][ids] >= 0  # [T, A]
        self.layer_lookups[li] += hit.size
        self.layer_hits[li] += int(hit.sum())
        # a miss only the mapping holds is read in place, as the GPU's CPU pool reads it: a CPU call
        mapped = ~hit & ~self.in_ram[li][ids]  # [T, A]
        if self._staging is not None:
            mapped &= ~self._staging.staged[li][ids]
        n_mapped = mapped.sum(axis=1)
        self._rows[:, 0] += ids.shape[1]
        self._rows[:, 1] += hit.sum(axis=1)
        self._rows[:, 2] += ((~hit).sum(axis=1) - n_mapped) * self.expert_bytes[li]
        self._rows[:, 3] += n_mapped
        self._rows[:, 4] += n_mapped
        self._rows[:, 5] += n_mapped * self.expert_bytes[li]

    def stage_ahead(self, li: int, pred: np.ndarray) -> None:
        """Before MoE layer li's mixer: copy up to K of its predicted misses (pred [T, A], each row's best
        first) into the staging slots; its experts then read each staged one from there (`layer_table`)."""
        assert self._ahead_store is not None
        self._pass_pred[li] = np.asarray(pred)
        picked = pick(pred, (self.where[li] < 0) & ~self.cpu[li], self.ahead_k)
        table = self.full[li].copy()  # [P, E]
        rows = []
        for k, e in enumerate(picked.tolist()):
            for p in range(3):
                dst = self._ahead_store.addr(p, k)
                rows.append((int(self._arena_row(li, p, e)), dst, int(self.sizes[li, p])))
                table[p, e] = dst
        t = time.perf_counter_ns()
        if rows:
            self._ahead_store.copy_rows(np.asarray(rows, np.int64))
        self._ahead = (li, picked, table)
        self._ahead_ns = time.perf_counter_ns() - t

    def settle_ahead(self, li: int, ids: np.ndarray) -> None:
        """After layer li's routing ids [T, A]: count what its staging served, and drop it."""
        if self._ahead is None or self._ahead[0] != li:
            return
        self.prefetch.add(*score(self._ahead[1], ids, int(self.expert_bytes[li])), self._ahead_ns)
        self._ahead = None

    def end_pass(self, states: list[TierUse], lens: list[int]) -> None:
        """Give borrowed slots back and credit each sequence (rows in order, lens[i] each) its counts."""
        if self._staging is not None:
            self.slots.copy_rows(self.restore_rows(self._staging))
            self._staging = None
        self._ahead = None
        if self.recorder is not None:
            self.recorder.end_pass(self._pass_ids, self._pass_pred)
        self.settle(self._rows, self._staged, states, lens)
        if self.policy is not None and all(x is not None for x in self._pass_ids):
            self.load(self.learn(np.stack(self._pass_ids, axis=1)))  # type: ignore[arg-type]

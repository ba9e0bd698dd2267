"""Slot borrowing for long prefill chunks, part of the expert cache (tiers/slots.py `ExpertCache`).

Long prefill chunks touch nearly every expert of every layer, and zero-copy reads from the GEMM's tiles
are slow. Instead a chunk of `borrow_min` tokens or more borrows slots: each layer's misses are staged into
borrowed slots before its experts run (double-buffered over layers, so the copy of layer l+1 overlaps layer
l), read from there through a prefill table, and when the chunk ends the borrowed slots get their own experts
back, byte for byte.

Legend: L = MoE layers, E = experts per layer, P = 3 parts, S = slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Prefill chunks of at least this many tokens stage their misses in borrowed slots. From 256 tokens of
# top-10-of-512 routing nearly every expert is used, and one copy of each beats zero-copy reads from the
# GEMM tiles: 80B shape on the H200, pp512 at a 24 GiB budget 458 tok/s zero-copy, 955 borrowing. The GPU
# borrows sooner, from `staging_rows`.
BORROW_MIN = 256


def staging_rows(n_expert: int, top_k: int, zero_copy: float, copy_engine: float, low: int, high: int) -> int:
    """The fewest rows a GPU pass stages its misses at, within [low, high]. A pass of n rows whose experts
    run per (row, expert) pair reads about n * top_k * m experts a layer in place, at the zero-copy rate;
    staging copies every missing expert of the layer once, n_expert * m, at the copy engine's, whatever n
    (m, the share of experts missing, cancels): they cost the same at n = n_expert * zero_copy / (top_k *
    copy_engine). 80B shape at 24 GiB on two H100 hosts (perf/bench_gpu.py, 2026-12-06): zero-copy 50.6
    and 34.5 GB/s, copy engine 55.4 and 55.3, give 47 and 32 rows; per pair and staged measured level at
    about 56 and 30 rows."""
    return min(max(math.ceil(n_expert * zero_copy / (top_k * copy_engine)), low), high)


@dataclass(frozen=True, slots=True)
class Staging:
    """One borrowing prefill chunk: per MoE layer, which experts go to which borrowed slot."""

    table: np.ndarray  # int64 [L, P, E]: the prefill table (staged and borrowed-out experts redirected)
    per_layer: list[list[tuple[int, int]]]  # layer -> [(expert, slot)] to copy before its experts run
    buffers: int  # 2: layer l's copies may start once layer l - 2 has run; 1: once l - 1 has
    restore: list[tuple[int, int, int]]  # (slot, layer, expert): each borrowed slot's own expert
    complete: bool  # every miss of every layer got a borrowed slot (else the rest are read from the arena)
    staged: np.ndarray  # [L, E] bool: the experts staged (read from a borrowed slot this pass)


class Borrowing:
    """ExpertCache's borrowing: which slots a chunk borrows, what goes where, and the copies both ways."""

    where: np.ndarray
    owner: np.ndarray
    full: np.ndarray
    in_ram: np.ndarray
    n_slots: int

    def staging(self) -> Staging | None:
        """Plan a borrowing prefill chunk: which slots to borrow and what to stage where; None when
        every expert is resident or there is no slot to borrow."""
        n_l, n_e = self.where.shape
        missing = n_e - (self.where >= 0).sum(axis=1)  # [L]
        if self.n_slots == 0 or missing.max() == 0:
            return None
        cap0 = int(missing.max())
        cap = cap0 + -(-2 * cap0 // n_l) + 1  # borrowing takes residents away, adding misses
        # a placement that is not the static fill (a profile's, a policy's) gives up residents unevenly over
        # the layers: grow the buffers until every layer's misses fit (80B shape at 24 GiB with a profile's
        # fill: the first guess fell back to one buffer that staged all 512 experts a layer, pp4096 2,209
        # against 6,526)
        while 2 * cap <= self.n_slots:
            plan = self._staging_plan(cap, 2)
            if plan.complete:
                return plan
            cap += max(1, cap // 16)
        plan = self._staging_plan(min(cap, self.n_slots), 1)
        if not plan.complete:  # one buffer of every slot: less overlap, but no miss left to read over PCIe
            plan = self._staging_plan(self.n_slots, 1)
        return plan

    def _staging_plan(self, cap: int, buffers: int) -> Staging:
        n_l, n_e = self.where.shape
        borrowed = sorted(
            self._borrow_order()[: buffers * cap]
        )  # ascending: consecutive misses, consecutive slots
        table = self.full.copy()  # long chunks never use the CPU's share
        restore = []
        gone = np.zeros((n_l, n_e), bool)
        for s in borrowed:
            li, e = (int(v) for v in self.owner[s])
            if li >= 0:
                restore.append((s, li, e))
                gone[li, e] = True
                for p in range(3):
                    table[li, p, e] = self._arena_row(li, p, e)
        per_layer = []
        complete = True
        staged = np.zeros((n_l, n_e), bool)
        for li in range(n_l):
            buf = borrowed[(li % buffers) * cap : (li % buffers + 1) * cap]
            todo = np.flatnonzero((self.where[li] < 0) | gone[li])
            if len(todo) > len(buf):  # short of slots: the ones only the mapping holds first
                complete = False
                todo = np.sort(todo[np.argsort(self.in_ram[li, todo], kind="stable")][: len(buf)])
            pairs = [(int(e), int(s)) for e, s in zip(todo, buf)]
            staged[li, todo] = True
            for e, s in pairs:
                for p in range(3):
                    table[li, p, e] = self._slot_addr(p, s)
            per_layer.append(pairs)
        return Staging(table, per_layer, buffers, restore, complete, staged)

    def _borrow_order(self) -> list[int]:
        """Slots to borrow first: free ones, then the highest. The static fill is expert-major, so the top
        slots hold every layer's highest resident experts: each layer gives up about as many as the others,
        and those experts sit next to the layer's misses in the arena, so a layer's staging copies stay
        contiguous (one copy per part on the GPU)."""
        free = [int(s) for s in np.flatnonzero(self.owner[:, 0] < 0)]
        return free + [s for s in range(self.n_slots - 1, -1, -1) if self.owner[s, 0] >= 0]

    def stage_rows(self, staging: Staging, li: int) -> np.ndarray:
        """The copies [n, 3] that put layer li's staged experts into their borrowed slots."""
        return self._fill_rows([(s, li, e) for e, s in staging.per_layer[li]])

    def restore_rows(self, staging: Staging) -> np.ndarray:
        """The copies [n, 3] that give each borrowed slot its own expert back when the chunk is over."""
        return self._fill_rows(staging.restore)

    def borrowed_residents(self) -> np.ndarray:
        """[L, E] bool: the residents whose slots a long prefill chunk borrows (their bytes come back from
        their home when the chunk ends)."""
        out = np.zeros(self.where.shape, bool)
        st = self.staging()
        for _, li, e in st.restore if st is not None else []:
            out[li, e] = True
        return out

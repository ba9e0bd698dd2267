"""Lookahead prefetch (`--prefetch K`): a decode layer's predicted misses cross PCIe while its mixer runs.

A decode layer is serial: the mixer (attention or DeltaNet), the router, then the experts, whose misses the
GPU reads zero-copy from the pinned arena. On the H200 with the 80B shape at a 24 GiB budget the misses take
~9 ms of a ~13.7 ms token while the link idles through the mixers (~4 ms). Layer l's router applied to the
layer's input (the residual before its mixer; the real router sees it plus the mixer's output) predicts most
of its experts, so a side branch of the decode graph copies up to K predicted misses, best first, into K
staging slots while the mixer runs, pointing the decode table's entries at each copy that lands
(strata/gpu/lookahead.py). When the router is done the branch stops where it is: the experts never wait for
it, and the copies fill the time the mixer leaves. After the experts the entries are put back: every pass
leaves the table as it found it, and the cache's bookkeeping (slots.py) never sees the staging.

A wrong guess costs link time the mixer was not using and nothing else: the router's choice is exact, and a
pick it did not make is simply not read. Decode rows only (passes of up to GEMV_ROWS rows); longer passes
stage or borrow (slots.py).

The CPU stand-in (`--device cpu --expert-cache SIZE --prefetch K`, slots.ExpertCache.stage_ahead) predicts the
same way (the layer's router on its input normed with the FFN norm, before the mixer) and picks the same K
(`pick`), but has no second engine to overlap a copy with: the copy runs in line, before the mixer, so no
amount of it is free and none is cut short by the router. It therefore stages all K picks whole (three parts
each), every pass: the budget is K experts, not a time. That makes its counters a pure function of the
predictions, the residency and K, so a trace that records the predictions replays to them exactly (sim.py);
the GPU, whose copies stop at its router, stages at most that many parts for the same K.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.errors import ConfigError

PREFETCH_MAX = (
    32  # most experts one layer prefetches (the kernel keeps its picks in a shared array this size)
)
STATS = 6  # the device counters PrefetchCounts.add takes, in its field order
# default K: on the H200 (80B shape, 24 GiB) the copies ran ~43 us a layer at 42 GB/s, about one 1.69 MiB
# expert (two at b=4); more picks only queue behind them (the copy stops at the router)
PREFETCH_DEFAULT = 4


def check_prefetch(k: int, flag: str = "--prefetch") -> int:
    if not 0 <= k <= PREFETCH_MAX:
        raise ConfigError(flag, k, f"must be 0 (off) .. {PREFETCH_MAX}: experts a decode layer copies ahead")
    return k


@dataclass(slots=True)
class PrefetchCounts:
    """What the lookahead did since start: expert parts staged (a gate, up or down matrix whose copy landed
    before the router was done), how many of them the router then used, the bytes of each kind (used: moved
    off the experts' critical path; wasted: crossed PCIe for nothing), all bytes the copies moved (landed or
    abandoned at the router) and how long the copies ran (ns, summed over layers)."""

    staged: int = 0
    used: int = 0
    used_bytes: int = 0
    wasted_bytes: int = 0
    copied_bytes: int = 0
    copy_ns: int = 0

    def add(
        self,
        staged: int,
        used: int,
        used_bytes: int,
        wasted_bytes: int,
        copied_bytes: int = 0,
        copy_ns: int = 0,
    ) -> None:
        self.staged += staged
        self.used += used
        self.used_bytes += used_bytes
        self.wasted_bytes += wasted_bytes
        self.copied_bytes += copied_bytes
        self.copy_ns += copy_ns

    @property
    def accuracy(self) -> float:
        return self.used / self.staged if self.staged else 0.0

    def status(self) -> dict[str, float | int]:
        return {
            "staged_parts": self.staged,
            "used_parts": self.used,
            "accuracy": round(self.accuracy, 4),
            "saved_bytes": self.used_bytes,
            "wasted_bytes": self.wasted_bytes,
            "copied_bytes": self.copied_bytes,
            "copy_seconds": round(self.copy_ns / 1e9, 6),
        }

    def line(self) -> str:
        rate = self.copied_bytes / self.copy_ns if self.copy_ns else 0.0  # bytes/ns = GB/s
        return (
            f"lookahead prefetch: {self.used:,} of {self.staged:,} staged expert parts used "
            f"({self.accuracy:.1%}); {self.used_bytes / 2**30:,.2f} GiB read ahead, "
            f"{self.wasted_bytes / 2**30:,.2f} GiB wasted; copies moved {self.copied_bytes / 2**30:,.2f} GiB "
            f"in {self.copy_ns / 1e9:,.3f} s ({rate:,.1f} GB/s)"
        )


# passes of up to this many rows prefetch (the GPU's GEMV_ROWS: its decode passes); longer ones borrow slots
AHEAD_ROWS = 8


def pick(pred: np.ndarray, missing: np.ndarray, k: int) -> np.ndarray:
    """The experts a layer stages [<= k]: predicted ids pred [n, A] (each row's best first) taken rank by rank
    across the rows, the first distinct ones whose entry reads the arena (missing [E] bool). The GPU kernel's
    choice (strata/gpu/kernels/tiers.py ref_prefetch_pick), shared by the CPU stand-in and the simulator."""
    order = pred.T.reshape(-1)  # rank by rank across the rows
    order = order[missing[order]]
    _, first = np.unique(order, return_index=True)
    return order[np.sort(first)][:k]


def score(picked: np.ndarray, ids: np.ndarray, expert_bytes: int) -> tuple[int, int, int, int, int]:
    """PrefetchCounts.add's first five for whole experts staged (all three parts land: the CPU stand-in and
    the simulator): parts staged, parts used (the expert was routed in ids), bytes used, wasted, copied."""
    used = int(np.isin(picked, ids).sum())
    n = len(picked)
    return 3 * n, 3 * used, used * expert_bytes, (n - used) * expert_bytes, n * expert_bytes

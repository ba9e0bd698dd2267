"""The RAM tier: where every expert lives when it is not in a slot.

- `MmapArena`: the GGUF's own mapping (the CPU stand-in; no copy, the page cache holds it).
- `RowArena`: experts copied once into rows of host memory, part-major like the slots (a slot and an arena
  row have the same shape): every expert, or under `--ram-budget-mib` the ones `held` marks (tiers/ram.py
  chooses them), the rest read where the file maps them (the mmap tier: the page cache, or the disk).
  The CPU stand-in's rows are numpy memory.
- `PinnedArena`: a RowArena in page-locked host memory that the GPU reads directly (zero-copy over PCIe,
  ~50 GB/s on the H200 host) and copies from at full DMA speed (~55 GB/s). Filled from the mmap with a
  progress bar; the time and rate go to the log.

Every arena gives `addrs` [L, P, E], the address of part p of expert e of MoE layer l (its row, or the
mmap). When every expert has a row, `bases` + e * `strides` says the same.

If the pinned allocation is refused (RLIMIT_MEMLOCK, a cgroup limit, too little RAM), `PinnedArena` raises
a ConfigError that says how much was asked and what to change, and the GPU tiers fall back to the file's
own mapping (pageable: every decode miss runs on the CPU, longer passes stage their misses; see
strata/gpu/tiers.py) with a warning that names the cost.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from strata.console.progress import ProgressBar
from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.tiers.layout import ExpertLayout
from strata.tiers.telemetry import note


class MmapArena:
    """Experts read where the file maps them: part p of expert e of layer l is row e of that tensor."""

    def __init__(self, gguf: GGUFFile, layout: ExpertLayout) -> None:
        self.views = [[gguf.raw(p.name) for p in l.parts] for l in layout.layers]  # keeps the mapping alive
        self.bases = np.array([[int(v.ctypes.data) for v in row] for row in self.views], np.int64)
        self.strides = np.array([[p.nbytes for p in l.parts] for l in layout.layers], np.int64)
        e = np.arange(layout.n_expert, dtype=np.int64)
        self.addrs = self.bases[:, :, None] + e * self.strides[:, :, None]  # [L, P, E]


class RowArena:
    """The experts `held` marks ([L, E]; None: every one) in host memory, part-major: [rows, stride] per part,
    row by row in (layer, expert) order; the others are read from the file's mapping."""

    kind = "host"

    def __init__(self, gguf: GGUFFile, layout: ExpertLayout, held: np.ndarray | None = None) -> None:
        n_l, n_e = len(layout.layers), layout.n_expert
        self.mmap = MmapArena(gguf, layout)
        self.held = np.ones((n_l, n_e), bool) if held is None else np.asarray(held, bool).copy()  # [L, E]
        self.complete = bool(self.held.all())
        self.row = np.full((n_l, n_e), -1, np.int64)  # [L, E] the expert's row, -1: the mmap's
        n_rows = int(self.held.sum())
        self.row[self.held] = np.arange(n_rows)
        self._mem: list[Any] = []
        self.arrays = [self._alloc(n_rows * s).reshape(n_rows, s) for s in layout.strides]
        self.addrs = self.mmap.addrs.copy()  # [L, P, E]
        li, e = np.nonzero(self.held)
        for p, a in enumerate(self.arrays):
            self.addrs[li, p, e] = int(a.ctypes.data) + self.row[li, e] * a.shape[1]
        if self.complete:  # rows li * E + e: a base and a stride a layer, as the CPU share's templates read
            self.bases = np.array(
                [[int(a.ctypes.data) + i * n_e * a.shape[1] for a in self.arrays] for i in range(n_l)],
                np.int64,
            )
            self.strides = np.array([[a.shape[1] for a in self.arrays] for _ in layout.layers], np.int64)
        self.fill_s = self._fill(gguf, layout)

    def _alloc(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, np.uint8)

    def _fill(self, gguf: GGUFFile, layout: ExpertLayout) -> float:
        total = int(sum(int(self.held[li].sum()) * l.nbytes for li, l in enumerate(layout.layers)))
        bar = ProgressBar("expert arena", total)
        t0, done = time.monotonic(), 0
        n_e = layout.n_expert
        for li, l in enumerate(layout.layers):
            es = np.flatnonzero(self.held[li])
            if not len(es):
                continue
            rows = self.row[li, es]
            contiguous = len(es) == n_e  # every expert of the layer: one slice, no gather
            for p, part in enumerate(l.parts):
                src = gguf.raw(part.name).reshape(n_e, part.nbytes)  # [E, nbytes], the mmap
                if contiguous:
                    self.arrays[p][rows[0] : rows[0] + n_e, : part.nbytes] = src
                else:
                    self.arrays[p][rows, : part.nbytes] = src[es]
                done += len(es) * part.nbytes
                bar(done)
        dt = time.monotonic() - t0
        n = int(self.held.sum())
        note(
            f"expert arena: {n:,} of {self.held.size:,} experts, {total / 2**30:,.2f} GiB in "
            f"{self.kind} RAM in {dt:.1f} s ({total / max(dt, 1e-9) / 1e6:,.0f} MB/s)"
        )
        return dt

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def ranges(self) -> list[tuple[int, int]]:
        """(start, end) of each row store: a copy whose source lies in one needs no bounce."""
        return [(int(a.ctypes.data), int(a.ctypes.data) + a.nbytes) for a in self.arrays if a.nbytes]


class PinnedArena(RowArena):
    """A RowArena in page-locked host memory, which the GPU reads in place."""

    kind = "pinned"

    def _alloc(self, nbytes: int) -> np.ndarray:
        from strata.gpu.runtime import cupy_module

        cp = cupy_module()
        try:
            mem = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        except (cp.cuda.runtime.CUDARuntimeError, MemoryError) as err:
            raise ConfigError(
                "expert_cache",
                "auto",
                (
                    f"could not pin {nbytes / 2**30:,.1f} GiB of host memory for the expert arena ({err}); "
                    "raise the memlock limit (ulimit -l) or the container's memory, lower ram_budget_mib "
                    "(the rest stays in the file's mapping), or give the experts more VRAM (--expert-cache, "
                    "--vram-budget-mib)"
                ),
            ) from err
        self._mem.append(mem)
        return np.frombuffer(mem, np.uint8, nbytes)

"""The RAM tier: where every expert lives when it is not in a slot.

- `MmapArena`: the GGUF's own mapping (the CPU stand-in; no copy, the page cache holds it).
- `PinnedArena`: every expert copied once into page-locked host memory that the GPU reads directly
  (zero-copy over PCIe, ~50 GB/s on the H200 host) and copies from at full DMA speed (~55 GB/s).
  Filled from the mmap with a progress bar; the time and rate go to the log. Part-major like the
  slots, so a slot and an arena row have the same shape.

If the pinned allocation is refused (RLIMIT_MEMLOCK, a cgroup limit, too little RAM), `PinnedArena` raises
a ConfigError that says how much was asked and what to change, and the GPU tiers fall back to the file's
own mapping (pageable: every decode miss runs on the CPU, longer passes stage their misses; see
strata/gpu/tiers.py) with a warning that names the cost.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from strata.tiers.layout import ExpertLayout
from strata.tiers.telemetry import note

from strata.console.progress import ProgressBar
from strata.errors import ConfigError
from strata.gguf import GGUFFile


class MmapArena:
    """Experts read where the file maps them: part p of expert e of layer l is row e of that tensor."""

    def __init__(self, gguf: GGUFFile, layout: ExpertLayout) -> None:
        self.views = [[gguf.raw(p.name) for p in l.parts] for l in layout.layers]  # keeps the mapping alive
        self.bases = np.array([[int(v.ctypes.data) for v in row] for row in self.views], np.int64)
        self.strides = np.array([[p.nbytes for p in l.parts] for l in layout.layers], np.int64)


class PinnedArena:
    """Every expert in page-locked host memory, part-major: [L * E, stride] per part."""

    def __init__(self, gguf: GGUFFile, layout: ExpertLayout) -> None:
        from strata.gpu.runtime import cupy_module

        cp = cupy_module()
        n_rows = layout.n_total
        self._mem: list[Any] = []
        self.arrays: list[np.ndarray] = []
        for s in layout.strides:
            nbytes = n_rows * s
            try:
                mem = cp.cuda.alloc_pinned_memory(nbytes)
            except (cp.cuda.runtime.CUDARuntimeError, MemoryError) as err:
                raise ConfigError(
                    "expert_cache",
                    "auto",
                    (
                        f"could not pin {nbytes / 2**30:,.1f} GiB of host memory for the expert arena ({err}); "
                        "raise the memlock limit (ulimit -l) or the container's memory, or give the experts "
                        "more VRAM (--expert-cache, --vram-budget-mib)"
                    ),
                ) from err
            self._mem.append(mem)
            self.arrays.append(np.frombuffer(mem, np.uint8, nbytes).reshape(n_rows, s))
        n_e = layout.n_expert
        self.bases = np.array(
            [
                [int(a.ctypes.data) + li * n_e * a.shape[1] for a in self.arrays]
                for li in range(len(layout.layers))
            ],
            np.int64,
        )
        self.strides = np.array([[a.shape[1] for a in self.arrays] for _ in layout.layers], np.int64)
        self.fill_s = self._fill(gguf, layout)

    def _fill(self, gguf: GGUFFile, layout: ExpertLayout) -> float:
        total = layout.total_bytes
        bar = ProgressBar("expert arena", total)
        t0, done = time.monotonic(), 0
        n_e = layout.n_expert
        for li, l in enumerate(layout.layers):
            for p, part in enumerate(l.parts):
                src = gguf.raw(part.name).reshape(n_e, part.nbytes)  # [E, nbytes], the mmap
                self.arrays[p][li * n_e : (li + 1) * n_e, : part.nbytes] = src
                done += src.nbytes
                bar(done)
        dt = time.monotonic() - t0
        note(
            f"expert arena: {total / 2**30:,.2f} GiB of experts in pinned RAM in {dt:.1f} s "
            f"({total / max(dt, 1e-9) / 1e6:,.0f} MB/s)"
        )
        return dt

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

"""The expert tiers on the GPU: slots in VRAM, every expert in pinned RAM, the tables the kernels read.

strata.tiers.slots decides what is where; this module moves the bytes and keeps device copies of
its tables: `table` [L, P, E] (the addresses the MoE kernels read; a miss is a zero-copy read of
pinned RAM inside the CUDA graph), `where` [L, E] (for hit counting), and, during a borrowing
prefill chunk, `ptab`, the prefill table. Copies between windows run on the model's stream, so a
graph replay never sees a half-written slot.

A borrowing prefill chunk stages layer l's missing experts on a side stream with one `gather_rows`
launch while earlier layers compute; the compute stream waits for layer l's copy before its experts
run, and the copy into a buffer waits for the layer that used it last (events, no host waits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.gguf import GGUFFile
from strata.gpu.kernels import tiers as kt
from strata.gpu.runtime import Kernels, cupy_module, launch, ptr
from strata.gpu.weights import DevMatrix
from strata.tiers.arena import PinnedArena
from strata.tiers.layout import ExpertLayout
from strata.tiers.slots import ExpertCache, Staging

MAX_ROWS_PER_LAUNCH = 60000  # gridDim.y limit is 65535
HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice
BLOCKS_PER_ROW = 4  # an expert part is ~0.2-2 MB: a few blocks each keep enough reads in flight


@dataclass(frozen=True, slots=True)
class TierHook:
    """What a MoE layer's launches need to count lookups: its `where` row, expert bytes, the counters."""

    where: Any  # device address of int32 [E]
    expert_bytes: int
    counts: Any  # cupy uint64 [rows, 3]


class DeviceSlots:
    """The slot store in VRAM (part-major, like the arena); copies are gathers on the given stream."""

    def __init__(self, n_slots: int, strides: tuple[int, int, int], kernels: Kernels) -> None:
        cp = cupy_module()
        self.arrays = [cp.empty(max(n_slots, 1) * s, cp.uint8) for s in strides]
        self.bases = tuple(int(a.data.ptr) for a in self.arrays)  # type: ignore[assignment]
        self.kernels = kernels
        self._keep: list[Any] = []  # row lists in flight, freed at the next sync

    def copy_rows(self, rows: np.ndarray) -> None:
        gather(self.kernels, rows, self._keep)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def gather(kernels: Kernels, rows: np.ndarray, keep: list[Any]) -> None:
    """Launch gather_rows over (source, destination, bytes) rows [n, 3] on the current stream."""
    cp = cupy_module()
    for r0 in range(0, len(rows), MAX_ROWS_PER_LAUNCH):
        part = cp.asarray(
            np.ascontiguousarray(rows[r0 : r0 + MAX_ROWS_PER_LAUNCH].T)
        )  # [3, n]: src, dst, bytes
        keep.append(part)
        n = part.shape[1]
        launch(kernels["gather_rows"], (BLOCKS_PER_ROW, n), 256, (part[0], part[1], part[2]))


def coalesce(rows: np.ndarray, strides: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """Merge copies [n, 3] (three parts per expert, in order) whose sources and destinations both step by
    the part's stride into one copy each (the padding between rows is copied along, harmlessly)."""
    out: list[tuple[int, int, int]] = []
    for p, stride in enumerate(strides):
        run: list[int] | None = None
        for src, dst, n in rows[p::3].tolist():
            if run is not None and src - run[3] == stride and dst - run[4] == stride:
                run[2], run[3], run[4] = src + n - run[0], src, dst
                continue
            if run is not None:
                out.append((run[0], run[1], run[2]))
            run = [src, dst, n, src, dst]  # first src, first dst, length so far, last src, last dst
        if run is not None:
            out.append((run[0], run[1], run[2]))
    return out


class GpuTiers:
    def __init__(self, gguf: GGUFFile, layout: ExpertLayout, n_slots: int, max_rows: int) -> None:
        cp = cupy_module()
        self.kernels = Kernels(kt.SOURCE, kt.NAMES)
        self.layout = layout
        self.arena = PinnedArena(gguf, layout)
        self.slots = DeviceSlots(n_slots, layout.strides, self.kernels)
        self.cache = ExpertCache(layout, n_slots, self.slots, self.arena)
        self.cache.fill_static()
        self.table = cp.asarray(self.cache.table)  # [L, P, E] int64
        self.where = cp.asarray(self.cache.where)  # [L, E] int32
        self.ptab = cp.empty_like(self.table)
        self.counts = cp.zeros((max_rows, 3), cp.uint64)
        self._version = self.cache.version
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self._keep: list[Any] = []

    # ---- what the layers read ----
    def matrices(self, li: int, table: Any = None) -> tuple[DevMatrix, DevMatrix, DevMatrix]:
        """Gate, up, down of MoE layer li, read through `table` (default: the decode table)."""
        tab = self.table if table is None else table
        n_e = self.layout.n_expert
        return tuple(
            DevMatrix(
                p.name, p.qtype, p.rows, p.cols, n_e, p.row_bytes, None, ptr(tab, 8 * (li * 3 + j) * n_e)
            )
            for j, p in enumerate(self.layout.layers[li].parts)
        )  # type: ignore[return-value]

    def hook(self, li: int) -> TierHook:
        return TierHook(
            ptr(self.where, 4 * li * self.layout.n_expert), int(self.cache.expert_bytes[li]), self.counts
        )

    # ---- between windows ----
    def publish(self) -> None:
        """Bring the device tables up to the cache's bookkeeping (after loads), on the current stream."""
        if self._version != self.cache.version:
            self.table.set(self.cache.table)
            self.where.set(self.cache.where)
            self._version = self.cache.version

    def take_counts(self, n: int) -> np.ndarray:
        """This pass's per-row (lookups, hits, miss bytes) [n, 3], zeroed for the next (syncs the stream)."""
        out = self.counts[:n].get().astype(np.int64)
        self.counts[:n].fill(0)
        self._keep.clear()
        self.slots._keep.clear()
        return out

    # ---- borrowing prefill ----
    def begin_staging(self) -> Staging | None:
        """Plan a borrowing chunk, put its prefill table on the device and stage the first layers."""
        cp = cupy_module()
        staging = self.cache.staging()
        if staging is None:
            return None
        self.ptab.set(staging.table)
        self._rows = [self.cache.stage_rows(staging, li) for li in range(len(self.layout.layers))]
        self._staged = [cp.cuda.Event(disable_timing=True) for _ in self._rows]
        self._done = [cp.cuda.Event(disable_timing=True) for _ in self._rows]
        start = cp.cuda.Event(disable_timing=True)
        start.record()  # the copies overwrite borrowed slots: not before earlier work that read them
        self.copy_stream.wait_event(start)
        for li in range(min(staging.buffers, len(self._rows))):
            self._stage(li)
        return staging

    def _stage(self, li: int) -> None:
        """Layer li's staging copies on the copy engines (a side stream): contiguous runs as one copy each.
        A gather kernel would have to win SMs from the GEMMs it is meant to overlap."""
        cp = cupy_module()
        with self.copy_stream:
            for src, dst, n in coalesce(self._rows[li], self.layout.strides):
                cp.cuda.runtime.memcpyAsync(dst, src, n, HOST_TO_DEVICE, self.copy_stream.ptr)
            self._staged[li].record()

    def before_layer(self, li: int) -> None:
        cupy_module().cuda.get_current_stream().wait_event(self._staged[li])

    def after_layer(self, staging: Staging, li: int) -> None:
        """Layer li's experts have been launched: the buffer it used may take layer li + buffers."""
        self._done[li].record()
        nxt = li + staging.buffers
        if nxt < len(self._rows):
            self.copy_stream.wait_event(self._done[li])
            self._stage(nxt)

    def end_staging(self, staging: Staging) -> int:
        """The chunk is over: borrowed slots get their experts back (on the compute stream). Returns the
        bytes staged."""
        gather(self.kernels, self.cache.restore_rows(staging), self._keep)
        return int(sum(int(r[:, 2].sum()) for r in self._rows if len(r)))

    def probe(self, nbytes: int = 1 << 30) -> dict[str, float]:
        """Host-to-GPU rates from the arena (bytes/s): zero-copy reads by `gather_rows` (the decode miss
        path's kind of access) and copy-engine copies (the staging path). Syncs; between windows only."""
        cp = cupy_module()
        part = int(np.argmax(self.layout.strides))
        src = self.arena.arrays[part].reshape(-1)
        n = min(nbytes, src.nbytes) // (1 << 20) * (1 << 20)
        dst = cp.empty(n, cp.uint8)
        rows = np.array(
            [[int(src.ctypes.data) + o, int(dst.data.ptr) + o, 1 << 20] for o in range(0, n, 1 << 20)],
            np.int64,
        )
        out = {}
        for name in ("zero_copy", "copy_engine"):
            best = 0.0
            for _ in range(3):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                if name == "zero_copy":
                    gather(self.kernels, rows, self._keep)
                else:
                    cp.cuda.runtime.memcpyAsync(
                        int(dst.data.ptr),
                        int(src.ctypes.data),
                        n,
                        HOST_TO_DEVICE,
                        cp.cuda.get_current_stream().ptr,
                    )
                end.record()
                end.synchronize()
                best = max(best, n / (cp.cuda.get_elapsed_time(start, end) / 1e3))
            out[name] = best
        self._keep.clear()
        del dst  # the scratch goes back to the device, not to the pool: it is no part of the budget
        cp.get_default_memory_pool().free_all_blocks()
        return out

    def nbytes(self) -> int:
        """VRAM held: the slots, both tables, `where` and the counters."""
        return self.slots.nbytes() + 2 * self.table.nbytes + self.where.nbytes + self.counts.nbytes

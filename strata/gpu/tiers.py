"""The expert tiers on the GPU: slots in VRAM, every expert in pinned RAM, the tables the kernels read.

strata.tiers.slots decides what is where; this module moves the bytes and keeps device copies of
its tables: `table` [L, P, E] (the addresses the MoE kernels read; a miss is a zero-copy read of
pinned RAM inside the CUDA graph), `where` [L, E] (for hit counting), and, during a borrowing
prefill chunk, `ptab`, the prefill table. Copies between windows run on the model's stream, so a
graph replay never sees a half-written slot.

A borrowing prefill chunk stages each layer's missing experts into borrowed slots on the copy stream while
earlier layers compute (strata/gpu/borrowing.py, `GpuTiers.borrowing`).

The CPU's share of the decode misses (`--pcie-frac`, tiers/share.py; its GPU side in strata/gpu/share.py):
decode rows read the CPU-owned experts from a slot of zeros (`table`) and add the CPU's answer; passes of
more rows read every miss through `full`. The slot store and its copies are strata/gpu/slots.py.

With `--cache-policy lru|adaptive` the cache follows the routing (tiers/policy.py): strata/gpu/learning.py
learns beside the passes and brings newcomers in, riding the misses' own reads (tiers/ride.py) or by copy. The
CPU share runs beside a policy: its per-token split (`take`) hands the CPU part of the misses each pass finds
in `where`, so it follows the swaps; only a fixed set of CPU experts (a pageable arena, experts only in the
file's mapping) needs the static cache.

Where the experts live (all pinned, the low-RAM mode's three tiers, or the pageable fallback when pinning
fails) is strata/gpu/placement.py's choice. Under `--ram-budget-mib` decode rows give every miss that is only
in the file's mapping to the CPU share (the graph reads only VRAM and pinned memory), whatever the split, and
every pass of more rows stages its misses, the mapped ones through the pinned bounce ring
(strata/gpu/ring.py). With the arena in pageable memory every decode miss is the CPU's and every longer pass
stages its misses into borrowed slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.gguf import GGUFFile
from strata.gpu.borrowing import BorrowingPrefill
from strata.gpu.kernels import tiers as kt
from strata.gpu.learning import LEARN_EVERY, PolicySide, RideHook
from strata.gpu.lookahead import Lookahead
from strata.gpu.ops import MOE_GEMV_ROWS
from strata.gpu.placement import check_staging, place_experts
from strata.gpu.runtime import DEVICE_TO_HOST, Kernels, cupy_module, ptr
from strata.gpu.share import CpuShareSide, ShareHook
from strata.gpu.weights import DevMatrix
from strata.tiers import share as split
from strata.tiers.borrow import staging_rows
from strata.tiers.layout import ExpertLayout
from strata.tiers.lookahead import PREFETCH_DEFAULT
from strata.tiers.profile import Profile
from strata.tiers.telemetry import note

COLLECT_TIMEOUT_NS = 2_000_000_000  # a CPU answer later than this fails the pass instead of hanging the GPU
PATCH_MAX = (
    4096  # (layer, expert) entries changed: up to this many, publish scatters them instead of whole tables
)


@dataclass(frozen=True, slots=True)
class TierHook:
    """What a MoE layer's launches need to count lookups: its `where` row, expert bytes, the counters."""

    where: Any  # device address of int32 [E]
    expert_bytes: int
    counts: Any  # cupy uint64 [rows, 3]
    route: Any  # device address of the layer's int32 [rows, A] row of `routes`
    share: ShareHook | None = None  # set: decode rows give the CPU its share of this layer's misses
    layer: int = 0  # the MoE layer
    lookahead: Lookahead | None = None  # set: decode rows prefetch the layer's predicted misses
    ride: RideHook | None = None  # set: decode rows copy the riders they route into their slots
    top_k: int = 1  # routed ids a row (the columns of `route`)


@dataclass(frozen=True, slots=True)
class PassRecord:
    """A launched pass's counters on their way to pinned host memory (GpuTiers.record)."""

    counts: np.ndarray  # [n, 3] lookups, hits, PCIe bytes
    routes: np.ndarray  # [L, n, A] tier_count's route rows (expert ids, hits marked)
    prefetch: (
        np.ndarray | None
    )  # [STATS] the lookahead's counts (tiers.lookahead.PrefetchCounts), when it runs
    riders: np.ndarray  # [L, E] the riders the device held for the pass (ExpertCache.riders)
    keep: list[Any]  # row lists and buffers the pass reads, alive until it is done
    pred: np.ndarray | None = None  # [L, n, A] the lookahead's predictions, when routes are recorded


@dataclass(frozen=True, slots=True)
class TierOptions:
    """The tiers' engine options: how to split decode misses with the CPU (--pcie-frac, --probe, the pool
    flags), which experts the cache keeps (--cache-policy, --swap-budget-mib) and the routing profile to fill
    it from."""

    pcie_frac: float | None = None  # None: from the probe
    probe: bool = False  # measure again even when the cache dir has rates
    workers: int = 0
    aux_cpus: str = "auto"
    cache_dir: str | None = None  # jit kernels; the probe's rates go beside it
    pin: bool = True  # False: act as if pinning the arena failed (tests the fallback)
    cache_policy: str = "static"  # --cache-policy (the CPU share splits each pass's misses under any)
    swap_budget: int = 64 << 20  # --swap-budget-mib: bytes a pass may copy into slots
    profile: Profile | None = None  # a saved routing profile: the fill takes each layer's most used experts
    prefetch: int = PREFETCH_DEFAULT  # --prefetch: experts a decode layer copies ahead of its router (0: off)
    ram_budget_mib: float = 0  # --ram-budget-mib: RAM for the arena and the bounce ring (0: all pinned)
    kv_grow: bool = False  # --kv-grow: the slots come in segments the KV can take (tiers/grow.py)


class GpuTiers(CpuShareSide, PolicySide):
    def __init__(
        self,
        gguf: GGUFFile,
        layout: ExpertLayout,
        n_slots: int,
        max_rows: int,
        decode_rows: int,
        opts: TierOptions,
    ) -> None:
        """decode_rows: passes of up to this many rows run the decode layers (the CPU share); more rows stage
        or read every miss over PCIe."""
        cp = cupy_module()
        self.kernels = Kernels(kt.SOURCE, kt.NAMES)
        self.layout = layout
        placed = place_experts(
            gguf,
            layout,
            n_slots,
            decode_rows,
            self.kernels,
            opts.pin,
            opts.ram_budget_mib,
            opts.profile,
            opts.kv_grow,
        )
        self.arena, self.slots, self.cache = placed.arena, placed.slots, placed.cache
        self.pageable, self.ring = placed.pageable, placed.ring
        self.cache.use_policy(opts.cache_policy, LEARN_EVERY * opts.swap_budget)
        if self.pageable or self.cache.low_ram:
            check_staging(placed)
        self.zero = [cp.zeros(s, cp.uint8) for s in layout.strides]  # the CPU share's slot of zeros
        self.share: Any = None  # jit.share.CpuShare, when the CPU takes a share
        self.split: split.Split | None = None
        self.rates: split.Rates | None = None  # the probe's (or the cache dir's), when the split was chosen
        self.ticket = cp.zeros(1, cp.int64)
        self.err = cp.zeros(1, cp.int32)
        self.counts = cp.zeros((max_rows, 3), cp.uint64)
        self.routes = cp.zeros((len(layout.layers), max_rows, layout.top_k), cp.int32)  # [L, rows, A]
        self._snap = self.cache.version
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self._keep: list[Any] = []
        self._start_share(gguf, opts, decode_rows)
        # while some misses are pageable, every pass past the decode rows stages; else passes stage from the
        # row count the link's rates give (the split's probe, which _start_share ran, or one of its own)
        self.cache.borrow_min = (
            decode_rows + 1 if self.pageable or self.cache.mapped_misses else self._staging_rows(decode_rows)
        )
        self.table = cp.asarray(self.cache.table)  # [L, P, E] int64: decode rows
        self.full = cp.asarray(self.cache.full)  # [L, P, E] int64: passes of more rows
        self.where = cp.asarray(self.cache.where_kinds())  # [L, E] int32
        self.ptab = cp.empty_like(self.table)
        self.borrowing = BorrowingPrefill(self)
        # the GPU reads no pageable memory in place, and the lookahead copies from the arena like a miss does
        # (and --pcie-frac 0 leaves PCIe nothing to read ahead)
        ahead = (
            opts.prefetch
            and not self.pageable
            and self.cache.resident() < self.layout.n_total
            and self.cache.pcie_frac > 0
        )
        self.lookahead = (
            Lookahead(self.kernels, layout, self.table, self.where, opts.prefetch, decode_rows)
            if ahead
            else None
        )
        self._start_policy()
        self._version = self.cache.version
        self.cache.dirty = []

    def _staging_rows(self, decode_rows: int) -> int:
        """The fewest rows a prompt pass stages its misses at (tiers/borrow.py staging_rows), from the link's
        rates: the split's probe when it ran, else a quick one of the link alone."""
        if self.cache.resident() == self.layout.n_total:
            return MOE_GEMV_ROWS + 1
        if self.rates is not None:
            zero_copy, copy_engine = self.rates.zero_copy_alone, self.rates.copy_engine
        else:
            link = self.probe(256 << 20)
            zero_copy, copy_engine = link["zero_copy"], link["copy_engine"]
        lay, low, high = self.layout, decode_rows + 1, MOE_GEMV_ROWS + 1
        rows = staging_rows(lay.n_expert, lay.top_k, zero_copy, copy_engine, low, high)
        note(
            f"prompt passes of {rows} rows or more stage their misses in borrowed slots (zero-copy "
            f"{zero_copy / 1e9:.1f} GB/s, copy engine {copy_engine / 1e9:.1f} GB/s)"
        )
        return rows

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

    def hook(self, li: int, decode: bool = True) -> TierHook:
        """Layer li's counting hook; decode: also its CPU share (passes of more rows have none)."""
        return TierHook(
            ptr(self.where, 4 * li * self.layout.n_expert),
            int(self.cache.expert_bytes[li]),
            self.counts,
            ptr(self.routes, 4 * li * self.routes.shape[1] * self.routes.shape[2]),
            self.share_hook(li) if decode else None,
            li,
            self.lookahead if decode else None,
            self.ride_hook(li) if decode else None,
            self.layout.top_k,
        )

    # ---- between windows ----
    def publish(self) -> None:
        """Before a pass: land the swaps whose copies are done, take back slots a finished KV left
        (--kv-grow), and bring the device tables up to the cache's bookkeeping, on the current stream."""
        while self._swapping and self._swapping[0][1].done:
            self.cache.land(self._swapping.pop(0)[0])
        if self.cache.lender is not None:
            self.cache.lender.reclaim()
        if self._version != self.cache.version:
            self._push()
        if self._snap != self.cache.version:  # the riders this pass holds, for landing them after it
            self._pass_riders, self._snap = self.cache.riders(), self.cache.version

    def _push(self) -> None:
        """Queue the tables' changes on the current stream."""
        c = self.cache
        assert c.dirty is not None
        pairs = np.asarray(sorted(set(c.dirty)), np.int64).reshape(-1, 2)
        c.dirty.clear()
        if 0 < len(pairs) <= PATCH_MAX:  # a few swaps: scatter the changed entries (tables are ~0.6 MB each)
            cp = cupy_module()
            li, e = pairs[:, 0], pairs[:, 1]
            n_e = self.layout.n_expert
            at = ((li * 3)[:, None] + np.arange(3)) * n_e + e[:, None]  # [n, P] into [L, P, E]
            flat = at.reshape(-1)
            host = np.concatenate(
                [
                    flat,
                    c.table.reshape(-1)[flat],
                    c.full.reshape(-1)[flat],
                    c.pend.reshape(-1)[flat],
                    li * n_e + e,
                    c.where_kinds()[li, e].astype(np.int64),
                ]
            )
            dev = cp.asarray(host)  # one upload for every array the patch touches
            k, m = at.size, len(li)
            idx = dev[:k]
            self.table.ravel()[idx] = dev[k : 2 * k]
            self.full.ravel()[idx] = dev[2 * k : 3 * k]
            if self.ride_on:
                self.pend.ravel()[idx] = dev[3 * k : 4 * k]
            self.where.ravel()[dev[4 * k : 4 * k + m]] = dev[4 * k + m :].astype(cp.int32)
        else:
            self.table.set(c.table)
            self.full.set(c.full)
            self.where.set(c.where_kinds())
            if self.ride_on:
                self.pend.set(c.pend)
        self._version = c.version

    def take_counts(self, n: int) -> np.ndarray:
        """This pass's per-row (lookups, hits, PCIe bytes, CPU calls) [n, 4], zeroed for the next (syncs the
        stream); raises when the CPU share failed the pass."""
        gpu = self.counts[:n].get().astype(np.int64)
        self.counts[:n].fill(0)
        if self.lookahead is not None:
            self.cache.prefetch.add(*(int(v) for v in self.lookahead.stats.get()))
            self.lookahead.stats.fill(0)
        self._keep.clear()
        self.slots._keep.clear()
        cpu = np.zeros((n, 3), np.int64)  # CPU calls, of them on experts from the mapping, their bytes
        if self.share is not None:
            late = int(self.err.get()[0])
            if late:
                self.err.fill(0)
                raise RuntimeError(
                    f"the CPU share of the expert misses did not answer within "
                    f"{COLLECT_TIMEOUT_NS / 1e9:.0f} s; this pass's output is wrong"
                )
            self.share.check()
            k = min(n, len(self.share.calls))
            cpu[:k, 0] = self.share.take_calls(k)
            cpu[:k, 1:] = self.share.take_mapped(k)
        return np.concatenate([gpu, cpu], axis=1)

    def record(self, n: int) -> PassRecord:
        """After a launched pass (no CPU share): queue copies of its counts and routed ids to the host and
        zero the counts for the next pass, all on the current stream, so the host reads them later with no
        sync (the decode pipeline, strata/gpu/ahead.py). `finish` takes them once the pass's event is done."""
        assert self.share is None, "the CPU share counts its calls by pass: its passes are taken in sync"
        cp = cupy_module()
        import cupyx

        stream = cp.cuda.get_current_stream()
        counts = cupyx.empty_pinned((n, 3), np.uint64)
        routes = cupyx.empty_pinned((self.routes.shape[0], n, self.routes.shape[2]), np.int32)
        packed = cp.ascontiguousarray(self.routes[:, :n])
        cp.cuda.runtime.memcpyAsync(
            counts.ctypes.data, self.counts.data.ptr, counts.nbytes, DEVICE_TO_HOST, stream.ptr
        )
        cp.cuda.runtime.memcpyAsync(
            routes.ctypes.data, packed.data.ptr, routes.nbytes, DEVICE_TO_HOST, stream.ptr
        )
        self.counts[:n].fill(0)
        ahead = None
        if self.lookahead is not None:
            ahead = cupyx.empty_pinned(self.lookahead.stats.size, np.uint64)
            cp.cuda.runtime.memcpyAsync(
                ahead.ctypes.data, self.lookahead.stats.data.ptr, ahead.nbytes, DEVICE_TO_HOST, stream.ptr
            )
            self.lookahead.stats.fill(0)
        pred = None
        if self._recording_pred(n):
            assert self.lookahead is not None
            pred = cupyx.empty_pinned((self.routes.shape[0], n, self.routes.shape[2]), np.int32)
            packed_pred = cp.ascontiguousarray(self.lookahead.pred[:, :n])
            cp.cuda.runtime.memcpyAsync(
                pred.ctypes.data, packed_pred.data.ptr, pred.nbytes, DEVICE_TO_HOST, stream.ptr
            )
            self.lookahead.pred[:, :n].fill(-1)
            packed = [packed, packed_pred]
        keep = [*self._keep, *self.slots._keep, packed]
        self._keep, self.slots._keep = [], []
        return PassRecord(counts, routes, ahead, self._pass_riders, keep, pred)

    def finish(self, rec: PassRecord, experts: list[Any], rows: list[int]) -> None:
        """A recorded pass is done (its event synchronised): credit its counts and learn from its routing."""
        n = len(rec.counts)
        counts = np.concatenate([rec.counts.astype(np.int64), np.zeros((n, 3), np.int64)], axis=1)
        self.cache.settle(counts, 0, experts, rows)
        if rec.prefetch is not None:
            self.cache.prefetch.add(*(int(v) for v in rec.prefetch))
        self._routed(rec.routes, rec.riders, rec.pred)

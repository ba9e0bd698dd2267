"""The CPU's share of the decode misses on the GPU side (part of strata/gpu/tiers.py's GpuTiers).

Each decode MoE layer's publish gives the CPU take[n, m] of its m PCIe misses (and the experts only the CPU
can read, which the cache marks), points their table entries at a slot of zeros until the collect, hands the
rows to a pinned mailbox that jit/share.py serves, and adds the CPU's answer after the shared expert
(`ShareHook`, kernels/share.py). The table (`--pcie-frac`, tiers/share.py) comes from a probe of the zero-copy
rate and the CPU pool's rate on this model's experts, each under the other's load, kept in the cache dir;
`probe` also measures the copy engine's rate.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.gpu.kernels import share as ks
from strata.gpu.runtime import HOST_TO_DEVICE, cupy_module, ptr
from strata.gpu.slots import gather
from strata.tiers import share as split
from strata.tiers.telemetry import note

if TYPE_CHECKING:
    from strata.gpu.tiers import TierOptions
    from strata.tiers.layout import ExpertLayout
    from strata.tiers.slots import ExpertCache


@dataclass(frozen=True, slots=True)
class ShareHook:
    """What a decode layer's publish and collect launches need: the mailbox's parts and the ticket."""

    layer: int  # the MoE layer
    ctl: int  # host addresses (pinned, mapped) of the mailbox's parts
    h: int
    ids: int
    wts: int
    out: int
    ticket: Any  # device int64 [1]
    err: Any  # device int32 [1]
    table: Any  # device address of the layer's decode table rows [3, E]
    n_expert: int
    zero: tuple[int, int, int]  # the part addresses of the slot of zeros
    take: (
        Any  # device int32 [rows + 1, pairs + 1]: of m misses in n rows, how many the CPU takes (take_table)
    )
    saved: Any  # device int64 [3 * SHARE_PAIRS]: the taken experts' table entries, until the collect
    took: Any  # device int32 [1 + SHARE_PAIRS]: how many, and which
    asked: Any  # device int32 [1]: the publish handed the CPU something


class CpuShareSide:
    """GpuTiers' CPU share: starting the CPU server and choosing the split, the probes, each layer's hook."""

    cache: ExpertCache
    layout: ExpertLayout
    arena: Any
    pageable: bool
    kernels: Any
    copy_stream: Any
    zero: list[Any]
    ticket: Any
    err: Any
    share: Any
    split: split.Split | None
    rates: split.Rates | None
    table: Any
    take: Any
    saved: Any
    took: Any
    asked: Any
    _keep: list[Any]

    def _start_share(self, gguf: GGUFFile, opts: TierOptions, rows: int) -> None:
        """Start the CPU server, probe (or read) the rates, choose the split and mark the CPU's experts."""
        from strata.jit.cpus import host_plan
        from strata.jit.kernels import Kernels as CpuKernels
        from strata.jit.share import CpuShare, ExpertBytes, Mailbox

        c = self.cache
        hit = c.resident() / c.where.size
        per = float(np.mean(c.expert_bytes))
        miss = (1 - hit) * self.layout.top_k * per  # bytes a layer, uniform routing
        must = self.pageable or c.mapped_misses  # misses the graph cannot read: the CPU's, whatever the split
        if miss == 0 or (opts.pcie_frac == 1.0 and not must):
            return
        # a fixed set of CPU experts would change under a learning policy between windows; the per-token
        # split below reads each pass's own misses, so it follows the swaps (ram_budget_mib refused the policy
        # already: ExpertCache.use_policy)
        if c.policy is not None and must:
            raise ConfigError(
                "cache_policy",
                opts.cache_policy,
                "a pageable arena needs a fixed CPU share of the misses, which runs with the static "
                "cache only",
            )
        if platform.machine() not in ("x86_64", "AMD64"):  # the mailbox's store order is x86's
            if must:
                raise ConfigError(
                    "expert_cache",
                    "auto",
                    "some experts are only in pageable memory "
                    "(an arena that could not be pinned, or ram_budget_mib), and the CPU "
                    "share they need runs on x86-64 only",
                )
            note("CPU share of the misses: x86-64 only; every miss is read over PCIe")
            return
        cp = cupy_module()
        a, d = self.layout.top_k, self.layout.layers[0].parts[0].cols
        if rows * a > ks.SHARE_PAIRS:
            raise ConfigError("top_k", a, f"the CPU share takes at most {ks.SHARE_PAIRS} routed pairs a pass")
        self._box_mem = cp.cuda.alloc_pinned_memory(Mailbox.nbytes(rows, a, d) + 64)
        buf = np.frombuffer(self._box_mem, np.uint8)
        buf = buf[-int(buf.ctypes.data) % 64 :]
        buf[:] = 0
        self.box = Mailbox.over(buf, rows, a, d)
        lay = self.layout.layers
        if c.low_ram:  # each expert where the cache's home says: a pinned row, or the file's mapping
            bases = strides = np.zeros((len(lay), 3), np.int64)
        else:
            bases, strides = np.asarray(self.arena.bases, np.int64), np.asarray(self.arena.strides, np.int64)
        experts = ExpertBytes(
            bases,
            strides,
            np.array([[p.qtype for p in l.parts] for l in lay], np.int64),
            np.array([[p.rows for p in l.parts] for l in lay], np.int64),
            np.array([[p.row_bytes for p in l.parts] for l in lay], np.int64),
            c.home if c.low_ram else None,
        )
        plan = host_plan(opts.workers, opts.aux_cpus)
        jit_dir = Path(opts.cache_dir) if opts.cache_dir else None
        from strata.jit.pool import _pin

        # one CPU stays with the thread that drives the GPU (launches, syncs): a helper preempted while it
        # holds a claimed task stalls the whole layer
        threads = max(1, plan.workers - 1)
        self.share = CpuShare(
            CpuKernels(jit_dir),
            experts,
            self.layout.n_expert,
            self.box,
            threads,
            lambda: _pin(plan.worker_cpus),
        )
        if c.low_ram:
            self.share.mapped = ~c.in_ram  # counted apart: experts read from the file's mapping
        n_miss = int((c.where < 0).sum())
        forced = int((~c.in_ram & (c.where < 0)).sum()) / n_miss if n_miss else 0.0  # the CPU's in any case
        given = 0.0 if self.pageable else opts.pcie_frac
        zero = tuple(int(z.data.ptr) for z in self.zero)
        take = np.zeros((rows + 1, rows * a + 1), np.int32)
        if given is not None:
            note(
                f"CPU share of the decode misses: --pcie-frac {given:.2f} ({1 - given:.0%} on the CPU pool, "
                f"{threads} threads, {self.share.products}){' (pageable arena)' if self.pageable else ''}"
            )
        else:
            rates = self.rates = self._rates(opts, jit_dir, threads)
            pool = f"CPU pool ({threads} threads, {self.share.products})"
            note(
                f"probe: zero-copy {rates.zero_copy_alone / 1e9:,.1f} GB/s alone, "
                f"{rates.zero_copy / 1e9:,.1f} beside the CPU (in graph ~"
                f"{rates.zero_copy * split.ZERO_COPY_EFFICIENCY / 1e9:,.1f}); {pool} "
                f"{rates.cpu_alone / 1e9:,.1f} GB/s alone, {rates.cpu / 1e9:,.1f} beside the GPU, + "
                f"{rates.cpu_fixed_s * 1e6:,.0f} us a layer; copy engine {rates.copy_engine / 1e9:,.1f} GB/s"
            )
        if must:  # a fixed set of CPU experts, the ones only it can read first (the cache marks them)
            if given is None:
                pcie = rates.zero_copy * split.ZERO_COPY_EFFICIENCY
                self.split = split.choose(miss, pcie, rates.cpu, rates.cpu_fixed_s, forced=forced)
                note(self.split.why(miss))
                given = self.split.pcie_frac
            if forced:
                note(
                    f"CPU share: {forced:.0%} of the misses are only in the file's mapping and always the "
                    "CPU's"
                )
            c.share_with_cpu(1.0 - given, zero)
        else:  # per layer and token: the device gives the CPU take[n, m] of a layer's m misses in n rows
            if given is None:  # the expert kernels read misses at the probed rate (perf/bench_misses.py)
                take, frac, _, line = split.token_split(
                    rows, a, 1 - hit, per, rates.zero_copy, rates.cpu, rates.cpu_fixed_s
                )
                note(line)
            else:
                take, frac = split.take_table(rows, a, per, 1.0, 0.0, 0.0, given), given
            if not take.any():
                self.share.close()
                self.share = None
                return
            c.share_with_cpu(0.0, zero)
            c.pcie_frac = frac
        self.take = cp.asarray(take)
        self.saved = cp.zeros(3 * ks.SHARE_PAIRS, cp.int64)
        self.took = cp.zeros(1 + ks.SHARE_PAIRS, cp.int32)
        self.asked = cp.zeros(1, cp.int32)

    def _rates(self, opts: TierOptions, jit_dir: Path | None, workers: int) -> split.Rates:
        cp = cupy_module()
        lay = self.layout.layers
        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
        shapes = ",".join(f"{p.qtype}:{p.rows}x{p.cols}" for p in lay[0].parts)
        key = f"v3|{name}|{platform.processor() or platform.machine()}|{workers} threads|{shapes}"
        store = split.ProbeCache(
            (jit_dir.parent if jit_dir else Path.home() / ".cache/strata") / "probe.json"
        )
        got = None if opts.probe else store.get(key)
        if got is not None:
            return got
        alone = self.probe(256 << 20)
        cpu_alone, _ = self.share.probe()
        zero_copy, (cpu, fixed) = self._probe_together()
        rates = split.Rates(
            zero_copy, alone["copy_engine"], cpu, fixed + ks.HANDOFF_S, alone["zero_copy"], cpu_alone
        )
        store.put(key, rates)
        return rates

    def _probe_together(self, nbytes: int = 256 << 20, reps: int = 12) -> tuple[float, tuple[float, float]]:
        """Zero-copy reads on a side stream while the CPU pool runs experts: (GPU bytes/s, the CPU's rate and
        fixed cost), both under the other's load."""
        cp = cupy_module()
        _, dst, rows = self._scratch(nbytes)
        n = dst.nbytes
        start, end = cp.cuda.Event(), cp.cuda.Event()
        with self.copy_stream:
            start.record()
            for _ in range(reps):
                gather(self.kernels, rows, self._keep)
            end.record()
        cpu = self.share.probe(until=lambda: end.done)
        end.synchronize()
        gpu = reps * n / (cp.cuda.get_elapsed_time(start, end) / 1e3)
        self._keep.clear()
        del dst
        cp.get_default_memory_pool().free_all_blocks()
        return gpu, cpu

    def share_hook(self, li: int) -> ShareHook | None:
        if self.share is None:
            return None
        b = self.box
        return ShareHook(
            li,
            int(b.ctl.ctypes.data),
            int(b.h.ctypes.data),
            int(b.ids.ctypes.data),
            int(b.wts.ctypes.data),
            int(b.out.ctypes.data),
            self.ticket,
            self.err,
            ptr(self.table, 8 * li * 3 * self.layout.n_expert),
            self.layout.n_expert,
            tuple(int(z.data.ptr) for z in self.zero),  # type: ignore[arg-type]
            self.take,
            self.saved,
            self.took,
            self.asked,
        )

    def close(self) -> None:
        if self.share is not None:
            self.share.close()
            self.share = None

    def _scratch(self, nbytes: int) -> tuple[np.ndarray, Any, np.ndarray]:
        """The probes' source (the arena's largest part store, flat), a VRAM scratch of up to nbytes (whole
        MiB) and the gather rows [n, 3] that copy one into the other a MiB at a time."""
        cp = cupy_module()
        src = self.arena.arrays[int(np.argmax(self.layout.strides))].reshape(-1)  # type: ignore[union-attr]
        if src.nbytes < nbytes:  # a low-RAM arena may be smaller than the probe: pinned scratch, freed after
            import cupyx

            src = cupyx.empty_pinned(nbytes, np.uint8)
            self._keep.append(src)  # alive until the probe's copies are done (it clears _keep after its sync)
        n = min(nbytes, src.nbytes) // (1 << 20) * (1 << 20)
        dst = cp.empty(n, cp.uint8)
        rows = np.array(
            [[int(src.ctypes.data) + o, int(dst.data.ptr) + o, 1 << 20] for o in range(0, n, 1 << 20)],
            np.int64,
        )
        return src, dst, rows

    def probe(self, nbytes: int = 1 << 30) -> dict[str, float]:
        """Host-to-GPU rates from the arena (bytes/s): zero-copy reads by `gather_rows` (the decode miss
        path's kind of access) and copy-engine copies (the staging path). Syncs; between windows only."""
        cp = cupy_module()
        while True:  # a budget the cache fills leaves less than a GiB: a smaller copy still gives the rate
            try:
                src, dst, rows = self._scratch(nbytes)
                break
            except cp.cuda.memory.OutOfMemoryError:
                if nbytes <= 64 << 20:
                    raise
                nbytes //= 2
        n = dst.nbytes
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

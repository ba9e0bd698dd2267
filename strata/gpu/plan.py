"""The GPU's memory plan, from the GGUF header alone: what a model's kernels are sized by (`shape_of`), what
start-up must fit under the VRAM budget (`vram_plan`: dense weights by component, KV, recurrent state,
activations; the expert cache takes what is left) and the context served when none is asked for
(`choose_context`). GpuModel builds from it, and `strata plan` runs the same code without a GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from strata.blocks.rope import RopeStyle
from strata.errors import ConfigError
from strata.gguf.names import T, tensor
from strata.gpu.deltanet import DNDims
from strata.gpu.layers import (
    GEMV_ROWS,
    TAB,
    Activations,
    Dims,
)
from strata.gpu.lookahead import Lookahead
from strata.gpu.qwen4exp import hc_dims
from strata.gpu.tiers import TierOptions
from strata.gpu.weights import weight_bytes
from strata.models.base import Model, Structure
from strata.runtime.kvcache import KVCache, KVType
from strata.runtime.passes import PASS_SLACK
from strata.tiers import context, grow
from strata.tiers.budget import MIB, RESERVE_MIB, VramPlan
from strata.tiers.kvwindow import KVWindow
from strata.tiers.layout import ExpertLayout


@dataclass(frozen=True, slots=True)
class GpuOptions:
    budget_mib: int = 0  # 0: the device's free memory
    n_ctx: int = 0  # positions one sequence may hold (0: chosen by strata.tiers.context)
    chunk: int = 512  # rows per eager pass (0: the largest of AUTO_CHUNKS the budget fits, `with_chunk`)
    max_batch: int = 8  # decode windows up to this many sequences replay a graph
    split: bool = True  # split-K and fused decode kernels (False: the first versions; see Ops)
    q8: bool = True  # decode products on int8 inputs where the weight type allows (mmvq.py)
    reserve_mib: int = RESERVE_MIB  # VRAM left to the driver when the budget is the free memory
    expert_cache: str = "auto"  # see strata.tiers.budget
    seqs: int = (
        1  # sequences the plan keeps KV and recurrent-state room for (more may fit, drawn from the ledger)
    )
    tiers: TierOptions = dataclasses.field(
        default_factory=TierOptions
    )  # the CPU share, the policy, the profile
    kv_type: KVType = KVType.F16  # the KV cells: f16 or int8 (strata.runtime.kvcache)
    kv_grow: bool = False  # the plan keeps KV room for a first chunk; growth takes slots (strata.tiers.grow)
    kv_resident: int = 0  # cells of each layer a sequence keeps in VRAM, the rest pinned (tiers/kvwindow.py)


# plan parts that sequences take from the ledger as they come
GROWING = ("KV cache", "DeltaNet state", "QSA and PLE state")
# VRAM the process holds outside the memory pool: kernel modules, captured graphs, driver allocations.
# Measured on the H200: the 80B shape at three budgets 375-379 MiB beyond the pool's own total; the qwen4exp
# flagship synth at 22,528 MiB 601 (its hyper-connection, QSA and PLE modules, and a graph's more launches)
DRIVER_PART = "CUDA modules, graphs and driver"
DRIVER_BYTES = 384 * MIB
DRIVER_BYTES_STREAMS = 640 * MIB


def driver_bytes(d: Dims) -> int:
    """What the process holds outside the pool, by the model's shape (hyper-connection streams or not)."""
    return DRIVER_BYTES_STREAMS if d.hc is not None else DRIVER_BYTES


def structure_of(cpu: Model) -> Structure:
    st = type(cpu).structure
    if st is None:
        raise ConfigError("device", "cuda", f"{cpu.arch} has no GPU path; use device=cpu")
    return st


def shape_of(cpu: Model, n_ctx: int = 0) -> tuple[Dims, list[bool]]:
    """The kernels' dimensions of a llama / qwen3moe / qwen3next / qwen4exp model serving n_ctx positions, and
    which layers are DeltaNet."""
    p, gguf = cpu.params, cpu.gguf  # type: ignore[attr-defined]
    st = structure_of(cpu)
    hybrid, moe = st.hybrid, st.moe
    linear = list(cpu.linear) if hybrid else [False] * p.n_layer  # type: ignore[attr-defined]
    gate = tensor(T.FFN_GATE_EXP if moe else T.FFN_GATE, 0)
    shared = tensor(T.FFN_GATE_SHEXP, 0)
    a, routing = p.attn, cpu if moe else None
    dims = Dims(
        d=p.d_model,
        n_head=a.n_head,
        n_kv=a.n_kv,
        hd=a.head_dim,
        eps=p.eps,
        n_rot=p.rope.n_rot,
        neox=p.rope.style is RopeStyle.NEOX,
        pos_scale=p.rope.scale,
        scale=a.scale,
        n_expert=gguf.tensors[gate].shape[0] if moe else 0,
        ffn=gguf.tensors[gate].shape[-2],
        top_k=getattr(routing, "top_k", 0),
        norm_topk=getattr(routing, "norm_topk", True),
        gated=hybrid,
        shared_ff=gguf.tensors[shared].shape[-2] if shared in gguf.tensors else 0,
        dn=DNDims.of(cpu.dn) if hybrid else None,  # type: ignore[attr-defined]
        hc=hc_dims(cpu, n_ctx) if st.streams else None,
    )
    return dims, linear


# Under tiers a lone prompt's pass reads up to this many rows, every layer over chunk-sized parts: a pass
# stages every expert the cache lacks once a layer whatever its rows (~0.56 s on the 80B at 24 GiB, against
# ~0.1 s of compute for 4,096 rows), so one layer's staging serves four chunks. The parts keep the chunk's
# activations; the extra rows cost their residual, row table and tier counters (`wide_row_bytes`).
WIDE_ROWS = 16384


def is_tiered(plan: VramPlan, opts: GpuOptions) -> bool:
    """Whether the experts run through the tiers: a cache that cannot hold them all, one asked for, or one
    whose slots a growing KV may borrow (--kv-grow)."""
    return plan.n_total > 0 and (opts.expert_cache != "auto" or plan.n_slots < plan.n_total or opts.kv_grow)


def wide_row_bytes(d: Dims, layout: ExpertLayout) -> int:
    """VRAM a row of a wide prompt pass takes beyond the chunk's: its residual, its row of the kernels' table,
    its tier counters and routed ids."""
    return 4 * d.d + 8 * TAB + 24 + 4 * len(layout.layers) * layout.top_k


def wide_rows(d: Dims, n_ctx: int, opts: GpuOptions) -> int:
    """Rows a lone prompt's pass reads under tiers: WIDE_ROWS, or the chunk where it is more, never past the
    context (n_ctx 0, a context not chosen yet: WIDE_ROWS). qwen4exp keeps the chunk (its streams and QSA
    records are per pass), and so does --kv-resident (its window keeps room for one chunk)."""
    if d.hc is not None or opts.kv_resident:
        return opts.chunk
    return max(opts.chunk, min(WIDE_ROWS, n_ctx or WIDE_ROWS))


def kv_bytes_per_token(d: Dims, n_attn: int) -> int:
    """One position's KV over the attention layers, in the cells the kernels read (fp16 or int8)."""
    return KVCache.bytes_per_token(KVType.INT8 if d.kv8 else KVType.F16, n_attn, d.n_kv, d.hd)


def kv_window(opts: GpuOptions) -> KVWindow | None:
    """--kv-resident's window for one sequence, with room for a pass of the chunk's rows and PASS_SLACK more
    (the tiers' counters are sized alike); None: the whole KV in VRAM."""
    return KVWindow(opts.kv_resident, max(1, opts.chunk) + PASS_SLACK) if opts.kv_resident else None


def kv_stage_bytes(d: Dims, n_attn: int, n_ctx: int, opts: GpuOptions) -> int:
    """--kv-resident: VRAM for one layer's cells before the window at the longest context, which a long pass
    reads from a device copy (strata.gpu.kv.StageRoom) rather than over PCIe once per query block; 0 without
    a window or where the context never leaves it."""
    if not opts.kv_resident or n_attn == 0 or n_ctx <= opts.kv_resident:
        return 0
    cold = n_ctx - opts.kv_resident
    return -(-cold * kv_bytes_per_token(d, n_attn) // n_attn) + 4 * 256  # 4 arrays, each 256-byte aligned


# Prefill chunks tried when none is asked for, largest first. Under a VRAM budget a pass of staging_rows
# (tiers/borrow.py) or more stages every expert the cache lacks whatever its length (~0.56 s on the 80B at 24
# GiB, where 4,096 rows add ~0.1 s), so a 4k prompt read in one pass takes about half the time of two 2k ones.
# The larger chunk's activations cost slots (the 80B at 22 GiB: 10,306 of 24,576 experts against 10,689, the
# planner's decode -2%); a budget whose dense part cannot take them falls back to the smaller.
AUTO_CHUNKS = (4096, 2048)


def with_chunk(
    gguf: Any, d: Dims, linear: list[bool], vocab: int, opts: GpuOptions, budget: int, trained: int
) -> GpuOptions:
    """opts with its prefill chunk chosen where none was asked for (chunk 0): the largest of AUTO_CHUNKS whose
    plan fits the budget with its wide prompt passes under tiers (a smaller chunk with them reads a long
    prompt faster than a larger one without: a staging a wide pass, not a chunk), at opts.n_ctx (with no
    context asked for, before the KV, as choose_context plans), and no longer than the context (opts.n_ctx,
    else the `trained` one): no pass reads more."""
    if opts.chunk:
        return opts
    chunks = [min(c, opts.n_ctx or trained) for c in AUTO_CHUNKS]
    for chunk in chunks[:-1]:
        tried = dataclasses.replace(opts, chunk=chunk)
        try:
            plan = vram_plan(gguf, d, linear, opts.n_ctx, chunk, vocab, tried, budget)
        except ConfigError:
            continue
        if plan.prompt_rows in (0, wide_rows(d, opts.n_ctx, tried)):  # not tiered, or its wide passes fit
            return tried
    return dataclasses.replace(opts, chunk=chunks[-1])


def choose_context(
    gguf: Any,
    d: Dims,
    linear: list[bool],
    trained: int,
    vocab: int,
    opts: GpuOptions,
    budget: int,
    ram: int = 0,
) -> context.ContextChoice:
    """The context start-up serves with no --ctx-size (strata.tiers.context.on_gpu): the plan without KV
    says what the dense part leaves. Reads only the header, as vram_plan. With --kv-resident the host RAM
    bounds it: `ram` bytes (0: what this machine has available)."""
    base = vram_plan(gguf, d, linear, 0, opts.chunk, vocab, opts, budget)
    layout = ExpertLayout.from_gguf(gguf)
    experts = 0 if layout is None else layout.n_total * layout.slot_bytes
    per = kv_bytes_per_token(d, linear.count(False))
    if opts.kv_resident:  # the window is a fixed part of the plan: the context is the host RAM's to bound
        import psutil

        window = kv_window(opts)
        assert window is not None
        available = ram or psutil.virtual_memory().available
        return context.on_window(trained, per, opts.seqs, window.device_cells, available)
    return context.on_gpu(trained, per, opts.seqs, budget - base.dense, experts)


def vram_plan(
    gguf: Any, d: Dims, linear: list[bool], n_ctx: int, chunk: int, vocab: int, opts: GpuOptions, budget: int
) -> VramPlan:
    """What start-up must fit under the budget: dense weights by component, KV and activations; the expert
    cache gets what is left (ConfigError with the plan when the dense part does not fit). Reads only the
    header, so `strata plan` runs the same code without a GPU."""
    plan = VramPlan(budget, {f"weights: {k}": v for k, v in weight_bytes(gguf).items() if k != "experts"})
    plan.parts[DRIVER_PART] = driver_bytes(d)
    layout = ExpertLayout.from_gguf(gguf)
    if layout is not None:
        plan.slot_bytes, plan.n_total = layout.slot_bytes, layout.n_total
        # decode and full tables, the prefill table, `where`; the counters; the CPU share's slot of zeros
        # and the routed ids the cache policy learns from
        plan.parts["expert tables and counters"] = (
            76 * layout.n_total
            + 24 * (chunk + PASS_SLACK)
            + layout.slot_bytes
            + 4 * len(layout.layers) * layout.top_k * (chunk + PASS_SLACK)
        )
    n_attn = linear.count(False)
    seqs = opts.seqs  # room for the sequences that run at once: the expert cache takes what the plan leaves
    kv_per = kv_bytes_per_token(d, n_attn)
    cells, where = n_ctx, "positions"
    window = kv_window(opts)
    if window is not None:  # a window of cells in VRAM (and room for one pass), the older ones pinned in RAM
        cells = min(n_ctx, window.device_cells)
        where = f"cells of {n_ctx:,} positions in VRAM, the rest in RAM"
    stage = kv_stage_bytes(d, n_attn, n_ctx, opts)
    if stage:  # one sequence's layer at a time: the passes run in turn on one stream
        plan.parts[f"KV staging (one layer's {n_ctx - opts.kv_resident:,} cells before the window)"] = stage
    grows = opts.kv_grow and layout is not None  # a dense model has no slots to lend: its KV is planned whole
    if grows:  # room for each one's first chunk; the KV takes slots as it grows past that
        floor = grow.floor_positions(cells, chunk)
        plan.parts[f"KV cache ({seqs} x {floor:,} {where}, growing into the expert cache)"] = (
            seqs * floor * kv_per
        )
    else:
        plan.parts[f"KV cache ({seqs} x {cells:,} {where})"] = seqs * cells * kv_per
    if d.dn is not None:  # one more: a cached prefix is restored beside the fresh state it replaces
        plan.parts[f"DeltaNet state ({seqs} + 1 x)"] = (
            (seqs + 1) * 4 * (len(linear) - n_attn) * sum(d.dn.state_floats())
        )
    if d.hc is not None and d.hc.extra_floats():
        plan.parts[f"QSA and PLE state ({seqs} + 1 x)"] = (seqs + 1) * 4 * d.hc.extra_floats()
    rows = Activations.bytes_per_row(d)
    # decode attention's split-K partials (and qwen4exp's block scores)
    part = 4 * Activations.part_floats(d) + (d.hc.fixed_bytes() if d.hc is not None else 0)
    plan.parts[f"activations ({chunk}-token chunks)"] = (
        rows * (chunk + PASS_SLACK) + 4 * vocab * opts.max_batch + part
    )
    plan.parts[f"decode graph buffers (up to {opts.max_batch} sequences)"] = (
        rows * opts.max_batch + 4 * vocab * opts.max_batch + part
    )
    plan.size_cache(opts.expert_cache)
    if (
        layout is not None and opts.tiers.prefetch and plan.n_slots < plan.n_total
    ):  # tiered: the lookahead runs
        plan.parts[f"lookahead staging ({opts.tiers.prefetch} experts)"] = Lookahead.nbytes_for(
            layout, opts.tiers.prefetch, GEMV_ROWS
        )
        plan.size_cache(opts.expert_cache)
    if layout is not None and is_tiered(plan, opts):  # a lone prompt reads in wide passes (WIDE_ROWS)
        plan.prompt_rows = wide_rows(d, n_ctx, opts)
        wide = f"wide prompt passes ({plan.prompt_rows:,} rows)"
        if plan.prompt_rows > chunk:
            plan.parts[wide] = (plan.prompt_rows - chunk) * wide_row_bytes(d, layout)
            try:
                plan.size_cache(opts.expert_cache)
            except ConfigError:  # a budget the chunk's passes fit is never refused for the wide ones
                del plan.parts[wide]
                plan.prompt_rows = chunk
                plan.size_cache(opts.expert_cache)
    if grows:
        assert layout is not None
        grow.plan_worst_case(plan, seqs * cells * kv_per, layout, "vram_budget_mib")
    return plan

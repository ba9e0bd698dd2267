"""GpuModel: the llama / qwen3moe / qwen3next / qwen4exp decoder with weights, KV cache, recurrent state and
every kernel on the GPU, built from what the model file declares (its `Structure`) and the GGUF's tensors.

It implements the same Model interface as the numpy DecoderLM it is built from (same params, same
tensor names), so the engine and the scheduler drive it unchanged. forward() runs eagerly (prefill
chunks, mixed windows); forward_batch() of one token per sequence replays a captured CUDA graph
(graphs.py). Long inputs are split into chunks of `chunk` tokens so activations stay bounded.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.blocks.rope import RopeStyle
from strata.console.progress import ProgressBar
from strata.errors import ConfigError
from strata.gguf.names import T, tensor
from strata.gpu.ahead import GraphAhead
from strata.gpu.deltanet import RECURRENT, DeltaNetWeights, DNDims, RecurrentState
from strata.gpu.graphs import DecodeGraphs
from strata.gpu.kernels.rows import inv_freq
from strata.gpu.kv import GpuKV
from strata.gpu.layers import (
    GEMV_ROWS,
    TAB,
    Activations,
    Dims,
    LayerWeights,
    Segment,
    SharedExpert,
    run_ffn,
    run_layer,
    run_mixer,
)
from strata.gpu.lookahead import Lookahead
from strata.gpu.ops import HEAD_DIMS, Ops
from strata.gpu.qwen4exp import Qwen4ExpParts, hc_dims
from strata.gpu.runtime import cupy_module, ptr
from strata.gpu.tiers import GpuTiers, TierOptions
from strata.gpu.weights import GpuWeights, check_gpu_types, weight_bytes
from strata.models.base import Model, Structure
from strata.runtime.kvcache import KVCache, KVType
from strata.runtime.state import SequenceState
from strata.tiers import context, grow
from strata.tiers.budget import MIB, RESERVE_MIB, Ledger, VramPlan
from strata.tiers.kvwindow import KVWindow
from strata.tiers.layout import ExpertLayout
from strata.tiers.slots import ExpertCache
from strata.tiers.telemetry import note


@dataclass(frozen=True, slots=True)
class GpuOptions:
    budget_mib: int = 0  # 0: the device's free memory
    n_ctx: int = 0  # positions one sequence may hold (0: chosen by strata.tiers.context)
    chunk: int = 512  # rows per eager pass
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
# Measured on the H200 with the 80B shape at three budgets: 375-379 MiB beyond the pool's own total
DRIVER_PART = "CUDA modules, graphs and driver"
DRIVER_BYTES = 384 * MIB


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


def kv_bytes_per_token(d: Dims, n_attn: int) -> int:
    """One position's KV over the attention layers, in the cells the kernels read (fp16 or int8)."""
    return KVCache.bytes_per_token(KVType.INT8 if d.kv8 else KVType.F16, n_attn, d.n_kv, d.hd)


def choose_context(
    gguf: Any, d: Dims, linear: list[bool], trained: int, vocab: int, opts: GpuOptions, budget: int
) -> context.ContextChoice:
    """The context start-up serves with no --ctx-size (strata.tiers.context.on_gpu): the plan without KV
    says what the dense part leaves. Reads only the header, as vram_plan."""
    base = vram_plan(gguf, d, linear, 0, opts.chunk, vocab, opts, budget)
    layout = ExpertLayout.from_gguf(gguf)
    experts = 0 if layout is None else layout.n_total * layout.slot_bytes
    per = kv_bytes_per_token(d, linear.count(False))
    if opts.kv_resident:  # the window is a fixed part of the plan: the context is the host RAM's to bound
        import psutil

        cells = KVWindow(opts.kv_resident, opts.chunk + 64).device_cells
        return context.on_window(trained, per, opts.seqs, cells, psutil.virtual_memory().available)
    return context.on_gpu(trained, per, opts.seqs, budget - base.dense, experts)


def vram_plan(
    gguf: Any, d: Dims, linear: list[bool], n_ctx: int, chunk: int, vocab: int, opts: GpuOptions, budget: int
) -> VramPlan:
    """What start-up must fit under the budget: dense weights by component, KV and activations; the expert
    cache gets what is left (ConfigError with the plan when the dense part does not fit). Reads only the
    header, so `strata plan` runs the same code without a GPU."""
    plan = VramPlan(budget, {f"weights: {k}": v for k, v in weight_bytes(gguf).items() if k != "experts"})
    plan.parts[DRIVER_PART] = DRIVER_BYTES
    layout = ExpertLayout.from_gguf(gguf)
    if layout is not None:
        plan.slot_bytes, plan.n_total = layout.slot_bytes, layout.n_total
        # decode and full tables, the prefill table, `where`; the counters; the CPU share's slot of zeros
        # and the routed ids the cache policy learns from
        plan.parts["expert tables and counters"] = (
            76 * layout.n_total
            + 24 * (chunk + 64)
            + layout.slot_bytes
            + 4 * len(layout.layers) * layout.top_k * (chunk + 64)
        )
    n_attn = linear.count(False)
    seqs = opts.seqs  # room for the sequences that run at once: the expert cache takes what the plan leaves
    kv_per = kv_bytes_per_token(d, n_attn)
    cells, where = n_ctx, "positions"
    if opts.kv_resident:  # a window of cells in VRAM (and room for one pass), the older ones pinned in RAM
        cells = min(n_ctx, KVWindow(opts.kv_resident, chunk + 64).device_cells)
        where = f"cells of {n_ctx:,} positions in VRAM, the rest in RAM"
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
    plan.parts[f"activations ({chunk}-token chunks)"] = rows * chunk + 4 * vocab * opts.max_batch + part
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
    if grows:
        assert layout is not None
        grow.plan_worst_case(plan, seqs * cells * kv_per, layout, "vram_budget_mib")
    return plan


class GpuModel(Model):
    def __init__(self, cpu: Model, opts: GpuOptions) -> None:
        cp = cupy_module()
        self.arch = cpu.arch
        self.params = p = cpu.params  # type: ignore[attr-defined]
        self.opts = opts
        gguf = cpu.gguf  # type: ignore[attr-defined]
        check_gpu_types(gguf)
        if p.attn.head_dim not in HEAD_DIMS:
            raise ConfigError(
                "device",
                "cuda",
                f"head_dim {p.attn.head_dim} has no GPU attention kernel "
                f"(have {', '.join(map(str, HEAD_DIMS))}); use device=cpu",
            )
        st = structure_of(cpu)
        dims, self.linear = shape_of(cpu)
        self.dims = dataclasses.replace(dims, kv8=opts.kv_type is KVType.INT8)
        self.chunk = max(1, opts.chunk)
        self.n_attn = self.linear.count(False)
        free = int(cp.cuda.runtime.memGetInfo()[0])
        budget = opts.budget_mib * MIB if opts.budget_mib else free - opts.reserve_mib * MIB
        self.n_ctx = opts.n_ctx or self._choose_context(gguf, p.n_ctx_train, budget)
        if st.streams:  # the QSA records are sized by the context
            self.dims = dataclasses.replace(self.dims, hc=hc_dims(cpu, self.n_ctx))
            # the lookahead's router reads a normed residual, which hyper-connections do not have
            opts = dataclasses.replace(opts, tiers=dataclasses.replace(opts.tiers, prefetch=0))
            self.opts = opts
        plan = vram_plan(gguf, self.dims, self.linear, self.n_ctx, self.chunk, p.vocab, opts, budget)
        if plan.slot_bytes:
            note(plan.cache_line(free, 0 if opts.budget_mib else opts.reserve_mib * MIB))
        # the budget is a hard limit on the process's VRAM: the pool may hold what the plan gives everything
        # but the modules and graphs; past that it frees its cached blocks before it asks the driver for more
        cp.get_default_memory_pool().set_limit(size=max(0, plan.budget - DRIVER_BYTES))
        # sequences' KV and recurrent state are taken from the ledger as they grow: the plan only keeps room
        self.ledger = Ledger(
            plan.budget, plan.total - sum(v for k, v in plan.parts.items() if k.startswith(GROWING))
        )
        self.stream = cp.cuda.Stream(non_blocking=True)
        layout = ExpertLayout.from_gguf(gguf)
        # with --kv-grow a cache that holds every expert still lends its slots to a growing KV
        tiered = layout is not None and (
            opts.expert_cache != "auto" or plan.n_slots < plan.n_total or opts.kv_grow
        )
        # the weights' upload, layer by layer (tiered experts go to the arena, which has its own bar)
        sizes = weight_bytes(gguf)
        upload = ProgressBar(
            "weights to VRAM", sum(sizes.values()) - (sizes.get("experts", 0) if tiered else 0)
        )
        with self.stream:
            self.w = GpuWeights(gguf)
            self.tiers = (
                GpuTiers(gguf, layout, plan.n_slots, self.chunk + 64, GEMV_ROWS, opts.tiers)
                if tiered
                else None
            )
            if opts.kv_grow and self.tiers is not None:
                grow.SlotLender(self.tiers.cache, self.ledger, self.tiers.quiesce)
            self.hc = Qwen4ExpParts(cpu, self.w, self.dims.hc) if self.dims.hc is not None else None
            self.host_inputs = self.hc is not None and self.hc.dims.ple is not None
            self.layers: list[LayerWeights] = []
            for i in range(p.n_layer):
                self.layers.append(self._layer(i, st.moe, st.hybrid))
                upload(self.w.nbytes())
            out = tensor(T.OUTPUT)
            self.embd = self.w.matrix(tensor(T.TOKEN_EMBD))
            self.head = self.w.matrix(out) if self.w.has(out) else self.embd  # tied embeddings
            self.out_norm = None if self.hc is not None else self.w.vector(tensor(T.OUTPUT_NORM))
            self.inv_freq = cp.asarray(inv_freq(p.rope))
            self.stream.synchronize()
        upload(self.w.nbytes(), self.w.nbytes())  # what went up, where the estimate differs (a tied head)
        self.ops = Ops(
            {(L.gate.qtype, L.up.qtype, L.down.qtype) for L in self.layers} if st.moe else set(),
            opts.split,
            opts.q8,
            self.hc.mixer_types() if self.hc is not None else (),
        )
        self.graphs = DecodeGraphs(self, opts.max_batch)
        # with tiers, passes of more than GEMV_ROWS rows read every miss through the full table (the CPU share
        # is for decode rows), and borrowing chunks through the prefill table (staged, borrowed slots)
        self._full_layers = self._tier_layers(None if self.tiers is None else self.tiers.full)
        self._prefill_layers = self._tier_layers(None if self.tiers is None else self.tiers.ptab)

    def _choose_context(self, gguf: Any, trained: int, budget: int) -> int:
        """No context asked for: the trained one when its KV fits the plan, else the largest that does."""
        choice = choose_context(gguf, self.dims, self.linear, trained, self.params.vocab, self.opts, budget)
        logging.getLogger("strata.gpu").info("%s", choice.line)
        return choice.n_ctx

    def _tier_layers(self, table: Any) -> list[LayerWeights]:
        tiers = self.tiers
        if tiers is None:
            return self.layers
        of = tiers.cache.layer_of
        return [
            dataclasses.replace(
                L,
                tier=tiers.hook(of[i], decode=False),
                **dict(zip(("gate", "up", "down"), tiers.matrices(of[i], table))),
            )
            if i in of
            else L
            for i, L in enumerate(self.layers)
        ]

    def layers_for(self, n: int) -> list[LayerWeights]:
        """The layers a pass of n rows runs: decode rows give the CPU its share of the misses, more rows read
        them all through the full table."""
        return self.layers if n <= GEMV_ROWS else self._full_layers

    def close(self) -> None:
        """Stop the CPU share's threads (the GPU memory goes with the model)."""
        if self.tiers is not None:
            self.tiers.close()

    @property
    def ple_stats(self) -> Any:
        """qwen4exp's PLE table traffic (the host gathers its rows), for the timings; None for others."""
        return None if self.hc is None else self.hc.cpu.ple_stats

    @property
    def expert_cache(self) -> ExpertCache | None:
        return None if self.tiers is None else self.tiers.cache

    def _layer(self, i: int, moe: bool, hybrid: bool) -> LayerWeights:
        w, d = self.w, self.dims

        def opt(k: T) -> Any:
            return w.vector(tensor(k, i)) if w.has(tensor(k, i)) else None

        names = (T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP) if moe else (T.FFN_GATE, T.FFN_UP, T.FFN_DOWN)
        hook = None
        if self.tiers is not None and i in self.tiers.cache.layer_of:
            li = self.tiers.cache.layer_of[i]
            g, u, dn = self.tiers.matrices(li)
            hook = self.tiers.hook(li)
        else:
            g, u, dn = (w.matrix(tensor(k, i)) for k in names)
        shared = None
        if d.shared_ff:
            shared = SharedExpert(
                [w.matrix(tensor(T.FFN_GATE_SHEXP, i)), w.matrix(tensor(T.FFN_UP_SHEXP, i))],
                w.matrix(tensor(T.FFN_DOWN_SHEXP, i)),
                w.matrix(tensor(T.FFN_GATE_INP_SHEXP, i)),
            )
        # hyper-connections (qwen4exp) have no norms: the sublayers read the mixed input in act.h
        streams = self.hc is not None
        ffn_norm = None if streams else w.vector(tensor(T.ATTN_POST_NORM if hybrid else T.FFN_NORM, i))
        attn_norm = None if streams else w.vector(tensor(T.ATTN_NORM, i))
        router = w.matrix(tensor(T.FFN_GATE_INP, i)) if moe else None
        if self.linear[i]:
            return LayerWeights(
                attn_norm=attn_norm,
                qkv=[],
                o=None,
                q_norm=None,
                k_norm=None,
                ffn_norm=ffn_norm,
                gate=g,
                up=u,
                down=dn,
                router=router,
                shared=shared,
                dn=DeltaNetWeights.load(w, i, d.dn is not None and d.dn.fused_r > 0),
                dn_layer=self.linear[:i].count(True),
                tier=hook,
            )
        if hybrid:  # gated attention: q_proj rows are per head [query | gate]
            q, attn_gate = w.query_and_gate(tensor(T.ATTN_Q, i), d.n_head, d.hd)
        else:
            q, attn_gate = w.matrix(tensor(T.ATTN_Q, i)), None
        return LayerWeights(
            attn_norm=attn_norm,
            qkv=[q] + [w.matrix(tensor(k, i)) for k in (T.ATTN_K, T.ATTN_V)],
            o=w.matrix(tensor(T.ATTN_OUT, i)),
            q_norm=opt(T.ATTN_Q_NORM),
            k_norm=opt(T.ATTN_K_NORM),
            ffn_norm=ffn_norm,
            gate=g,
            up=u,
            down=dn,
            router=router,
            attn_gate=attn_gate,
            shared=shared,
            kv_layer=self.linear[:i].count(False),
            tier=hook,
            sparse=None if self.hc is None else self.hc.sparse(i),
        )

    # ---- Model interface ----
    def decode_ahead(self) -> GraphAhead | None:
        """The scheduler's decode pipeline inside the graph; None (the host's pipeline) while the CPU takes a
        share of the misses, whose calls are counted pass by pass in sync."""
        if (
            not self.graphs.max_batch
            or self.host_inputs  # the PLE rows of a drawn token are hashed and gathered on the host
            or (self.tiers is not None and self.tiers.share is not None)
        ):
            return None
        return GraphAhead(self)

    def new_state(self) -> SequenceState:
        d = self.dims
        kind = KVType.INT8 if d.kv8 else KVType.F16
        window = KVWindow(self.opts.kv_resident, self.chunk + 64) if self.opts.kv_resident else None
        st = SequenceState(GpuKV(self.ledger, self.n_attn, d.n_kv, d.hd, self.n_ctx, kind, window))  # type: ignore[arg-type]
        if d.dn is not None:
            st.layers[RECURRENT] = RecurrentState(self.ledger, d.dn, len(self.linear) - self.n_attn)
        if self.hc is not None:
            st.layers.update(self.hc.new_state(self.ledger))
        return st

    @staticmethod
    def table_row(state: SequenceState, pos: int, token: int) -> list[int]:
        """The kernels' row (layers.TAB columns) for `state` at position pos."""
        rec = state.layers.get(RECURRENT)
        cols = rec.table_cols() if isinstance(rec, RecurrentState) else [0, 0]
        extra = Qwen4ExpParts.table_col(state)  # qwen4exp's QSA records, then PLE windows (0: none)
        kv = state.kv
        return kv.table_row(pos) + [token] + cols + kv.scale_cols() + [extra] + kv.cold_cols()  # type: ignore[attr-defined]

    def forward(self, tokens: np.ndarray, state: SequenceState, all_logits: bool = True) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if len(tokens) == 1 and self.graphs.max_batch:  # a decode step: replay the captured graph
            return self.graphs.step([int(tokens[0])], [state])
        outs = []
        for s in range(0, len(tokens), self.chunk):
            part = tokens[s : s + self.chunk]
            last = s + self.chunk >= len(tokens)
            outs.append(self._pass([part], [state], "all" if all_logits else ("last" if last else "none")))
        return np.concatenate(outs) if all_logits else outs[-1]

    def forward_batch(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        tokens = [np.asarray(t, dtype=np.int64).reshape(-1) for t in tokens]
        if all(len(t) == 1 for t in tokens) and len(tokens) <= self.graphs.max_batch:
            return list(self.graphs.step([int(t[0]) for t in tokens], states))
        return list(self._pass(tokens, states, "last"))

    # ---- eager pass ----
    def _pass(self, tokens: list[np.ndarray], states: list[SequenceState], want: str) -> np.ndarray:
        """Every layer over the concatenated rows; logits of all rows, each sequence's last, or none."""
        cp = cupy_module()
        n = sum(len(t) for t in tokens)
        tiers = self.tiers
        assert tiers is None or n <= len(tiers.counts), f"a pass of {n} rows outgrows the tier counters"
        staging = None
        with self.stream:
            for t, s in zip(tokens, states):  # before the tables go up: growth may take slots (--kv-grow)
                s.kv.reserve(s.n_past + len(t))  # type: ignore[attr-defined]
            if tiers is not None:
                tiers.publish()
                if n >= tiers.cache.borrow_min:
                    staging = tiers.begin_staging()
            segs, tab_rows, start = [], [], 0
            for t, s in zip(tokens, states):
                kv: GpuKV = s.kv  # type: ignore[assignment]
                segs.append(Segment(start, len(t), s.n_past, kv))
                tab_rows += [self.table_row(s, s.n_past + j, int(tok)) for j, tok in enumerate(t)]
                start += len(t)
            tab = cp.asarray(np.asarray(tab_rows, np.int64))
            act = Activations(self.dims, n, 0, 0)
            self.prepare(tokens, states, act)
            self.embed(act, n, tab)
            for i, layer in enumerate(self.layers_for(n)):
                if staging is None:
                    self.run_layer(i, layer, act, n, tab, segs)
                    continue
                assert tiers is not None
                li = tiers.cache.layer_of[i]
                tiers.before_layer(li)
                self.run_layer(i, self._prefill_layers[i], act, n, tab, segs)
                tiers.after_layer(staging, li)
            staged_bytes = tiers.end_staging(staging) if tiers is not None and staging is not None else 0
            if tiers is not None:
                tiers.overlap()
            for t, s, g in zip(tokens, states, segs):
                s.n_past += len(t)
                s.tokens.extend(int(v) for v in t)
                g.kv.length = s.n_past
            if tiers is not None:
                tiers.cache.settle(
                    tiers.take_counts(n), staged_bytes, [s.experts for s in states], [len(t) for t in tokens]
                )
                tiers.after_pass(n)
            if want == "none":
                self.stream.synchronize()
                return np.empty((0, self.params.vocab), np.float32)
            rows = n
            if want != "all":  # each sequence's last row moves to the front for the head
                rows = len(segs)
                idx = cp.asarray([g.start + g.n - 1 for g in segs])
                if self.hc is not None:
                    self.hc.keep_rows(act, idx)
                else:
                    act.x[:rows] = act.x[idx]
            logits = self.head_logits(act, rows)
            return logits.get(stream=self.stream)

    # ---- the steps of a pass (this eager one and the decode graphs') ----
    def prepare(self, tokens: list[np.ndarray], states: list[SequenceState], act: Activations) -> None:
        """Host inputs of a pass beside the row table: qwen4exp's PLE rows."""
        if self.hc is not None:
            self.hc.prepare(tokens, states, act)

    def embed(self, act: Activations, n: int, tab: Any) -> None:
        """The rows' tokens (column 4 of tab) -> act.x, or the hyper-connection streams."""
        self.ops.embed(self.embd, ptr(tab, 32), n, act.x, id_stride=TAB)
        if self.hc is not None:
            self.hc.embed(self.ops, act, n)

    def run_layer(
        self, i: int, layer: LayerWeights, act: Activations, n: int, tab: Any, segs: list[Segment] | None
    ) -> None:
        if self.hc is not None:
            self.hc.run_layer(
                self.ops, i, layer, self.dims, act, n, tab, segs, self.inv_freq, run_mixer, run_ffn
            )
            return
        run_layer(self.ops, i, layer, self.dims, act, n, tab, segs, self.inv_freq)

    def head_logits(self, act: Activations, n: int, out: Any = None) -> Any:
        """Final norm (or mixer) and the output projection for the first n rows: logits [n, vocab] (gemv,
        fp32)."""
        cp = cupy_module()
        if out is None:
            out = cp.empty((n, self.params.vocab), cp.float32)
        x = act.x
        if self.hc is not None:
            self.hc.final(self.ops, act, n, self.dims.eps)
            x = act.h
        for r in range(0, n, 64):  # bounded blocks of rows: each gemv pass reads the head once per 8 rows
            m = min(64, n - r)
            self.ops.matvec(
                [self.head],
                ptr(x, 4 * r * self.dims.d),
                m,
                ptr(out, 4 * r * self.params.vocab),
                ldx=self.dims.d,
                ldy=self.params.vocab,
                norm=self.out_norm,
                eps=self.dims.eps,
            )
        return out

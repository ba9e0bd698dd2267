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
from typing import Any

import numpy as np

from strata.console.progress import ProgressBar
from strata.errors import ConfigError
from strata.gguf.names import T, tensor
from strata.gpu.ahead import GraphAhead
from strata.gpu.deltanet import RECURRENT, DeltaNetWeights, RecurrentState
from strata.gpu.graphs import DecodeGraphs
from strata.gpu.kernels.rows import inv_freq
from strata.gpu.kv import GpuKV, StageRoom
from strata.gpu.layers import (
    GEMV_ROWS,
    TAB,
    Activations,
    LayerWeights,
    SharedExpert,
    run_ffn,
    run_layer,
    run_mixer,
)
from strata.gpu.ops import HEAD_DIMS, Ops
from strata.gpu.plan import (
    DRIVER_PART,
    GROWING,
    GpuOptions,
    choose_context,
    is_tiered,
    kv_stage_bytes,
    kv_window,
    shape_of,
    structure_of,
    vram_plan,
    with_chunk,
)
from strata.gpu.qwen4exp import Qwen4ExpParts, hc_dims
from strata.gpu.runtime import cupy_module, ptr
from strata.gpu.segments import Segment
from strata.gpu.tiers import GpuTiers
from strata.gpu.weights import GpuWeights, check_gpu_types, weight_bytes
from strata.gpu.wide import Capture, part_of, rows_from
from strata.models.base import Model
from strata.runtime.kvcache import KVType
from strata.runtime.passes import PASS_SLACK, STEP_ROWS, pass_spans
from strata.runtime.state import Checkpoint, SequenceState
from strata.tiers import grow
from strata.tiers.budget import MIB, Ledger
from strata.tiers.layout import ExpertLayout
from strata.tiers.slots import ExpertCache
from strata.tiers.telemetry import note


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
        self.n_attn = self.linear.count(False)
        free = int(cp.cuda.runtime.memGetInfo()[0])
        budget = opts.budget_mib * MIB if opts.budget_mib else free - opts.reserve_mib * MIB
        self.opts = opts = with_chunk(gguf, self.dims, self.linear, p.vocab, opts, budget, p.n_ctx_train)
        self.chunk = opts.chunk
        self.n_ctx = opts.n_ctx or self._choose_context(gguf, p.n_ctx_train, budget)
        if st.streams:  # the QSA records are sized by the context
            self.dims = dataclasses.replace(self.dims, hc=hc_dims(cpu, self.n_ctx))
        plan = vram_plan(gguf, self.dims, self.linear, self.n_ctx, self.chunk, p.vocab, opts, budget)
        if plan.slot_bytes:
            note(plan.cache_line(free, 0 if opts.budget_mib else opts.reserve_mib * MIB))
        # the budget is a hard limit on the process's VRAM: the pool may hold what the plan gives everything
        # but the modules and graphs; past that it frees its cached blocks before it asks the driver for more
        cp.get_default_memory_pool().set_limit(size=max(0, plan.budget - plan.parts[DRIVER_PART]))
        # sequences' KV and recurrent state are taken from the ledger as they grow: the plan only keeps room
        self.ledger = Ledger(
            plan.budget, plan.total - sum(v for k, v in plan.parts.items() if k.startswith(GROWING))
        )
        # --kv-resident: the plan's room for one layer's cells before the window (long passes read them there)
        self.kv_stage = StageRoom(kv_stage_bytes(self.dims, self.n_attn, self.n_ctx, opts))
        self.stream = cp.cuda.Stream(non_blocking=True)
        layout = ExpertLayout.from_gguf(gguf)
        # with --kv-grow a cache that holds every expert still lends its slots to a growing KV
        tiered = layout is not None and is_tiered(plan, opts)
        # under tiers a lone prompt's pass reads up to plan.prompt_rows, its layers over chunk-sized parts
        self.prompt_rows = plan.prompt_rows if tiered else self.chunk
        sizes = weight_bytes(gguf)
        with self.stream:
            self.w = GpuWeights(gguf)
            self.tiers = (  # the arena and the slots' fill say what they cost in their own lines
                GpuTiers(gguf, layout, plan.n_slots, self.prompt_rows + PASS_SLACK, GEMV_ROWS, opts.tiers)
                if tiered
                else None
            )
            if opts.kv_grow and self.tiers is not None:
                grow.SlotLender(self.tiers.cache, self.ledger, self.tiers.quiesce)
            # the weights' upload, layer by layer (tiered experts went to the arena and the slots)
            upload = ProgressBar(
                "weights to VRAM", sum(sizes.values()) - (sizes.get("experts", 0) if tiered else 0)
            )
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
        window = kv_window(self.opts)
        kv = GpuKV(self.ledger, self.n_attn, d.n_kv, d.hd, self.n_ctx, kind, window, self.kv_stage)
        st = SequenceState(kv)  # type: ignore[arg-type]
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
        # every row's logits keep to chunk passes: a wide pass's would outgrow the plan's activations
        for s, e in pass_spans(len(tokens), self.chunk if all_logits else self.prompt_rows):
            want = "all" if all_logits else ("last" if e == len(tokens) else "none")
            outs.append(self._pass([tokens[s:e]], [state], want))
        return np.concatenate(outs) if all_logits else outs[-1]

    def forward_batch(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        tokens = [np.asarray(t, dtype=np.int64).reshape(-1) for t in tokens]
        if max(len(t) for t in tokens) <= STEP_ROWS and len(tokens) <= self.graphs.max_batch:
            return self._steps(tokens, states)
        return list(self._pass(tokens, states, "last"))

    def forward_marked(
        self, tokens: np.ndarray, state: SequenceState, marks: list[int]
    ) -> tuple[np.ndarray, list[Checkpoint]]:
        """One lone prompt's pass, its last logits, and its recurrent state as it stood at each of `marks`
        (positions inside the pass, ascending) in host RAM: a hybrid model's prefix-cache checkpoints taken
        inside a wide pass, whose parts end at them (`SequenceState.snapshot(at)` adds the KV's cells)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        kept: list[Checkpoint] = []
        return self._pass([tokens], [state], "last", marks, kept)[-1], kept

    def _steps(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        """A window of at most STEP_ROWS rows a sequence as captured decode steps, one row of each sequence a
        step; each sequence's last logits."""
        last: list[np.ndarray] = [np.empty(0, np.float32)] * len(tokens)
        for j in range(max(len(t) for t in tokens)):
            rows = [i for i, t in enumerate(tokens) if j < len(t)]
            logits = self.graphs.step([int(tokens[i][j]) for i in rows], [states[i] for i in rows])
            for r, i in enumerate(rows):
                last[i] = logits[r]
        return last

    # ---- eager pass ----
    def _pass(
        self,
        tokens: list[np.ndarray],
        states: list[SequenceState],
        want: str,
        marks: list[int] | None = None,
        kept: list[Checkpoint] | None = None,
    ) -> np.ndarray:
        """Every layer over the concatenated rows; logits of all rows, each sequence's last, or none. marks:
        a lone sequence's positions inside the pass whose recurrent state goes to `kept` (forward_marked)."""
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
                    staging = tiers.borrowing.begin()
            segs, tab_rows, start = [], [], 0
            for t, s in zip(tokens, states):
                kv: GpuKV = s.kv  # type: ignore[assignment]
                segs.append(Segment(start, len(t), s.n_past, kv))
                tab_rows += [self.table_row(s, s.n_past + j, int(tok)) for j, tok in enumerate(t)]
                start += len(t)
            tab = cp.asarray(np.asarray(tab_rows, np.int64))
            parts = self._parts(n, segs, [m - states[0].n_past for m in marks or ()])
            marked = self._marked(states[0], marks or [])
            act = Activations(self.dims, max(m for _, m in parts), 0, 0, n)  # a wide pass: the parts' buffers
            self.prepare(tokens, states, act)
            self.embed(act, n, tab)
            for i, layer in enumerate(self.layers_for(n)):
                li = -1 if staging is None else tiers.cache.layer_of[i]  # type: ignore[union-attr]
                if li >= 0:
                    tiers.borrowing.before_layer(li)  # type: ignore[union-attr]
                    layer = self._prefill_layers[i]
                if len(parts) == 1:
                    self.run_layer(i, layer, act, n, tab, segs)
                for start, m in parts if len(parts) > 1 else ():
                    seg = [segs[0].at(start, m)]
                    self.run_layer(i, rows_from(layer, start), part_of(act, start, m), m, tab[start:], seg)
                    if layer.dn is not None and segs[0].n_past + start + m in marked:
                        marked[segs[0].n_past + start + m].take(layer.dn_layer, self.stream)
                if li >= 0:
                    tiers.borrowing.after_layer(staging, li)  # type: ignore[union-attr]
            staged_bytes = tiers.borrowing.end(staging) if tiers is not None and staging is not None else 0
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
            if kept is not None:  # the pass's copies land before the logits come back
                kept += [Checkpoint(pos, {RECURRENT: cap.host}) for pos, cap in marked.items()]
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

    def _parts(self, n: int, segs: list[Segment], cuts: list[int]) -> list[tuple[int, int]]:
        """(start, rows) of each part a pass's layers run over: the whole pass, or for a lone prompt's wide
        pass (more rows than the chunk's activations hold) chunk-sized parts in order, each part's rows
        attending to the cells the parts before it wrote in the same layer; a part also ends at each of
        `cuts` (rows into the pass)."""
        if n <= self.chunk + PASS_SLACK and not cuts:
            return [(0, n)]
        assert len(segs) == 1 and n <= self.prompt_rows + PASS_SLACK, f"a pass of {n} rows has no room"
        ends = sorted({e for _, e in pass_spans(n, self.chunk)} | {c for c in cuts if 0 < c < n})
        return [(s, e - s) for s, e in zip([0, *ends[:-1]], ends)]

    def _marked(self, state: SequenceState, marks: list[int]) -> dict[int, Capture]:
        """Host buffers for the recurrent state at each mark (forward_marked)."""
        if not marks:
            return {}
        rec = state.layers[RECURRENT]
        assert isinstance(rec, RecurrentState) and set(state.layers) == {RECURRENT}, "marks are for DeltaNet"
        return {m: Capture(rec) for m in marks}

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

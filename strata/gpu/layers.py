"""The decoder layer as a sequence of kernel launches, for llama, qwen3moe and qwen3next (and, as the
sublayers strata/gpu/qwen4exp.py puts between its hyper-connection mixers, qwen4exp).

`LayerWeights` holds one layer's device tensors; `Activations` the device buffers one forward
pass writes. `run_layer` launches a layer over n rows: with few rows (decode, up to GEMV_ROWS)
every projection is a gemv with the RMSNorm fused into its input staging (on int8 inputs for the
types mmvq.py reads), routing runs inside the router's launch and the q/k epilogue inside the
attention's (6 launches a MoE layer); with many (prefill) projections are tensor-core GEMMs, the
router one fp32 GEMM, and MoE tokens are grouped by expert. Nothing here allocates, so the decode
form of it can be captured into a CUDA graph.

Legend: N = rows (tokens), D = hidden, H/KV = query/key heads, HD = head dim, E = experts,
A = active experts, F = expert (or FFN) width, P = N * A.

Qwen3-Next layers add three things, each optional here: a DeltaNet sublayer in place of attention
(deltanet.py), an output gate on attention (sigmoid of a second half of q_proj, `attn_gate`), and a
shared expert behind a sigmoid gate after the routed ones. The FFN's launches are ffn.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strata.gpu.deltanet import DeltaNetWeights, DNDims, run_deltanet
from strata.gpu.ffn import run_ffn
from strata.gpu.kernels import attention, moe
from strata.gpu.lookahead import fork_for
from strata.gpu.ops import GEMV_ROWS, MOE_GEMV_MAX, Ops
from strata.gpu.qwen4exp import HCBuffers, HCDims
from strata.gpu.runtime import cupy_module, ptr
from strata.gpu.segments import Segment, decode_rows_only, runs
from strata.gpu.tiers import TierHook
from strata.gpu.weights import DevMatrix, same_kind

# int64 columns per row of the table kernels read: k ptr, v ptr, cap, position, token, the DeltaNet
# state's conv and ssm addresses (0 for models without it), int8 KV cells' k and v scale addresses (0 for
# fp16 cells), qwen4exp's QSA and PLE state address (0 for other models), and the --kv-resident window's
# host cells: k, v, k scales, v scales, cells a kv head, base (kernels/cells.py COLD; 0 without)
TAB = 16


@dataclass(frozen=True, slots=True)
class Dims:
    d: int
    n_head: int
    n_kv: int
    hd: int
    eps: float
    n_rot: int
    neox: bool
    pos_scale: float
    scale: float  # softmax scale
    n_expert: int = 0  # 0: dense FFN
    top_k: int = 0
    norm_topk: bool = True
    ffn: int = 0  # expert width (MoE) or FFN width (dense)
    gated: bool = False  # attention output gate (Qwen3-Next)
    shared_ff: int = 0  # shared expert width, 0: none
    dn: DNDims | None = None  # DeltaNet layers' shape, None: attention only
    kv8: bool = False  # the KV cache holds int8 cells (--kv-type int8)
    hc: HCDims | None = None  # hyper-connection streams and what they carry (qwen4exp), None: one residual

    @property
    def qkv_cols(self) -> int:
        return (self.n_head + 2 * self.n_kv) * self.hd


@dataclass(slots=True)
class SharedExpert:
    gate_up: list[DevMatrix]  # gate, up [F, D]
    down: DevMatrix  # [D, F]
    gate_inp: DevMatrix  # [1, D]: the sigmoid gate's logit


@dataclass(slots=True)
class LayerWeights:
    attn_norm: Any  # the mixer's input norm (attention or DeltaNet)
    qkv: list[DevMatrix]  # q, k, v (empty in a DeltaNet layer)
    o: DevMatrix | None
    q_norm: Any  # None without Qwen3's per-head norms
    k_norm: Any
    ffn_norm: Any
    gate: DevMatrix  # experts [E, F, D] or dense [F, D]
    up: DevMatrix
    down: DevMatrix
    router: DevMatrix | None = None
    attn_gate: DevMatrix | None = None  # gated attention: sigmoid(h @ attn_gate.T) scales the heads' output
    shared: SharedExpert | None = None
    dn: DeltaNetWeights | None = None  # set: the mixer is DeltaNet
    kv_layer: int = 0  # this attention layer's index in the KV cache
    dn_layer: int = 0  # this DeltaNet layer's index in the recurrent state
    tier: TierHook | None = None  # set: the experts live in the tiers; count each routed lookup
    # set: attention over the keys this object selects per query (qwen4exp's QSA, strata.gpu.qwen4exp), which
    # reads the layer's normed input from act.h; it writes act.att as _attention would
    sparse: Any = None


class Activations:
    """Device buffers for up to `n` rows of one pass (allocated once; views are taken per call)."""

    def __init__(self, dims: Dims, n: int, vocab_rows: int, vocab: int, residual_rows: int = 0) -> None:
        """residual_rows: rows of the residual x where it holds more than n (a wide prompt pass's)."""
        cp = cupy_module()
        f32 = cp.float32
        self.n = n
        self.x = cp.empty((max(n, residual_rows), dims.d), f32)
        self.h = cp.empty((n, dims.d), f32)
        self.qkv = cp.empty((n, dims.qkv_cols), f32)
        self.q = cp.empty((n, dims.n_head * dims.hd), f32)
        self.att = cp.empty((n, dims.n_head * dims.hd), f32)
        self.logits = cp.empty((vocab_rows, vocab), f32)
        # decode attention's split-K partials for up to GEMV_ROWS rows at once: a decode pass's, or a mixed
        # window's decode rows one by one (a decode-only pass of more rows runs unsplit)
        self.att_part = cp.empty(Activations.part_floats(dims), f32)
        a = max(dims.top_k, 1)
        p = n * a
        if dims.n_expert:
            e = dims.n_expert
            self.router = cp.empty((n, e), f32)
            self.counter = cp.zeros(1, cp.int32)  # router_topk's blocks-done count, 0 between launches
            self.ids = cp.empty(p, cp.int32)
            self.wts = cp.empty(p, f32)
            self.gu = cp.empty((p, 2 * dims.ffn), f32)  # gate|up outputs (GEMM) or silu(g)*u (gemv, first F)
            self.counts = cp.empty(e, cp.int32)
            self.offsets = cp.empty(e + 1, cp.int32)
            self.cursor = cp.empty(e, cp.int32)
            self.tiles = cp.empty(3 * moe.max_tiles(p, e), cp.int32)
            self.n_tiles = cp.empty(1, cp.int32)
            self.rows = cp.empty(p, cp.int32)
            self.tok_of_row = cp.empty(p, cp.int32)
            self.y = cp.empty((p, dims.d), f32) if n > GEMV_ROWS else None
            # int8 codes and per-32 (d, d * sum) scales of the rows whose experts run per pair (up to
            # Ops.moe_gemv_rows): normed inputs and expert activations
            nq = min(n, MOE_GEMV_MAX)
            self.hq = cp.empty((nq, dims.d), cp.int8)
            self.hds = cp.empty((nq, dims.d // 16), f32)
            self.aq = cp.empty((nq * a, dims.ffn), cp.int8)
            self.ads = cp.empty((nq * a, dims.ffn // 16), f32)
        else:
            self.gu = cp.empty((n, 2 * dims.ffn), f32)
        if dims.gated:
            self.gate = cp.empty((n, dims.n_head * dims.hd), f32)
        if dims.shared_ff:
            self.sgu = cp.empty((n, 2 * dims.shared_ff), f32)
            self.sy = cp.empty((n, dims.d), f32)
            self.sg = cp.empty((n, 1), f32)
        if dims.dn is not None:
            self.dn_mix = cp.empty((n, dims.dn.mix_cols), f32)
            self.dn_y = cp.empty((n, dims.dn.conv_channels), f32)
            self.dn_o = cp.empty((n, dims.dn.inner), f32)
        self.hc = None if dims.hc is None else HCBuffers(dims.hc, n)

    @staticmethod
    def part_floats(dims: Dims) -> int:
        return GEMV_ROWS * dims.n_head * attention.SPLITS * (dims.hd + 2)

    @staticmethod
    def bytes_per_row(dims: Dims) -> int:
        a = max(dims.top_k, 1)
        per = 4 * (2 * dims.d + dims.qkv_cols + 2 * dims.n_head * dims.hd)
        if dims.gated:
            per += 4 * dims.n_head * dims.hd
        if dims.shared_ff:
            per += 4 * (2 * dims.shared_ff + dims.d + 1)
        if dims.dn is not None:
            per += 4 * (dims.dn.mix_cols + dims.dn.conv_channels + dims.dn.inner)
        if dims.hc is not None:
            per += dims.hc.bytes_per_row()
        if dims.n_expert:
            return (
                per + 4 * (dims.n_expert + a * (2 * dims.ffn + dims.d + 6)) + dims.d + a * dims.ffn
            )  # + int8 codes
        return per + 4 * 2 * dims.ffn


def run_layer(
    ops: Ops,
    i: int,
    w: LayerWeights,
    dm: Dims,
    act: Activations,
    n: int,
    tab: Any,
    segments: list[Segment] | None,
    inv_freq: Any,
) -> None:
    """x[:n] += mixer(norm(x)); x[:n] += ffn(norm(x)) for layer i. segments=None: every row is a
    decode row whose position and cache come from `tab` (the graph case)."""
    # the layer's predicted misses cross PCIe while its mixer runs (routed from the residual, normed)
    ahead = fork_for(ops, w.tier, w.router, w.ffn_norm, dm.eps, act.x, n, dm.norm_topk, n <= GEMV_ROWS)
    run_mixer(ops, w, dm, act, n, tab, segments, inv_freq, None if ahead is None else ahead.read_done)
    run_ffn(ops, w, dm, act, n)


def run_mixer(
    ops: Ops,
    w: LayerWeights,
    dm: Dims,
    act: Activations,
    n: int,
    tab: Any,
    segments: list[Segment] | None,
    inv_freq: Any,
    before_write: Callable[[], None] | None = None,
) -> None:
    """x[:n] += mixer(its input): DeltaNet or attention. The input is norm(x) (fused into the first products)
    or, for a layer without attn_norm (hyper-connections), act.h as it stands."""
    small = n <= GEMV_ROWS
    if w.dn is not None:
        assert dm.dn is not None
        rows = runs(segments)
        run_deltanet(
            ops, w.dn_layer, w.dn, dm.dn, w.attn_norm, dm.eps, act, n, tab, TAB, rows, small, before_write
        )
    else:
        _attention_block(ops, w, dm, act, n, tab, segments, inv_freq, small, before_write)


def _attention_block(
    ops: Ops,
    w: LayerWeights,
    dm: Dims,
    act: Activations,
    n: int,
    tab: Any,
    segments: list[Segment] | None,
    inv_freq: Any,
    small: bool,
    before_write: Callable[[], None] | None = None,
) -> None:
    x, h, layer = act.x, act.h, w.kv_layer
    src = h if w.attn_norm is None else x  # no norm: act.h holds the input (hyper-connections)
    assert w.o is not None
    if small and same_kind(w.qkv):
        ops.matvec(w.qkv, src, n, act.qkv, norm=w.attn_norm, eps=dm.eps)
        if w.attn_gate is not None:
            ops.matvec([w.attn_gate], src, n, act.gate, norm=w.attn_norm, eps=dm.eps)
    else:  # normalise once, then q|k|v as one product where their types agree, else one each
        if w.attn_norm is not None:
            ops.rmsnorm(x, w.attn_norm, dm.eps, n, dm.d, h)
        groups = [w.qkv] if same_kind(w.qkv) else [[m] for m in w.qkv]
        col = 0
        for ms in groups:
            out = ptr(act.qkv, 4 * col)
            if small:
                ops.matvec(ms, h, n, out, ldy=dm.qkv_cols)
            else:
                ops.matmul(ms, h, n, out, ldc=dm.qkv_cols)
            col += sum(m.rows for m in ms)
        if w.attn_gate is not None:
            if small:
                ops.matvec([w.attn_gate], h, n, act.gate)
            else:
                ops.matmul(w.attn_gate, h, n, act.gate)
    if w.sparse is None and ops.split and decode_rows_only(segments):  # one launch
        ops.attn_decode_qkv(
            act.qkv,
            tab,
            TAB,
            layer,
            n,
            dm.n_head,
            dm.n_kv,
            dm.hd,
            w.q_norm,
            w.k_norm,
            dm.eps,
            inv_freq,
            dm.n_rot,
            dm.neox,
            dm.pos_scale,
            dm.scale,
            act.att,
            dm.kv8,
            act.att_part if n <= GEMV_ROWS else None,
        )
    else:
        ops.qkv_post(
            act.qkv,
            n,
            dm.n_head,
            dm.n_kv,
            dm.hd,
            w.q_norm,
            w.k_norm,
            dm.eps,
            inv_freq,
            dm.n_rot,
            dm.neox,
            dm.pos_scale,
            tab,
            TAB,
            layer,
            act.q,
            dm.kv8,
        )
        if w.sparse is not None:  # each query attends to the keys the layer's own selection picks (QSA)
            w.sparse.attend(ops, dm, act, n, tab, inv_freq, segments)
        else:
            _attention(ops, layer, dm, act, n, tab, segments)
    if w.attn_gate is not None:
        ops.gate_mul(act.att, act.gate, n, dm.n_head * dm.hd)
    if before_write is not None:  # the lookahead's branch reads x until here
        before_write()
    if small:
        ops.matvec([w.o], act.att, n, x, accumulate=True)
    else:
        ops.matmul(w.o, act.att, n, x, accumulate=True)


def _attention(
    ops: Ops, i: int, dm: Dims, act: Activations, n: int, tab: Any, segments: list[Segment] | None
) -> None:
    if decode_rows_only(segments):
        ops.attn_decode(
            act.q,
            tab,
            TAB,
            i,
            n,
            dm.n_head,
            dm.n_kv,
            dm.hd,
            dm.scale,
            act.att,
            dm.kv8,
            act.att_part if n <= GEMV_ROWS else None,
        )
        return
    row_bytes = 4 * dm.n_head * dm.hd
    for s in segments:
        if s.n == 1:
            ops.attn_decode(
                ptr(act.q, s.start * row_bytes),
                ptr(tab, s.start * 8 * TAB),
                TAB,
                i,
                1,
                dm.n_head,
                dm.n_kv,
                dm.hd,
                dm.scale,
                ptr(act.att, s.start * row_bytes),
                dm.kv8,
                act.att_part,
            )
            continue
        k_layer, v_layer, head_stride, scales, cold = s.kv.flash_args(i, s.n)
        ops.flash(
            ptr(act.q, s.start * row_bytes),
            k_layer,
            v_layer,
            head_stride,
            s.n,
            s.n_past,
            dm.n_head,
            dm.n_kv,
            dm.hd,
            dm.scale,
            ptr(act.att, s.start * row_bytes),
            scales,
            cold,
        )

"""Qwen4-Exp (Qwen3.8-Flash-Next) on the GPU: what it adds to the Qwen3-Next decoder of layers.py.

The CPU model (strata.models.qwen4exp) is the description: per layer
    streams += ple(streams)                                       (PLE layers)
    h, inj = hc_mix(streams);  streams += inj * mixer(h)          (DeltaNet, or gated attention with QSA)
    h, inj = hc_mix(streams);  streams += inj * moe_shared(h)
    logits = head(hc_final(streams))
This file runs the same steps with the kernels of kernels/hyper.py and kernels/qsa.py around layers.py's
sublayers, which read the mixed input from act.h because these layers have no norms of their own (their
LayerWeights carry attn_norm = ffn_norm = None) and accumulate into act.x, which hc_read clears first.

Per-sequence state beside the KV and DeltaNet state (`ExtraState`, one device buffer addressed by the row
table, so decode graphs follow it like the rest): each QSA layer's compressed block keys and ring of raw
index keys (kernels/qsa.py's record), and each PLE layer's conv window. The PLE's n-gram rows are hashed and
gathered on the host (the table stays in RAM, the page cache or on disk, --ple-io) before each pass and
uploaded into a fixed buffer, so the graph reads them like its other inputs; the token history the hash
needs is host state (`PLEHistory`).

Legend: S = streams (hc_count), D = hidden, R = the mixers' low rank (padded to 32 for the products),
P = the PLE embedding width, Hi / d = indexer heads / head dim.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.blocks.ple import PLEParams, embeddings, ple_rows
from strata.errors import ConfigError
from strata.gguf.names import X, tensor
from strata.gpu.kernels import qsa as qk
from strata.gpu.kernels.common import GPU_QTYPES
from strata.gpu.kv import COLD_COL
from strata.gpu.lookahead import fork_for
from strata.gpu.ops import GEMV_ROWS, Ops
from strata.gpu.qwen4exp_state import ExtraState, PLEHistory
from strata.gpu.runtime import cupy_module, ptr
from strata.gpu.segments import Segment, runs
from strata.gpu.weights import DevMatrix, GpuWeights
from strata.tiers.budget import Ledger

EXTRA = ("gpu_qwen4exp", 0)  # SequenceState.layers key of the ExtraState
HISTORY = ("ple_history", 0)  # and of the PLEHistory
# the row table column of the ExtraState's address, which the QSA kernels read and the PLE conv is given
STATE_COL = qk.QSA_COL
_PAD = 32  # the product kernels read rows in multiples of 32 values
SELECT_ROWS = 32  # queries whose block scores qsa_select keeps at once (its scratch: this many rows)


@dataclass(frozen=True, slots=True)
class QSADims:
    hi: int
    d: int
    ratio: int
    top_blocks: int
    max_blocks: int
    n_layer: int

    @property
    def stride(self) -> int:  # floats of one layer's record
        return qk.qsa_stride(self.max_blocks, self.ratio, self.d)


@dataclass(frozen=True, slots=True)
class PLEDims:
    width: int  # P
    conv: int  # conv kernel W
    ngram: int  # the conv's dilation
    n_layer: int
    window: int  # floats of one layer's conv window: (W - 1) * ngram rows of S * D
    heads: int  # table rows a token gathers, side by side in its P
    row_bytes: int  # a table row's bytes
    # the table's type where the device decodes the gathered rows (the host uploads them as stored, a quarter
    # of the floats' bytes at 8 bits, and a decode graph decodes them in its first launches); None: the host
    qtype: int | None

    def raw_bytes(self) -> int:
        """A row's device bytes for the stored rows and their ids (0 where the host decodes them)."""
        return 0 if self.qtype is None else self.heads * (self.row_bytes + 8)


@dataclass(frozen=True, slots=True)
class HCDims:
    streams: int
    rank: int  # padded to _PAD
    d: int
    qsa: QSADims | None
    ple: PLEDims | None

    @property
    def cols(self) -> int:
        return self.streams * self.d

    def extra_floats(self) -> int:
        """Floats of one sequence's ExtraState: the QSA records, then the PLE windows."""
        q = self.qsa.n_layer * self.qsa.stride if self.qsa else 0
        return q + (self.ple.n_layer * self.ple.window if self.ple else 0)

    def bytes_per_row(self) -> int:
        f = 3 * self.cols + self.rank + 2 * self.streams
        if self.qsa is not None:
            q = self.qsa
            f += q.hi * q.d + q.d + q.top_blocks + 1
        if self.ple is not None:
            f += self.cols + self.ple.width
        return 4 * f + (self.ple.raw_bytes() if self.ple is not None else 0)

    def fixed_bytes(self) -> int:
        """Bytes of a pass's buffers that do not grow with its rows: SELECT_ROWS queries' block scores."""
        return 4 * SELECT_ROWS * self.qsa.max_blocks if self.qsa is not None else 0


class HCBuffers:
    """The activations the streams add to layers.Activations, for up to n rows (allocated once)."""

    def __init__(self, hd: HCDims, n: int) -> None:
        cp = cupy_module()
        f32 = cp.float32
        self.streams = cp.empty((n, hd.cols), f32)
        self.normed = cp.empty((n, hd.cols), f32)
        self.mix = cp.empty((n, hd.cols), f32)
        self.low = cp.empty((n, hd.rank), f32)
        self.inj = cp.empty((n, hd.streams), f32)
        self.den = cp.empty((n, hd.streams), f32)  # the fused decode mixer's per-stream RMS
        if hd.qsa is not None:
            q = hd.qsa
            self.iq = cp.empty((n, q.hi * q.d), f32)
            self.ik = cp.empty((n, q.d), f32)
            self.sel = cp.empty((n, q.top_blocks), cp.int32)
            self.nsel = cp.empty(n, cp.int32)
            self.scratch = cp.empty(Ops.qsa_scratch(min(n, SELECT_ROWS), q.max_blocks), f32)
        if hd.ple is not None:
            self.aux = cp.empty((n, hd.cols), f32)
            self.e = cp.empty((n, hd.ple.width), f32)
            self.e_rows: DevMatrix | None = None
            if hd.ple.qtype is not None:  # the gathered rows as stored, a matrix get_rows decodes into e
                pd, rows = hd.ple, n * hd.ple.heads
                raw = cp.empty(rows * pd.row_bytes, cp.uint8)
                cols = pd.width // pd.heads
                self.e_rows = DevMatrix("PLE rows", pd.qtype, rows, cols, 1, pd.row_bytes, raw)
                self.e_ids = cp.arange(rows, dtype=cp.int64)


def product(ops: Any, m: DevMatrix, x: Any, n: int, y: Any) -> None:
    """y[:n] = x[:n] @ m.T: gemv for decode rows and for matrices too short for a GEMM tile."""
    if n <= GEMV_ROWS or m.rows < 64:
        ops.matvec([m], x, n, y)
    else:
        ops.matmul(m, x, n, y)


@dataclass(slots=True)
class Mixer:
    """One hyper-connection mixer's weights; inject None for the final one."""

    norm: Any  # [S * D]
    down: DevMatrix  # [R, S * D]
    up: DevMatrix  # [S * D, R]
    inject: DevMatrix | None  # [S, S * D]

    def types(self) -> tuple[int, int, int]:
        """(down, inject, up) weight types: the fused kernels' instance (inject: down's if there is none)."""
        inject = self.inject.qtype if self.inject is not None else self.down.qtype
        return self.down.qtype, inject, self.up.qtype

    def read(self, ops: Any, hd: HCDims, act: Any, n: int, eps: float) -> None:
        """act.h = the mixed input of the sublayer; with an inject, hc.inj = its weights and act.x cleared.
        Decode rows take the two fused launches; longer passes the products' GEMMs between the row kernels."""
        hc, s, d = act.hc, hd.streams, hd.d
        zero = act.x if self.inject is not None else None
        if n <= GEMV_ROWS:
            ops.hc_mix_in(hc.streams, self.norm, eps, n, s, d, self.down, self.inject, hc.low, hc.inj, hc.den)
            ops.hc_mix_out(hc.streams, self.norm, hc.den, n, s, d, self.up, hc.low, act.h, zero)
            return
        ops.hc_norm(hc.streams, self.norm, eps, n, s, d, hc.normed)
        product(ops, self.down, hc.normed, n, hc.low)
        ops.silu_scale(hc.low, n, hd.rank, 1.0 / s)
        product(ops, self.up, hc.low, n, hc.mix)
        if self.inject is None:
            ops.hc_read(hc.mix, hc.normed, n, s, d, act.h)
            return
        product(ops, self.inject, hc.normed, n, hc.inj)
        ops.hc_read(hc.mix, hc.normed, n, s, d, act.h, hc.inj, act.x)


@dataclass(slots=True)
class QSALayer:
    """A QSA layer's indexer: layers.py calls attend() in place of dense attention (LayerWeights.sparse)."""

    j: int  # index among the QSA layers (its record in the ExtraState)
    kv_layer: int
    q: DevMatrix  # [Hi * d, D]
    k: DevMatrix  # [d, D]
    q_norm: Any
    k_norm: Any
    qd: QSADims
    rope: tuple[int, bool, float]  # n_rot, neox, pos_scale
    eps: float

    def attend(
        self, ops: Any, dm: Any, act: Any, n: int, tab: Any, inv_freq: Any, segments: list[Segment] | None
    ) -> None:
        hc, q, (n_rot, neox, pos_scale) = act.hc, self.qd, self.rope
        tab_stride = tab.shape[1]
        product(ops, self.q, act.h, n, hc.iq)
        product(ops, self.k, act.h, n, hc.ik)
        ops.qsa_keys(
            hc.ik, n, tab, tab_stride, self.j, q.stride, q.ratio, q.d, self.k_norm, self.eps, inv_freq,
            n_rot, neox, pos_scale,
        )  # fmt: skip
        ops.qsa_query(
            hc.iq, n, q.hi, q.d, self.q_norm, self.eps, inv_freq, n_rot, neox, pos_scale, tab, tab_stride
        )
        seen = None if segments is None else max(s.n_past + s.n for s in segments) // q.ratio
        ops.qsa_select(
            hc.iq, n, tab, tab_stride, self.j, q.stride, q.hi, q.d, q.ratio, q.top_blocks, hc.sel, hc.nsel,
            hc.scratch, seen,
        )  # fmt: skip
        self._stage_cold(tab, segments)
        ops.qsa_attend(
            act.q, tab, tab_stride, self.kv_layer, n, dm.n_head, dm.n_kv, dm.hd, dm.scale, hc.sel, hc.nsel,
            q.top_blocks, q.ratio, act.att, dm.kv8, act.att_part if n <= GEMV_ROWS else None,
        )  # fmt: skip

    def _stage_cold(self, tab: Any, segments: list[Segment] | None) -> None:
        """The longest sequence of a long pass reads its cells before the --kv-resident window from a copy in
        VRAM (GpuKV.staged_cold_cols): each of its queries reads a budget of keys anywhere in the context,
        which in place would cross PCIe once per query and head. One sequence a layer: the StageRoom holds
        one layer's cells, and the attend that reads them is one launch for every row."""
        longest = max(segments or [], key=lambda s: s.n, default=None)
        cols = None if longest is None else longest.kv.staged_cold_cols(self.kv_layer, longest.n)
        if cols is not None:
            rows = slice(longest.start, longest.start + longest.n)
            tab[rows, COLD_COL : COLD_COL + 6] = cupy_module().asarray(cols, np.int64)


@dataclass(slots=True)
class PLELayer:
    """A PLE layer: streams += gated + silu(conv(norm(gated))), gated from the gathered rows in hc.e."""

    j: int  # index among the PLE layers (its window in the ExtraState)
    key: DevMatrix  # [S * D, P]
    value: DevMatrix  # [D, P]
    norm_key: Any
    norm_query: Any
    norm_conv: Any
    conv: Any  # [S * D, W] flattened
    pd: PLEDims
    eps: float
    base: int  # floats into the ExtraState where the PLE windows start (after the QSA records)

    def run(
        self, ops: Any, hd: HCDims, act: Any, n: int, tab: Any, runs: list[tuple[int, int]] | None
    ) -> None:
        hc, s, d, c = act.hc, hd.streams, hd.d, hd.cols
        product(ops, self.key, hc.e, n, hc.mix)
        ops.hc_norm(hc.mix, self.norm_key, self.eps, n, s, d, hc.aux)
        product(ops, self.value, hc.e, n, act.h)
        ops.hc_norm(hc.streams, self.norm_query, self.eps, n, s, d, hc.normed)
        ops.ple_gate(hc.aux, hc.normed, act.h, n, s, d, hc.mix)  # gated, into mix
        ops.hc_norm(hc.mix, self.norm_conv, self.eps, n, s, d, hc.normed)  # the conv's input
        tab_stride = tab.shape[1]
        # decode: every row its own run of 1; prefill: one launch per sequence, its rows in order
        for start, t, count in [(0, 1, n)] if runs is None else [(a, b, 1) for a, b in runs]:
            ops.ple_conv(
                self.pd.conv, self.pd.ngram, ptr(hc.normed, 4 * c * start), c, t, count,
                ptr(tab, 8 * tab_stride * start), tab_stride, STATE_COL, self.conv,
                ptr(hc.mix, 4 * c * start), ptr(hc.streams, 4 * c * start), state_off=self.state_off,
            )  # fmt: skip

    @property
    def state_off(self) -> int:
        return self.base + self.j * self.pd.window


def hc_dims(cpu: Any, n_ctx: int) -> HCDims:
    """The streams' shapes of a Qwen4-Exp model (strata.models.qwen4exp.Qwen4Exp) serving n_ctx positions."""
    s, d = cpu.n_streams, cpu.params.d_model
    rank = -(-cpu.gguf.tensors[cpu.hc_attn[0].down].shape[-2] // _PAD) * _PAD
    qsa = None
    if cpu.qsa:
        q0 = next(iter(cpu.qsa.values()))
        ratios = {q.ratio for q in cpu.qsa.values()}
        if len(ratios) > 1:
            raise ConfigError("device", "cuda", f"QSA layers with different compress ratios {sorted(ratios)}")
        qsa = QSADims(
            q0.n_heads, q0.head_dim, q0.ratio, q0.top_blocks, -(-max(n_ctx, 1) // q0.ratio), len(cpu.qsa)
        )
    ple = None
    if cpu.ple is not None:
        pp: PLEParams = cpu.ple
        width = cpu.gguf.tensors[tensor(X.PLE_KEY, cpu.ple_layers[0])].shape[-1]
        info = cpu.ple_table.info
        cols = info.shape[-1]
        on_device = info.qtype in GPU_QTYPES and cols % 8 == 0  # get_rows decodes chunks of 8
        ple = PLEDims(
            width,
            pp.conv_kernel,
            pp.ngram,
            len(cpu.ple_layers),
            pp.conv_window * s * d,
            width // cols,
            info.row_bytes,
            int(info.qtype) if on_device else None,
        )
    return HCDims(s, rank, d, qsa, ple)


class Qwen4ExpParts:
    """What the GPU model holds for Qwen4-Exp beyond the Qwen3-Next layers: the mixers, QSA and PLE layers,
    and the host side of the PLE gathers."""

    def __init__(self, cpu: Any, w: GpuWeights, dims: HCDims) -> None:
        p = cpu.params
        self.cpu, self.dims = cpu, dims
        # time the host spent on the PLE rows (prepare), for benchmarks: hashing the n-grams, gathering the
        # rows (and decoding them, for a table type the device does not decode), uploading them
        self.host_parts = {"hash": 0.0, "gather": 0.0, "upload": 0.0}
        qsa, ple, rank = dims.qsa, dims.ple, dims.rank
        self.attn = [self._mixer(w, names, rank) for names in cpu.hc_attn]
        self.ffn = [self._mixer(w, names, rank) for names in cpu.hc_ffn]
        self.head = self._mixer(w, cpu.hc_head, rank)
        rope = (p.rope.n_rot, True, p.rope.scale)  # text positions: mrope is NEOX partial rope
        self.qsa: dict[int, QSALayer] = {}
        for j, (i, q) in enumerate(sorted(cpu.qsa.items())):
            assert qsa is not None
            self.qsa[i] = QSALayer(
                j,
                cpu.linear[:i].count(False),
                w.matrix(tensor(X.INDEXER_Q_PROJ, i)),
                w.matrix(tensor(X.INDEXER_K_PROJ, i)),
                w.vector(tensor(X.INDEXER_Q_NORM, i)),
                w.vector(tensor(X.INDEXER_K_NORM, i)),
                qsa,
                rope,
                q.eps,
            )
        self.ple: dict[int, PLELayer] = {}
        base = qsa.n_layer * qsa.stride if qsa else 0
        for j, i in enumerate(cpu.ple_layers):
            assert ple is not None
            self.ple[i] = PLELayer(
                j,
                w.matrix(tensor(X.PLE_KEY, i)),
                w.matrix(tensor(X.PLE_VALUE, i)),
                w.vector(tensor(X.PLE_NORM_KEY, i)),
                w.vector(tensor(X.PLE_NORM_QUERY, i)),
                w.vector(tensor(X.PLE_NORM_CONV, i)),
                w.vector(tensor(X.PLE_CONV1D, i)),
                ple,
                p.eps,
                base,
            )

    def mixer_types(self) -> set[tuple[int, int, int]]:
        """Every mixer's (down, inject, up) weight types: the fused decode mixers' instances to build."""
        return {m.types() for m in (*self.attn, *self.ffn, self.head)}

    @staticmethod
    def _mixer(w: GpuWeights, names: Any, rank: int) -> Mixer:
        padded = w.gguf.tensors[names.down].shape[-2] != rank  # a rank the products cannot read as it is
        return Mixer(
            w.vector(names.norm),
            w.float_matrix(names.down, rows=rank) if padded else w.matrix(names.down),
            w.float_matrix(names.up, cols=rank) if padded else w.matrix(names.up),
            None if names.inject is None else w.matrix(names.inject),
        )

    # ---- state ----
    def new_state(self, ledger: Ledger) -> dict[tuple[str, int], Any]:
        out: dict[tuple[str, int], Any] = {EXTRA: ExtraState(ledger, self.dims.extra_floats())}
        if self.cpu.ple is not None:
            out[HISTORY] = PLEHistory(np.full(self.cpu.ple.ngram - 1, self.cpu.ple.eos, np.int64))
        return out

    @staticmethod
    def table_col(state: Any) -> int:
        extra = state.layers.get(EXTRA)
        return extra.address() if isinstance(extra, ExtraState) else 0

    # ---- a pass ----
    def prepare(self, tokens: list[np.ndarray], states: list[Any], act: Any) -> None:
        """Before a pass: gather the PLE rows of every row's token (and advance the histories) into hc.e, or
        as stored into hc.e_rows for `embed` to decode."""
        if self.cpu.ple is None:
            return
        t0 = time.perf_counter()
        pp, table = self.cpu.ple, self.cpu.ple_table
        rows = []
        for t, s in zip(tokens, states):
            hist: PLEHistory = s.layers[HISTORY]
            rows.append(ple_rows(t, pp, hist.ids))
            hist.ids = np.concatenate([hist.ids, np.asarray(t, np.int64)])[-(pp.ngram - 1) :]
        flat = np.concatenate(rows)
        t1 = time.perf_counter()
        raw, stored = table.gather(flat, len(flat)), act.hc.e_rows
        if stored is None:  # the host decodes them
            e = np.ascontiguousarray(embeddings(table, raw, len(flat)), np.float32)
            t2 = time.perf_counter()
            act.hc.e[: len(flat)].set(e)
        else:  # `embed` decodes them on the device
            t2 = time.perf_counter()
            stored.data[: raw.size].set(raw.reshape(-1))
        t3 = time.perf_counter()
        for part, dt in zip(("hash", "gather", "upload"), (t1 - t0, t2 - t1, t3 - t2)):
            self.host_parts[part] += dt

    @property
    def host_s(self) -> float:
        """All the host's PLE time so far (the parts' sum)."""
        return sum(self.host_parts.values())

    def embed(self, ops: Any, act: Any, n: int) -> None:
        """streams = the embedding (in act.x) in every stream; the PLE rows `prepare` uploaded as stored,
        decoded into hc.e."""
        hc, s, d = act.hc, self.dims.streams, self.dims.d
        hc.streams[:n].reshape(n, s, d)[...] = act.x[:n, None, :]
        if self.dims.ple is not None and hc.e_rows is not None:
            ops.embed(hc.e_rows, hc.e_ids, n * self.dims.ple.heads, hc.e)

    def run_layer(
        self,
        ops: Any,
        i: int,
        layer: Any,
        dm: Any,
        act: Any,
        n: int,
        tab: Any,
        segments: Any,
        inv_freq: Any,
        run_mixer: Any,
        run_ffn: Any,
    ) -> None:
        hd, hc = self.dims, act.hc
        if i in self.ple:
            self.ple[i].run(ops, hd, act, n, tab, runs(segments))
        self.attn[i].read(ops, hd, act, n, dm.eps)
        # the mixer's input predicts the layer's experts, copied while the mixer runs
        ahead = fork_for(ops, layer.tier, layer.router, None, dm.eps, act.h, n, dm.norm_topk, n <= GEMV_ROWS)
        if ahead is not None:
            ahead.read_done()  # the branch's router has read act.h before the mixer may use it as scratch
        run_mixer(ops, layer, dm, act, n, tab, segments, inv_freq)
        ops.hc_inject(hc.streams, act.x, hc.inj, n, hd.streams, hd.d)
        self.ffn[i].read(ops, hd, act, n, dm.eps)
        run_ffn(ops, layer, dm, act, n)
        ops.hc_inject(hc.streams, act.x, hc.inj, n, hd.streams, hd.d)

    def final(self, ops: Any, act: Any, n: int, eps: float) -> None:
        """act.h[:n] = what the LM head reads (the final mixer over the streams)."""
        self.head.read(ops, self.dims, act, n, eps)

    def keep_rows(self, act: Any, idx: Any) -> None:
        """Rows idx of the streams to the first len(idx) rows (each sequence's last row, for the head)."""
        act.hc.streams[: len(idx)] = act.hc.streams[idx]

    def sparse(self, i: int) -> QSALayer | None:
        return self.qsa.get(i)

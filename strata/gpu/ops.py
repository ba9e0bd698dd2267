"""Launchers: one method per kernel, taking device arrays and plain ints, choosing grid and block.

`Ops` compiles the kernel sources for the template instances a model needs (its weight types and
head size) and launches on the current cupy stream. Nothing here allocates device memory, which
is what lets the decode step be captured as a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from strata.gpu.kernels import (
    attention,
    cells,
    deltanet,
    flash,
    gemm,
    gemv,
    hyper,
    mmvq,
    moe,
    qsa,
    rows,
    sample,
    tiers,
)
from strata.gpu.kernels.common import GPU_QTYPES
from strata.gpu.ops_mixers import MixerOps
from strata.gpu.ops_moe import MoeOps
from strata.gpu.ops_qwen4exp import Qwen4ExpOps
from strata.gpu.runtime import NULL, Kernels, cupy_module, dev_ptr, f32, i32, i64, launch, ptr
from strata.gpu.weights import DevMatrix

GEMV_NT = (1, 4, 8)
GEMV_ROWS = GEMV_NT[-1]  # up to this many rows, projections read weights once through gemv
# Up to this many rows, routed experts run per (row, expert) pair through the decode kernels, each pair
# reading its expert's weights, not grouped into GEMM tiles. A choice by rows alone, so that every cache size
# computes what all-resident does, bit for bit. 80B shape on an H100 (perf/bench_gpu.py, 2026-12-06), tok/s
# per pair against grouped: all-resident pp9 458 / 270, pp32 1,073 / 550, pp64 1,438 / 799 (the tiles of a
# few rows an expert waste the tensor cores); at 24 GiB, misses read in place, 86-99 / 48-80 from pp9 to
# pp64. Whether such a pass stages its misses first is the tiers' choice (tiers/borrow.py staging_rows),
# which moves bytes only. `Ops.moe_gemv_rows` holds it (bench_gpu.py times each prompt's other paths);
# MOE_GEMV_MAX bounds it, for the activations' int8 buffers.
MOE_GEMV_ROWS = 64
MOE_GEMV_MAX = 64
MAX_GEMV_GRID = 2048  # row blocks; past this, warps loop over rows (and stage x fewer times)
# mmvq blocks each quantize their inputs first, so past this many blocks warps loop over rows instead: decode
# tok/s on the H200 (30b-a3b Q4_K, perf/bench_gpu.py --sweep) b=1 345.9 / 340.0 / 339.4 at 512 / 1024 / 2048
# blocks, b=4 777.4 / 732.7 / 729.9. Module-level so --sweep can retune it.
MMVQ_GRID = 512


def gemv_nt(n: int) -> int:
    return next(nt for nt in GEMV_NT if n <= nt) if n <= GEMV_NT[-1] else GEMV_NT[-1]


# flash_attn's shared memory (flash.flash_smem): at head dim 256 (Qwen3-Next) 165-204 KiB, one block an SM
HEAD_DIMS = (16, 32, 64, 128, 256)


class Ops(MixerOps, MoeOps, Qwen4ExpOps):
    """Compiles every source for every GPU weight type and head size, whatever the model: one NVRTC
    build per machine and generation (cupy caches it on disk), shared by every model and test in a process.
    cupy builds a source at its first launch, with every instance named here: a source nothing launches
    (mmvq.py without q8) is never built, but a launched one builds all its names.

    `split=True` (the default) launches the split-K decode kernels and the fused decode launches
    (router + top-k, q/k/v epilogue + attention); False, the first versions (staged inputs, one warp
    per row, separate launches), kept to compare and as perf/run_gpu.sh's fallback. GEMMs take 64-wide
    K steps either way (`gemm_bk`). `q8=True` (the default, with split) runs decode products on int8
    inputs (mmvq.py) for the types it reads; False keeps them on fp32 inputs. Only the chosen
    generation's decode products are named (the fused launches are, in both: tests hold them to the
    unfused ones).
    """

    def __init__(
        self,
        moe_types: Iterable[tuple[int, int, int]] = (),
        split: bool = True,
        q8: bool = True,
        mixer_types: Iterable[tuple[int, int, int]] = (),
    ) -> None:
        self.split = split
        self.q8 = q8 and split
        self.moe_gemv_rows = MOE_GEMV_ROWS
        # GEMM K step (the 128-wide instance stays compiled and tested): 64 measured faster on the H200,
        # pp512 7,462 vs 6,654 tok/s, qgemm 39.5 vs 48.8 ms per pp512 pass (perf/README.md)
        self.gemm_bk = 64
        qts = sorted(int(q) for q in GPU_QTYPES)
        # silu_mul products (pro 2) take the first kernel in both generations; pro 0 and 1, the generation's
        products = gemv.gemv_split_name if split else gemv.gemv_name
        self.gemv = Kernels(
            gemv.SOURCE,
            [gemv.gemv_name(q, nt, 2) for q in qts for nt in GEMV_NT]
            + [products(q, nt, p) for q in qts for nt in GEMV_NT for p in (0, 1)]
            + [gemv.router_topk_name(q, nt) for q in qts for nt in GEMV_NT]
            + [gemv.get_rows_name(q) for q in qts],
        )
        # silu(gate)*up staging at BK = 128 spills registers, so down projections keep 64-wide steps
        self.gemm = Kernels(
            gemm.SOURCE, [gemm.gemm_name(q, a, bk) for q in qts for a, bk in ((0, 64), (0, 128), (1, 64))]
        )
        kv_kinds = (False, True)  # fp16 and int8 cells (--kv-type)
        self.attn = Kernels(
            attention.SOURCE,
            [
                f(h, q8, g)
                for f in (attention.decode_name, attention.decode_qkv_name)
                for h in HEAD_DIMS
                for q8 in kv_kinds
                for g in attention.GROUP_SIZES
            ]
            + [cells.merge_name(h) for h in HEAD_DIMS],
        )
        self.flash_attn = Kernels(  # not `flash`: that is the launcher (ops_mixers.py)
            flash.SOURCE,
            [flash.flash_name(h, q8, w) for h in HEAD_DIMS for q8 in kv_kinds for w in flash.FLASH_WARPS],
        )
        self.rows = Kernels(
            rows.SOURCE,
            ["rmsnorm", "gate_mul", "gated_add"]
            + [rows.qkv_post_name(h, q8) for h in HEAD_DIMS for q8 in kv_kinds],
        )
        self.dn = Kernels(deltanet.SOURCE, deltanet.kernel_names())
        pairs = sorted(
            {(q, q) for q in qts} | {(g, u) for g, u, _ in moe_types}
        )  # gate and up differ only in odd files
        gate_up, down = (
            (moe.gate_up_split_name, moe.down_split_name) if split else (moe.gate_up_name, moe.down_name)
        )
        self.moe = Kernels(
            moe.SOURCE,
            ["moe_topk", "moe_count", "moe_plan", "moe_scatter", "moe_combine"]
            + [gate_up(g, u) for g, u in pairs]
            + [down(q) for q in qts],
        )
        self.sample = Kernels(sample.SOURCE, ["argmax_rows", "sample_chunks", "sample_rows", "advance"])
        self.tiers = Kernels(tiers.SOURCE, tiers.NAMES)
        # the fused decode mixers for the model's (down, inject, up) weight types (kernels/hyper.py)
        self.hyper = Kernels(hyper.SOURCE, hyper.NAMES + hyper.mix_names(mixer_types))
        # QSA sparse attention (qwen4exp): the indexer's head dim and attention's, both from HEAD_DIMS
        self.qsa = Kernels(qsa.SOURCE, qsa.kernel_names(HEAD_DIMS))
        q8t = sorted(mmvq.MMVQ_TYPES)
        q8pairs = sorted({(q, q) for q in q8t} | {(g, u) for g, u, _ in moe_types if g in q8t and u in q8t})
        self.mmvq = Kernels(
            mmvq.SOURCE,
            ["q8_rows"]
            + [mmvq.mmvq_name(q, nt, p) for q in q8t for nt in GEMV_NT for p in (0, 1, 2)]
            + [mmvq.gate_up_q8_name(g, u) for g, u in q8pairs]
            + [mmvq.down_q8_name(q) for q in q8t],
        )

    def takes_q8(self, *ws: DevMatrix) -> bool:
        """Whether decode products on these matrices run on int8 inputs."""
        return self.q8 and all(w.qtype in mmvq.MMVQ_TYPES and w.cols <= mmvq.MAX_K for w in ws)

    # ---- matrices ----
    def matvec(
        self,
        ws: Sequence[DevMatrix],
        x: Any,
        n: int,
        y: Any,
        *,
        ldx: int = 0,
        ldy: int = 0,
        accumulate: bool = False,
        norm: Any = None,
        eps: float = 0.0,
        h_out: Any = None,
        silu_mul: bool = False,
    ) -> None:
        """y[:n] (+)= f(x[:n]) @ concat(ws).T for up to ~8 tokens per pass (gemv)."""
        w0 = ws[0]
        assert all(w.qtype == w0.qtype and w.cols == w0.cols for w in ws) and len(ws) <= 3
        k = w0.cols
        total = sum(w.rows for w in ws)
        r1 = ws[0].rows
        r2 = r1 + (ws[1].rows if len(ws) > 1 else 0)
        data = [w.data for w in ws] + [w0.data] * (3 - len(ws))
        pro = 2 if silu_mul else (1 if norm is not None else 0)
        nt = gemv_nt(n)
        if h_out is None and self.takes_q8(w0):
            s = gemv.split_for(total, k)
            launch(
                self.mmvq[mmvq.mmvq_name(w0.qtype, nt, pro)],
                (min(-(-total * s // gemv.WARPS), MMVQ_GRID), -(-n // nt)),
                32 * gemv.WARPS,
                (
                    data[0],
                    data[1],
                    data[2],
                    i32(r1),
                    i32(r2),
                    i64(w0.row_bytes),
                    i32(total),
                    i32(k),
                    dev_ptr(x),
                    i32(ldx or (2 * k if silu_mul else k)),
                    i32(n),
                    NULL if norm is None else norm,
                    f32(eps),
                    dev_ptr(y),
                    i32(ldy or total),
                    i32(int(accumulate)),
                    i32(s),
                ),
                smem=mmvq.smem_bytes(nt, k),
            )
            return
        head = (
            data[0],
            data[1],
            data[2],
            i32(r1),
            i32(r2),
            i64(w0.row_bytes),
            i32(total),
            i32(k),
            dev_ptr(x),
            i32(ldx or (2 * k if silu_mul else k)),
            i32(n),
            NULL if norm is None else norm,
            f32(eps),
            NULL if h_out is None else h_out,
            i32(k),
            dev_ptr(y),
            i32(ldy or total),
            i32(int(accumulate)),
        )
        if self.split and not silu_mul:
            s = gemv.split_for(total, k)
            blocks = min(
                -(-total * s // gemv.WARPS), MAX_GEMV_GRID if norm is not None else 4 * MAX_GEMV_GRID
            )
            launch(
                self.gemv[gemv.gemv_split_name(w0.qtype, nt, pro)],
                (blocks, -(-n // nt)),
                32 * gemv.WARPS,
                head + (i32(s),),
            )
            return
        fn = self.gemv[gemv.gemv_name(w0.qtype, nt, pro)]
        grid = (min(-(-total // gemv.WARPS), MAX_GEMV_GRID), -(-n // nt))
        launch(fn, grid, 32 * gemv.WARPS, head, smem=nt * k * 4)

    def router_topk(
        self,
        w: DevMatrix,
        x: Any,
        n: int,
        logits: Any,
        norm: Any,
        eps: float,
        h_out: Any,
        a: int,
        norm_topk: bool,
        ids: Any,
        wts: Any,
        counter: Any,
        hq: Any = None,
        hds: Any = None,
    ) -> None:
        """matvec([w], x, n, logits, norm=norm, h_out=h_out) then topk(logits, ...) in one launch, for up to
        GEMV_NT[-1] * a few rows (the last block routes every row). counter: int32 [1], zero. hq, hds: also
        h_out as int8 codes and scales, for `moe_gate_up_q8`."""
        k, e = w.cols, w.rows
        s = gemv.split_for(e, k)
        blocks = min(-(-e * s // gemv.WARPS), MAX_GEMV_GRID)
        nt = gemv_nt(n)
        launch(
            self.gemv[gemv.router_topk_name(w.qtype, nt)],
            (blocks, -(-n // nt)),
            32 * gemv.WARPS,
            (
                w.data,
                w.data,
                w.data,
                i32(e),
                i32(e),
                i64(w.row_bytes),
                i32(e),
                i32(k),
                dev_ptr(x),
                i32(k),
                i32(n),
                norm,
                f32(eps),
                NULL if h_out is None else h_out,
                i32(k),
                dev_ptr(logits),
                i32(e),
                i32(0),
                i32(s),
                counter,
                i32(a),
                i32(int(norm_topk)),
                ids,
                wts,
                NULL if hq is None else hq,
                NULL if hds is None else hds,
            ),
            smem=gemv.WARPS * e * 4,
        )

    def embed(self, w: DevMatrix, ids: Any, n: int, out: Any, id_stride: int = 1) -> None:
        """out[:n] = rows ids (int64, every id_stride-th element) of w, as float32."""
        launch(
            self.gemv[gemv.get_rows_name(w.qtype)],
            (n,),
            128,
            (w.data, i64(w.row_bytes), dev_ptr(ids), i32(id_stride), i32(w.cols), out),
        )

    def matmul(
        self,
        ws: DevMatrix | Sequence[DevMatrix],
        a: Any,
        m: int,
        c: Any,
        *,
        lda: int = 0,
        ldc: int = 0,
        accumulate: bool = False,
        silu_mul: bool = False,
        a_index: Any = None,
        tiles: Any = None,
        n_tiles: Any = None,
        grid_rows: int = 0,
    ) -> None:
        """c[:m] (+)= a[:m] @ concat(ws).T on tensor cores (qgemm); grouped by expert when `tiles` is
        given (then ws is one 3-D expert tensor)."""
        ws = [ws] if isinstance(ws, DevMatrix) else list(ws)
        w = ws[0]
        assert all(v.qtype == w.qtype and v.cols == w.cols for v in ws) and len(ws) <= 3
        k, total = w.cols, sum(v.rows for v in ws)
        r1 = ws[0].rows
        r2 = r1 + (ws[1].rows if len(ws) > 1 else 0)
        if tiles is not None:  # grouped: one expert tensor, read through its address table
            assert len(ws) == 1 and w.table is not None
            data, experts = [NULL] * 3, w.table
        else:
            data, experts = [v.data for v in ws] + [w.data] * (3 - len(ws)), NULL
        bk = self.gemm_bk if not silu_mul else 64
        gy = grid_rows if tiles is not None else -(-m // gemm.BM)
        args = (
            data[0],
            data[1],
            data[2],
            i32(r1),
            i32(r2),
            experts,
            i64(w.row_bytes),
            i32(total),
            i32(k),
            dev_ptr(a),
            i32(lda or (2 * k if silu_mul else k)),
            NULL if a_index is None else a_index,
            dev_ptr(c),
            i32(ldc or total),
            i32(int(accumulate)),
            NULL if tiles is None else tiles,
            NULL if n_tiles is None else n_tiles,
            i32(m),
        )
        launch(
            self.gemm[gemm.gemm_name(w.qtype, int(silu_mul), bk)],
            (-(-total // gemm.BN), gy),
            256,
            args,
            smem=gemm.smem_bytes(bk),
        )

    @staticmethod
    def router_logits(h: Any, n: int, router: DevMatrix, out: Any) -> None:
        """out[:n] = h[:n] @ router.T in fp32 for an F32 router (prefill rows): cuBLAS SGEMM into the given
        buffer, no allocation. Routing follows these logits, so they stay fp32 (no tensor-core rounding);
        a gemv would read the router once per 8 rows (5 ms of a 30b-a3b pp512 pass; this: 0.4 ms)."""
        cp = cupy_module()
        w = router.data.view(cp.float32).reshape(router.rows, router.cols)
        cp.matmul(h[:n], w.T, out=out[:n])

    # ---- rows ----
    def rmsnorm(self, x: Any, w: Any, eps: float, n: int, d: int, out: Any) -> None:
        launch(self.rows["rmsnorm"], (n,), 256, (x, i32(d), w, f32(eps), i32(d), out, i32(d)))

    def gate_mul(self, x: Any, g: Any, n: int, cols: int) -> None:
        """x[:n, :cols] *= sigmoid(g[:n, :cols]) (both contiguous rows of `cols`)."""
        launch(self.rows["gate_mul"], (n,), 256, (x, i32(cols), g, i32(cols), i32(cols)))

    def gated_add(self, x: Any, y: Any, s: Any, n: int, d: int) -> None:
        """x[:n] += sigmoid(s[:n]) * y[:n] (rows of d; s one value per row)."""
        launch(self.rows["gated_add"], (n,), 256, (x, i32(d), y, i32(d), s, i32(d)))

    def qkv_post(
        self,
        qkv: Any,
        n: int,
        h: int,
        kv: int,
        hd: int,
        q_norm: Any,
        k_norm: Any,
        eps: float,
        inv_freq: Any,
        n_rot: int,
        neox: bool,
        pos_scale: float,
        tab: Any,
        tab_stride: int,
        layer: int,
        q_out: Any,
        q8: bool = False,
    ) -> None:
        launch(
            self.rows[rows.qkv_post_name(hd, q8)],
            (n, h + 2 * kv),
            32,
            (
                qkv,
                i32(h),
                i32(kv),
                NULL if q_norm is None else q_norm,
                NULL if k_norm is None else k_norm,
                f32(eps),
                inv_freq,
                i32(n_rot),
                i32(int(neox)),
                f32(pos_scale),
                tab,
                i32(tab_stride),
                i32(layer),
                q_out,
            ),
        )

    # ---- sampling ----
    def argmax(self, logits: Any, n: int, v: int, out: Any, out_stride: int = 1) -> None:
        launch(self.sample["argmax_rows"], (n,), 1024, (logits, i32(v), dev_ptr(out), i32(out_stride)))

    def sample_rows(
        self, logits: Any, n: int, v: int, draws: Any, tab: Any, tab_stride: int, chosen: Any, cands: Any
    ) -> None:
        """One token per row by its draw row (sampler.draw_row), into tab's token column and chosen; cands:
        the first stage's int32 [2, rows, SAMPLE_CHUNKS * DEVICE_TOP_K] (kernels/sample.py: keys, ids)."""
        keys, ids, lv = cands[0], cands[1], i32(v)
        launch(self.sample["sample_chunks"], (sample.SAMPLE_CHUNKS, n), 1024, (logits, lv, draws, keys, ids))
        out = (tab, i32(tab_stride), chosen)
        launch(self.sample["sample_rows"], (n,), 1024, (logits, lv, draws, keys, ids, *out))

    def advance(self, tab: Any, stride: int, n: int) -> None:
        """tab[:n, POSITION] += 1: one thread per slot, so one block of up to 1024 slots."""
        assert 0 < n <= 1024, n
        launch(self.sample["advance"], (1,), 32 * -(-n // 32), (tab, i32(stride), i32(n)))


__all__ = ["Ops", "gemv_nt", "ptr"]

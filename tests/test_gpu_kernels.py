"""Every GPU kernel against its numpy twin (strata/gpu/kernels/*; attention's in tests/test_gpu_attention.py),
on fresh random inputs, in every kernel generation (tests/conftest.py's `kernel_generations`).

Tolerances: dequantization is bit-exact; fp32 products (gemv, decode attention, norms, routing) are
held to 1e-5 of the magnitude bound sum|w||x| (fp32 accumulation over <= 4096 terms); tensor-core
products are compared with the twin that rounds operands to fp16 the same way, to 1e-5 of that
bound, and the twin itself is held to the fp32 path in CI (tests/test_gpu_refs.py); int8-input
products (mmvq) are compared with the twin that quantizes the inputs the same way, to 1e-5 of the
bound, or 2e-4 where a fused norm or silu may move an input across a code boundary. Failures
report the worst element.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q
from quant_blocks import F16_FIELDS, MOE_TYPES, random_blocks

from strata.blocks.norms import rms_norm
from strata.blocks.rope import Rope, RopeStyle
from strata.gpu.kernels import gemm, gemv, mmvq, moe, rows, sample
from strata.gpu.layers import TAB
from strata.gpu.weights import DevMatrix, resident
from strata.quants import dequantize
from strata.sampling import sampler
from strata.sampling.params import SamplingParams
from strata.sampling.sampler import DEVICE_TOP_K, draw_row

pytestmark = pytest.mark.gpu

QTYPES = [
    Q.F32,
    Q.F16,
    Q.BF16,
    Q.Q4_0,
    Q.Q4_1,
    Q.Q5_0,
    Q.Q5_1,
    Q.Q8_0,
    Q.Q4_K,
    Q.Q5_K,
    Q.Q6_K,
    Q.IQ4_NL,
    Q.IQ4_XS,
]


@pytest.fixture(scope="module")
def ops(kernel_generations):
    return kernel_generations


def _cols(qt: Q) -> int:
    return 512 if GGML_QUANT_SIZES[qt][0] == 256 else 96  # K-quants: 2 super-blocks; others: a 64+32 tail


def weights(qt: Q, rows_: int, cols: int, seed: int, n_expert: int = 1) -> np.ndarray:
    """Weight-sized random blocks: scale fields ~1e-3..1e-2 so fp16 (tensor cores) holds every value."""
    rng = np.random.default_rng(seed)
    if qt in (Q.F32, Q.F16, Q.BF16):
        w = (rng.standard_normal((n_expert * rows_, cols)) * 0.05).astype(np.float32)
        if qt == Q.F32:
            return w.view(np.uint8)
        if qt == Q.F16:
            return w.astype(np.float16).view(np.uint8)
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = random_blocks(qt, n_expert * rows_, cols, seed=seed)
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[qt][1])
    for off in F16_FIELDS[qt]:
        d = (rng.uniform(1e-3, 1e-2, blocks.shape[0]) * rng.choice([-1, 1], blocks.shape[0])).astype(
            np.float16
        )
        if qt in (Q.Q6_K, Q.IQ4_XS, Q.IQ4_NL, Q.Q8_0):
            d = (d.astype(np.float32) / 32).astype(np.float16)  # larger codes: smaller scales
        blocks[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw


def dev(cp, raw: np.ndarray, qt: Q, rows_: int, cols: int, n_expert: int = 1) -> DevMatrix:
    return resident(
        DevMatrix("t", int(qt), rows_, cols, n_expert, raw.shape[-1], cp.asarray(raw.reshape(-1)))
    )


def check(got: np.ndarray, ref: np.ndarray, bound: np.ndarray, tol: float, what: str) -> None:
    err = np.abs(got.astype(np.float64) - ref) / (bound + 1e-30)
    worst = np.unravel_index(int(np.argmax(err)), err.shape)
    assert err[worst] <= tol, (
        f"{what}: worst element {worst}: got {got[worst]}, want {ref[worst]} (err {err[worst]:.3g})"
    )


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: q.name)
def test_dequantize_bit_exact(cp, ops, qt):
    cols = _cols(qt)
    raw = random_blocks(qt, 40, cols, seed=11)  # sane random blocks: zeros, subnormals, wide exponents
    m = dev(cp, raw, qt, 40, cols)
    out = cp.full((40, cols), cp.nan, cp.float32)
    ops.embed(m, cp.arange(40, dtype=cp.int64), 40, out)
    want = dequantize(raw, qt)
    got = out.get()
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (
        f"{qt.name}: {bad.size} values differ; first at {np.unravel_index(bad[0], got.shape)}"
    )


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: q.name)
def test_gemv_matches_twin(cp, ops, qt):
    rng = np.random.default_rng(int(qt))
    cols, rows_ = _cols(qt), 300
    raw = weights(qt, rows_, cols, seed=1)
    w = dequantize(raw, qt).astype(np.float64)
    parts = [
        dev(cp, raw[:100], qt, 100, cols),
        dev(cp, raw[100:140], qt, 40, cols),
        dev(cp, raw[140:], qt, 160, cols),
    ]
    nw = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    for n in (1, 3, 8, 11):
        x = rng.standard_normal((n, 2 * cols)).astype(np.float32)
        for pro in (0, 1, 2):
            xin = x if pro == 2 else np.ascontiguousarray(x[:, :cols])
            y0 = rng.standard_normal((n, rows_)).astype(np.float32)
            y = cp.asarray(y0)
            h = cp.zeros((n, cols), cp.float32)
            ops.matvec(
                parts,
                cp.asarray(xin),
                n,
                y,
                accumulate=True,
                norm=cp.asarray(nw) if pro == 1 else None,
                eps=1e-6,
                h_out=h if pro == 1 else None,
                silu_mul=pro == 2,
            )
            ref = gemv.ref_gemv(raw, qt, xin, pro, nw, 1e-6).astype(np.float64) + y0
            xt = (
                xin
                if pro == 0
                else (h.get() if pro == 1 else xin[:, :cols] / (1 + np.exp(-xin[:, :cols])) * xin[:, cols:])
            )
            if pro != 1 and ops.takes_q8(parts[0]):  # int8 inputs: the twin quantizes them the same way
                ref = mmvq.ref_mmvq(raw, qt, xin, pro).astype(np.float64) + y0
                xt = np.abs(mmvq.dequantize_q8(np.asarray(xt, np.float32)))
            check(
                y.get(),
                ref,
                np.abs(xt) @ np.abs(w).T + np.abs(y0),
                1e-5 if pro == 0 else 2e-4,
                f"{qt.name} n={n} pro={pro}",
            )


@pytest.mark.parametrize("qt", sorted(mmvq.MMVQ_TYPES), ids=lambda q: Q(q).name)
def test_mmvq_with_fused_norm_matches_twin(cp, ops, qt):
    """The int8-input product with RMSNorm folded into its staging (no normed rows written), for the
    row counts that pick different split-K factors and tokens past one block's NT."""
    if not ops.q8:
        pytest.skip("int8-input products are the q8 generation's")
    qt = Q(qt)
    rng = np.random.default_rng(70 + int(qt))
    cols = 2048 if qt != Q.Q8_0 else 1024
    for rows_, n in ((40, 1), (700, 4), (300, 11)):
        raw = weights(qt, rows_, cols, seed=rows_)
        w = dequantize(raw, qt).astype(np.float64)
        m = dev(cp, raw, qt, rows_, cols)
        nw = rng.uniform(0.5, 1.5, cols).astype(np.float32)
        x = (rng.standard_normal((n, cols)) * 3).astype(np.float32)
        y = cp.full((n, rows_), cp.nan, cp.float32)
        ops.matvec([m], cp.asarray(x), n, y, norm=cp.asarray(nw), eps=1e-6)
        ref = mmvq.ref_mmvq(raw, qt, x, 1, nw, 1e-6).astype(np.float64)
        xt = np.abs(mmvq.dequantize_q8(rms_norm(x, nw, 1e-6).astype(np.float32)))
        # a normed input a rounding step away from a code boundary may take the other code: 2e-4 of the bound
        check(y.get(), ref, xt @ np.abs(w).T, 2e-4, f"{qt.name} rows={rows_} n={n}")


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: q.name)
def test_gemm_matches_twin(cp, ops, qt):
    rng = np.random.default_rng(100 + int(qt))
    cols, rows_ = _cols(qt), 200  # 200 = one full 128-row tile and a partial one
    raw = weights(qt, rows_, cols, seed=2)
    w16 = dequantize(raw, qt).astype(np.float16).astype(np.float64)
    m = dev(cp, raw, qt, rows_, cols)
    for mrows, amode, bk in ((100, 0, 64), (100, 0, 128), (9, 0, 128), (70, 1, 64)):
        a = rng.standard_normal((mrows, cols * (1 + amode))).astype(np.float32)
        c = cp.full((mrows, rows_), cp.nan, cp.float32)
        keep, ops.gemm_bk = ops.gemm_bk, bk  # both K steps (silu_mul staging always takes 64)
        try:
            ops.matmul(m, cp.asarray(a), mrows, c, silu_mul=amode == 1)
        finally:
            ops.gemm_bk = keep
        ref = gemm.ref_gemm(raw, qt, a, amode).astype(np.float64)
        a16 = np.abs(
            gemm.ref_gemm(np.eye(cols, dtype=np.float32).view(np.uint8), Q.F32, a, amode)
        )  # |fp16(a)|
        # amode 1: expf may differ from numpy's exp by an ulp, which can flip one input's fp16 rounding
        tol = 1e-4 if amode == 0 else 5e-4
        check(
            c.get(),
            ref,
            a16.astype(np.float64) @ np.abs(w16).T,
            tol,
            f"{qt.name} m={mrows} amode={amode} bk={bk}",
        )


def test_router_logits_are_the_fp32_product(cp, ops):
    """The prefill router (cuBLAS SGEMM into the activation buffer): fp32, so to 1e-5 of the bound."""
    rng = np.random.default_rng(12)
    m, e, k = 300, 130, 512
    raw = weights(Q.F32, e, k, seed=12)
    h = rng.standard_normal((m + 5, k)).astype(np.float32)
    out = cp.full((m + 5, e), cp.nan, cp.float32)
    ops.router_logits(cp.asarray(h), m, dev(cp, raw, Q.F32, e, k), out)
    w = raw.view(np.float32).astype(np.float64)
    check(out.get()[:m], h[:m].astype(np.float64) @ w.T, np.abs(h[:m]) @ np.abs(w).T, 1e-5, "router logits")
    assert np.isnan(out.get()[m:]).all()


def test_rmsnorm_and_qkv_post(cp, ops):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 96)).astype(np.float32) * 3
    w = rng.uniform(0.5, 1.5, 96).astype(np.float32)
    out = cp.empty_like(cp.asarray(x))
    ops.rmsnorm(cp.asarray(x), cp.asarray(w), 1e-6, 5, 96, out)
    np.testing.assert_allclose(out.get(), rows.ref_rmsnorm(x, w, 1e-6), rtol=2e-6, atol=1e-6)
    for hd, n_rot, style, qk in [
        (64, 64, RopeStyle.NEOX, True),
        (128, 64, RopeStyle.NORM, False),
        (16, 16, RopeStyle.NEOX, True),
        (256, 64, RopeStyle.NEOX, True),
    ]:  # the last: Qwen3-Next's partial rotary
        h, kv, n, layer, cap = 4, 2, 6, 1, 40
        rope = Rope(n_rot=n_rot, base=1e6, style=style, scale=2.0 if style is RopeStyle.NORM else 1.0)
        qkv = rng.standard_normal((n, (h + 2 * kv) * hd)).astype(np.float32)
        qn = rng.uniform(0.5, 1.5, hd).astype(np.float32) if qk else None
        kn = rng.uniform(0.5, 1.5, hd).astype(np.float32) if qk else None
        pos = np.array([0, 1, 5, 17, 30, 39])
        kc = cp.zeros((2, kv, cap, hd), cp.float16)
        vc = cp.zeros_like(kc)
        tab = cp.asarray(np.array([[kc.data.ptr, vc.data.ptr, cap, p, 0] for p in pos], np.int64))
        q = cp.empty((n, h * hd), cp.float32)
        ops.qkv_post(
            cp.asarray(qkv),
            n,
            h,
            kv,
            hd,
            None if qn is None else cp.asarray(qn),
            None if kn is None else cp.asarray(kn),
            1e-6,
            cp.asarray(rows.inv_freq(rope)),
            n_rot,
            style is RopeStyle.NEOX,
            rope.scale,
            tab,
            5,
            layer,
            q,
        )
        rq, rk, rv = rows.ref_qkv_post(qkv, h, kv, hd, rope, pos, qn, kn, 1e-6)
        np.testing.assert_allclose(q.get().reshape(n, h, hd), rq, rtol=1e-5, atol=2e-5)
        kk = kc.get()[layer][:, pos].transpose(1, 0, 2).astype(np.float32)
        vv = vc.get()[layer][:, pos].transpose(1, 0, 2)
        np.testing.assert_allclose(kk, rk.astype(np.float32), rtol=2e-3, atol=2e-3)  # 1 fp16 ulp
        np.testing.assert_array_equal(vv, rv)


def test_topk_and_expert_ffn_both_ways(cp, ops):
    """Routing, the per-pair gemv FFN (decode) and the grouped tensor-core FFN (prefill) vs dispatch."""
    from strata.gpu.layers import GEMV_ROWS

    rng = np.random.default_rng(9)
    e, a, d, f = 16, 4, 256, 256
    for qg, qu, qd in MOE_TYPES:
        gr, ur, dr = (
            weights(Q(q), e * r, c, seed=s).reshape(e, r, -1)
            for q, r, c, s in ((qg, f, d, 3), (qu, f, d, 4), (qd, d, f, 5))
        )
        G, U, Dn = (
            dev(cp, raw, Q(q), r, c, e) for raw, q, r, c in ((gr, qg, f, d), (ur, qu, f, d), (dr, qd, d, f))
        )
        wg, wu, wd = (dequantize(raw, Q(q)).astype(np.float64) for raw, q in ((gr, qg), (ur, qu), (dr, qd)))
        for n in (3, 150):
            logits = (rng.standard_normal((n, e)) * 2).astype(np.float32)
            ids, wts = cp.empty(n * a, cp.int32), cp.empty(n * a, cp.float32)
            ops.topk(cp.asarray(logits), n, e, a, True, ids, wts)
            rid, rw = moe.ref_topk(logits, a, True)
            np.testing.assert_array_equal(ids.get().reshape(n, a), rid)
            np.testing.assert_allclose(wts.get().reshape(n, a), rw, rtol=1e-5)
            h = rng.standard_normal((n, d)).astype(np.float32)
            x0 = rng.standard_normal((n, d)).astype(np.float32)
            x = cp.asarray(x0)
            hd_ = cp.asarray(h)

            def expert(ex: int, xs: np.ndarray, wg=wg, wu=wu, wd=wd) -> np.ndarray:
                g, u = xs @ wg[ex].T, xs @ wu[ex].T
                return (g / (1 + np.exp(-g)) * u) @ wd[ex].T

            ref = x0 + moe.ref_moe(h.astype(np.float64), rid, rw.astype(np.float64), expert)
            if n <= GEMV_ROWS and ops.takes_q8(G, U, Dn):
                hq, hds = _q8_rows(cp, h)
                aq, ads = cp.empty((n * a, f), cp.int8), cp.empty((n * a, f // 16), cp.float32)
                ops.moe_q8(G, U, Dn, ids, wts, a, hq, hds, n, aq, ads, x)
                twin = x0 + mmvq.ref_moe_q8(
                    h, rid, rw.astype(np.float64), wg.__getitem__, wu.__getitem__, wd.__getitem__
                )
                err = np.linalg.norm(x.get() - twin) / np.linalg.norm(twin - x0)
                # an activation a rounding step from a code boundary may take the other code
                assert err < 1e-3, f"{qg},{qu},{qd} n={n}: int8 FFN off its twin by {err:.3g}"
                tol = 3e-2  # against fp32 inputs: the int8 rounding of h and of the activations
            elif n <= GEMV_ROWS:
                act = cp.empty((n * a, f), cp.float32)
                ops.moe_gate_up(G, U, ids, a, hd_, n * a, act)
                ops.moe_down(Dn, ids, wts, a, act, n, x)
                tol = 1e-4
            else:
                p = n * a
                counts, offsets, cursor = (
                    cp.empty(e, cp.int32),
                    cp.empty(e + 1, cp.int32),
                    cp.empty(e, cp.int32),
                )
                tiles, nt = cp.empty(3 * moe.max_tiles(p, e), cp.int32), cp.empty(1, cp.int32)
                rows_of, tok_of = cp.empty(p, cp.int32), cp.empty(p, cp.int32)
                ops.moe_group(ids, p, a, e, counts, offsets, cursor, tiles, nt, rows_of, tok_of)
                r_off, r_tiles, _ = moe.ref_plan(rid, e)
                np.testing.assert_array_equal(offsets.get(), r_off)
                got_tiles = tiles.get()[: 3 * int(nt.get()[0])].reshape(-1, 3)
                assert sorted(map(tuple, got_tiles)) == sorted(map(tuple, r_tiles))
                assert sorted(rows_of.get()) == list(range(p))
                gu = cp.empty((p, 2 * f), cp.float32)
                y = cp.empty((p, d), cp.float32)
                grid = moe.max_tiles(p, e)
                ops.matmul(G, hd_, p, gu, ldc=2 * f, a_index=tok_of, tiles=tiles, n_tiles=nt, grid_rows=grid)
                ops.matmul(
                    U,
                    hd_,
                    p,
                    gu.data.ptr + 4 * f,
                    ldc=2 * f,
                    a_index=tok_of,
                    tiles=tiles,
                    n_tiles=nt,
                    grid_rows=grid,
                )
                ops.matmul(Dn, gu, p, y, silu_mul=True, tiles=tiles, n_tiles=nt, grid_rows=grid)
                ops.moe_combine(y, rows_of, wts, a, d, n, x)
                tol = 1e-2  # fp16 operands through two chained products
            got = x.get()
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref - x0)
            assert err < tol, f"{qg},{qu},{qd} n={n}: relative error {err:.3g} of the FFN output"


def _q8_rows(cp, h: np.ndarray):
    """h quantized on the host as the kernels lay it out: codes [n, K], (d, d * sum) pairs [n, K / 16]."""
    q, d = mmvq.quantize_q8(h)
    s = d * q.reshape(q.shape[0], -1, 32).sum(-1).astype(np.float32)
    return cp.asarray(q), cp.asarray(np.stack([d, s], -1).reshape(q.shape[0], -1).astype(np.float32))


def test_q8_rows_are_the_twin_codes(cp, ops):
    """The experts' int8 inputs of a layer without a norm to fuse (hyper-connections): codes and scales
    exactly as mmvq.quantize_q8 rounds them, for K up to mmvq.MAX_K."""
    rng = np.random.default_rng(61)
    for n, k in ((1, 2048), (3, 64), (8, 8192)):
        h = (rng.standard_normal((n, k)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
        hq, hds = cp.zeros((n, k), cp.int8), cp.zeros((n, k // 16), cp.float32)
        ops.q8_rows(cp.asarray(h), n, k, hq, hds)
        want_q, want_ds = _q8_rows(cp, h)
        np.testing.assert_array_equal(hq.get(), want_q.get())
        np.testing.assert_array_equal(hds.get(), want_ds.get())


@pytest.mark.parametrize("qt", [Q.F32, Q.Q8_0, Q.Q4_K], ids=lambda q: q.name)
def test_router_topk_equals_matvec_then_topk(cp, ops, qt):
    """The fused decode router (norm-fused gemv, then the last block routes) against matvec + topk, bit for
    bit, repeated so the launch's block counter is seen to reset."""
    rng = np.random.default_rng(60 + int(qt))
    e, a, cols = 128, 8, _cols(qt) * 4
    raw = weights(qt, e, cols, seed=6)
    m = dev(cp, raw, qt, e, cols)
    # norm weights scaled so the logits have std ~2: routing decided by probabilities, not by which of
    # several underflowed (flushed) ones has the lowest id
    probe = cp.empty((1, e), cp.float32)
    ops.matvec(
        [m],
        cp.asarray(rng.standard_normal((1, cols)).astype(np.float32)),
        1,
        probe,
        norm=cp.ones(cols, cp.float32),
        eps=1e-6,
    )
    nw = cp.asarray((rng.uniform(0.5, 1.5, cols) * 2 / float(probe.std())).astype(np.float32))
    counter = cp.zeros(1, cp.int32)
    for n in (1, 3, 8, 1):
        x = cp.asarray(rng.standard_normal((n, cols)).astype(np.float32))
        lg0, lg1 = cp.full((n, e), cp.nan, cp.float32), cp.full((n, e), cp.nan, cp.float32)
        h0, h1 = cp.zeros((n, cols), cp.float32), cp.zeros((n, cols), cp.float32)
        ids0, ids1 = cp.full(n * a, -1, cp.int32), cp.full(n * a, -1, cp.int32)
        w0, w1 = cp.zeros(n * a, cp.float32), cp.zeros(n * a, cp.float32)
        ops.matvec([m], x, n, lg0, norm=nw, eps=1e-6, h_out=h0)
        ops.topk(lg0, n, e, a, True, ids0, w0)
        hq, hds = cp.zeros((n, cols), cp.int8), cp.zeros((n, cols // 16), cp.float32)
        ops.router_topk(m, x, n, lg1, nw, 1e-6, h1, a, True, ids1, w1, counter, hq, hds)
        if ops.split:  # the experts' int8 inputs are the normed rows quantized, exactly as the twin does
            want_q, want_ds = _q8_rows(cp, h1.get())
            np.testing.assert_array_equal(hq.get(), want_q.get())
            np.testing.assert_array_equal(hds.get(), want_ds.get())
        rid, rw = moe.ref_topk(lg1.get(), a, True)
        np.testing.assert_array_equal(ids1.get().reshape(n, a), rid)
        np.testing.assert_allclose(w1.get().reshape(n, a), rw, rtol=1e-5)
        if ops.split:  # same gemv body as matvec's: identical logits, routing and normed rows
            np.testing.assert_array_equal(lg1.get(), lg0.get())
            np.testing.assert_array_equal(h1.get(), h0.get())
            np.testing.assert_array_equal(ids1.get(), ids0.get())
            np.testing.assert_array_equal(w1.get(), w0.get())
        assert int(counter.get()[0]) == 0


def test_argmax_and_sampler(cp, ops):
    rng = np.random.default_rng(10)
    v = 151_936
    logits = rng.standard_normal((3, v)).astype(np.float32)
    logits[1, [7, 90_000]] = 50.0  # a tie: the lower index wins, as np.argmax
    out = cp.zeros(3 * 5, cp.int64)
    ops.argmax(cp.asarray(logits), 3, logits.shape[1], out, 5)
    np.testing.assert_array_equal(out.get()[::5], sample.ref_argmax(logits))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.3, top_k=256, top_p=0.5),
        SamplingParams(temperature=0.7, top_k=1),
    ]
    same = total = 0
    for pos in range(24):
        lg = (rng.standard_normal((4, v)) * 4).astype(np.float32)
        lg[:, rng.integers(0, v, 300)] = lg.max()  # ties across the top-k cut
        draws = np.asarray([draw_row(p, 99, pos) for p in params])
        tab = cp.zeros((4, 7), cp.int64)
        chosen = cp.zeros(4, cp.int64)
        cands = cp.zeros((2, 4, sample.SAMPLE_CHUNKS * DEVICE_TOP_K), cp.int32)
        ops.sample_rows(cp.asarray(lg), 4, v, cp.asarray(draws), tab, 7, chosen, cands)
        got = chosen.get()
        keys, ids = sample.ref_sample_chunks(lg, draws)  # the first stage against its twin
        for r, d in enumerate(draws):
            w = sample.SAMPLE_CHUNKS * min(int(d[1]), DEVICE_TOP_K) if d[0] != 0.0 else 0
            np.testing.assert_array_equal(cands[1, r, :w].get(), ids[r, :w])
            np.testing.assert_array_equal(cands[0, r, :w].get().view(np.uint32), keys[r, :w])
        np.testing.assert_array_equal(tab.get()[:, 4], got)
        want = [sampler.sample(r, [], p, 99, pos) for r, p in zip(lg, params)]
        same += int((got == np.asarray(want)).sum())
        np.testing.assert_array_equal(got, sample.ref_sample_rows(lg, draws))  # the twin, bit for bit
        total += 4
    assert same >= total - 1, f"the device draw agreed with the CPU sampler on {same} of {total} draws"


def test_advance(cp, ops):
    """Positions of slots :n one later, every other column and slot as it was; past one warp of slots too."""

    rng = np.random.default_rng(11)
    for rows_, n in ((1, 1), (8, 5), (40, 33), (64, 64)):
        tab = rng.integers(0, 1 << 40, (rows_, TAB), dtype=np.int64)
        dev_tab = cp.asarray(tab)
        ops.advance(dev_tab, TAB, n)
        np.testing.assert_array_equal(dev_tab.get(), sample.ref_advance(tab, n))

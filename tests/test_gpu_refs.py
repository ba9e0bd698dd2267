"""The GPU kernels' numpy twins, on the CPU (CI): each twin against the CPU path it must agree with,
within the tolerance the kernel is held to on the GPU (tests/test_gpu_kernels.py).

Also the parts of the GPU engine that need no GPU: the VRAM plan and ledger, and device selection.
"""

from __future__ import annotations

import numpy as np
import pytest
from dict_weights import DictWeights
from gguf.constants import GGMLQuantizationType as Q
from quant_blocks import random_blocks

from strata.blocks.attention import attend
from strata.blocks.linear_attn import DeltaNetParams, DeltaNetState, HeadOrder, deltanet
from strata.blocks.moe import dispatch, route_softmax_topk
from strata.blocks.rope import Rope, RopeStyle
from strata.errors import ConfigError
from strata.gguf.names import T, tensor
from strata.gpu import available, resolve_device
from strata.gpu.kernels import attention, cells, flash, gemm, gemv, mmvq, moe, rows, sample
from strata.gpu.kernels import deltanet as dk
from strata.quants import dequantize
from strata.sampling import sampler as sample_mod
from strata.sampling.params import SamplingParams
from strata.sampling.sampler import device_drawable, draw_row
from strata.tiers.budget import MIB, Ledger, VramBudgetError, VramPlan


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def test_flash_twin_matches_attention():
    # fp16 operands and probabilities: relative error ~1e-3 against fp32 attention, never more than 5e-3
    rng = np.random.default_rng(0)
    for t, n_past, h, kv, d in [(70, 0, 4, 2, 16), (5, 130, 8, 2, 64), (129, 3, 2, 1, 32)]:
        q = rng.standard_normal((t, h, d)).astype(np.float32)
        k = rng.standard_normal((n_past + t, kv, d)).astype(np.float32)
        v = rng.standard_normal((n_past + t, kv, d)).astype(np.float32)
        scale = 1 / np.sqrt(d)
        ref = attend(q, k, v, scale)
        assert _rel(flash.ref_flash(q, k, v, scale), ref) < 5e-3
        assert _rel(cells.ref_attention(q, k, v, scale), ref) < 5e-3
        # decode_mma's twin: the last query row, fp16 like flash's, int8 cells within their own error too
        for q8 in (False, True):
            want = attend(q[-1:], cells.ref_cells(k, q8), cells.ref_cells(v, q8), scale)
            assert _rel(attention.ref_decode(q[-1:], k, v, scale, q8), want) < 5e-3


def test_int8_decode_twin_keeps_small_and_large_values():
    """The int8 decode's arithmetic (exact codes, a key's scale on each 32-dim group's partial score, a
    value's scale folded into its probability before the fp16 rounding, times VFOLD) stays within fp16's
    error of fp32 attention on the same cells whether the values are 1e-3, 1 or 1,000 (a fold of 1 leaves
    the small products in fp16's subnormals: 1e-3 comes out 0.6% off), over a context of many tiles."""
    rng = np.random.default_rng(12)
    h, kv, d, s = 8, 2, 128, 700
    q = rng.standard_normal((1, h, d)).astype(np.float32)
    k = rng.standard_normal((s, kv, d)).astype(np.float32)
    for size in (1e-3, 1.0, 1e3):
        v = (rng.standard_normal((s, kv, d)) * size).astype(np.float32)
        want = attend(q, cells.ref_cells(k, True), cells.ref_cells(v, True), 1 / np.sqrt(d))
        assert _rel(attention.ref_decode(q, k, v, 1 / np.sqrt(d), True), want) < 2e-3, size


def test_int8_cell_twins_are_the_cpu_cache_cells():
    """--kv-type int8 on the GPU keeps the CPU cache's cells: the attention twins read what
    strata.runtime.kvcache's int8 KVCache returns, and ref_qkv_post's int8 k and v decode to its fp32 rows
    within half a step."""
    from strata.runtime.kvcache import KVCache, KVType, dequantize_rows

    rng = np.random.default_rng(11)
    k = rng.standard_normal((40, 2, 64)).astype(np.float32)
    v = rng.standard_normal((40, 2, 64)).astype(np.float32)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    cached = KVCache([0], 2, 64, kind=KVType.INT8).append(0, k, v)
    np.testing.assert_array_equal(cells.ref_cells(k, True), cached[0])
    np.testing.assert_array_equal(cells.ref_attention(q, k, v, 0.125, q8=True), attend(q, *cached, 0.125))
    rope = Rope(n_rot=64, base=1e6, style=RopeStyle.NEOX)
    qkv = rng.standard_normal((3, 8 * 64)).astype(np.float32)
    _, rk, rv = rows.ref_qkv_post(qkv, 4, 2, 64, rope, np.array([0, 5, 9]), None, None, 1e-6)
    _, (kc, ks), (vc, vs) = rows.ref_qkv_post(
        qkv, 4, 2, 64, rope, np.array([0, 5, 9]), None, None, 1e-6, q8=True
    )
    for c, sc, f16 in ((kc, ks, rk), (vc, vs, rv)):
        step = np.repeat(sc, 32, axis=-1)
        assert np.all(
            np.abs(dequantize_rows(c, sc) - f16.astype(np.float32)) <= 0.5 * step + 2e-3 * np.abs(f16)
        )


def test_gemm_twin_is_fp16_rounding_of_the_product():
    rng = np.random.default_rng(1)
    for qt in (Q.Q4_K, Q.Q8_0, Q.F32):
        raw = random_blocks(qt, 48, 256, seed=3)
        w = dequantize(raw, qt)
        ok = np.isfinite(w).all(axis=1) & (np.abs(w).max(axis=1) < 1e3)  # fp16 holds these rows
        a = rng.standard_normal((37, 256)).astype(np.float32)
        got = gemm.ref_gemm(raw[ok], qt, a)
        assert _rel(got, a.astype(np.float64) @ w[ok].T.astype(np.float64)) < 2e-3, qt.name


def test_gemv_twin_prologues():
    rng = np.random.default_rng(2)
    raw = random_blocks(Q.Q8_0, 24, 64, seed=5)
    w = dequantize(raw, Q.Q8_0).astype(np.float64)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    gu = x[:, :64] / (1 + np.exp(-x[:, :64].astype(np.float64))) * x[:, 64:]
    np.testing.assert_allclose(gemv.ref_gemv(raw, Q.Q8_0, x, pro=2), gu @ w.T, rtol=1e-4, atol=1e-4)
    nw = rng.standard_normal(64).astype(np.float32)
    xn = x[:, :64] / np.sqrt(np.mean(x[:, :64] ** 2, axis=1, keepdims=True) + 1e-6) * nw
    np.testing.assert_allclose(
        gemv.ref_gemv(raw, Q.Q8_0, x[:, :64], pro=1, norm_w=nw), xn @ w.T, rtol=1e-4, atol=1e-4
    )


def test_q8_twin_rounds_each_input_to_its_nearest_code():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 256)) * rng.uniform(0.01, 100, (5, 1))).astype(np.float32)
    x[1, 32:64] = 0  # an all-zero group: scale 0, codes 0
    q, d = mmvq.quantize_q8(x)
    assert q.dtype == np.int8 and np.abs(q.astype(int)).max() <= 127
    g = np.abs(x).reshape(5, 8, 32)
    top = np.take_along_axis(np.abs(q.astype(int)).reshape(5, 8, 32), g.argmax(-1)[..., None], -1)[..., 0]
    assert ((top == 127) | (d == 0)).all()  # each group's largest input takes the largest code
    dq = mmvq.dequantize_q8(x)
    half = np.repeat(d.astype(np.float64), 32, axis=1) / 2
    assert (np.abs(dq - x) <= half * (1 + 1e-6)).all()
    assert (d[1, 1] == 0) and (q[1, 32:64] == 0).all()


def test_mmvq_twins_are_the_fp32_products_within_the_input_rounding():
    """ref_mmvq differs from ref_gemv only by each input's rounding to its code: at most sum |w| d / 2."""
    rng = np.random.default_rng(8)
    for qt in sorted(mmvq.MMVQ_TYPES):
        raw = random_blocks(Q(qt), 16, 512, seed=qt)
        w = dequantize(raw, Q(qt)).astype(np.float64)
        ok = np.isfinite(w).all(axis=1) & (np.abs(w).max(axis=1) < 1e6)
        raw, w = raw[ok], w[ok]
        x = rng.standard_normal((3, 1024)).astype(np.float32)
        for pro, xin in ((0, x[:, :512]), (2, x)):
            xt = (
                xin
                if pro == 0
                else (xin[:, :512] / (1 + np.exp(-xin[:, :512])) * xin[:, 512:]).astype(np.float32)
            )
            _, d = mmvq.quantize_q8(np.ascontiguousarray(xt))
            bound = (np.repeat(d.astype(np.float64), 32, axis=1) / 2) @ np.abs(w).T
            diff = np.abs(
                mmvq.ref_mmvq(raw, qt, np.ascontiguousarray(xin), pro).astype(np.float64)
                - gemv.ref_gemv(raw, qt, np.ascontiguousarray(xin), pro).astype(np.float64)
            )
            scale = np.abs(xt) @ np.abs(w).T
            assert (diff <= bound * (1 + 1e-4) + 1e-6 * scale).all(), (Q(qt).name, pro)
    # the expert FFN twin: the same dispatch with both quantizations, close to the fp32 one
    e, a, d_, f = 6, 2, 64, 96
    wg, wu, wd = (rng.standard_normal(s) * 0.2 for s in ((e, f, d_), (e, f, d_), (e, d_, f)))
    h = rng.standard_normal((4, d_)).astype(np.float32)
    ids, wts = route_softmax_topk(rng.standard_normal((4, e)).astype(np.float32), a, True)

    def expert(k: int, xs: np.ndarray) -> np.ndarray:
        g, u = xs @ wg[k].T, xs @ wu[k].T
        return (g / (1 + np.exp(-g)) * u) @ wd[k].T

    exact = dispatch(h.astype(np.float64), ids, wts.astype(np.float64), expert)
    got = mmvq.ref_moe_q8(h, ids, wts.astype(np.float64), wg.__getitem__, wu.__getitem__, wd.__getitem__)
    assert 0 < _rel(got, exact) < 2e-2


def test_grouped_moe_twin_equals_dispatch():
    """The GPU grouping (offsets, 64-row tiles, each pair's row) computes the same FFN as dispatch."""
    rng = np.random.default_rng(3)
    t, d, e, a = 200, 16, 8, 2
    h = rng.standard_normal((t, d)).astype(np.float32)
    ids, wts = route_softmax_topk(rng.standard_normal((t, e)).astype(np.float32) * 3, a, True)
    mats = rng.standard_normal((e, d, d)).astype(np.float32)
    offsets, tiles, rows_of_pair = moe.ref_plan(ids, e)
    assert len(tiles) <= moe.max_tiles(t * a, e)
    tok_of_row = np.empty(t * a, np.int64)
    tok_of_row[rows_of_pair] = np.arange(t * a) // a
    y = np.empty((t * a, d), np.float32)
    for ex, r0, n in tiles:  # what qgemm does per tile: rows r0..r0+n of expert ex
        assert offsets[ex] <= r0 and r0 + n <= offsets[ex + 1] and n <= moe.TILE
        y[r0 : r0 + n] = h[tok_of_row[r0 : r0 + n]] @ mats[ex].T
    combined = (y[rows_of_pair].reshape(t, a, d) * wts[:, :, None]).sum(axis=1)  # moe_combine
    ref = dispatch(h, ids, wts, lambda ex, xs: xs @ mats[ex].T)
    np.testing.assert_allclose(combined, ref, rtol=1e-5, atol=1e-5)


def test_max_tiles_bounds_every_routing():
    rng = np.random.default_rng(4)
    for t, e, a in [(1, 8, 2), (9, 128, 8), (513, 128, 8), (4096, 16, 4)]:
        for skew in (0.0, 3.0, 30.0):
            logits = rng.standard_normal((t, e)).astype(np.float32) + skew * np.linspace(
                0, 1, e, dtype=np.float32
            )
            ids, _ = route_softmax_topk(logits, a, True)
            _, tiles, _ = moe.ref_plan(ids, e)
            assert len(tiles) <= moe.max_tiles(t * a, e)


def test_qkv_post_twin_partial_rotary_keeps_the_tail():
    rng = np.random.default_rng(5)
    n, hq, kv, hd = 3, 2, 1, 32
    qkv = rng.standard_normal((n, (hq + 2 * kv) * hd)).astype(np.float32)
    for style in RopeStyle:
        rope = Rope(n_rot=16, base=10000.0, style=style)
        q, k, v = rows.ref_qkv_post(qkv, hq, kv, hd, rope, np.array([0, 7, 300]), None, None, 1e-6)
        np.testing.assert_array_equal(q[..., 16:], qkv[:, : hq * hd].reshape(n, hq, hd)[..., 16:])
        np.testing.assert_array_equal(q[0], qkv[0, : hq * hd].reshape(hq, hd))  # position 0: no rotation
        assert k.dtype == v.dtype == np.float16
    rope = Rope(n_rot=16, base=10000.0, style=RopeStyle.NEOX)
    np.testing.assert_array_equal(
        rows.inv_freq(rope), 1.0 / (np.float32(10000.0) ** (np.arange(0, 16, 2) / 16)).astype(np.float32)
    )


DRAWS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # the server's defaults
    SamplingParams(temperature=1.3, top_k=256, top_p=0.5),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1e-30, top_k=40),  # every token but the top one underflows
]


@pytest.mark.parametrize("params", DRAWS)
def test_device_draw_twin_picks_the_cpu_token(params):
    rng = np.random.default_rng(6)
    same = total = 0
    for pos in range(60):
        logits = (rng.standard_normal(500) * 3).astype(np.float32)
        logits[rng.integers(0, 500, 40)] = logits.max()  # ties at the top, cut by id
        logits[rng.integers(0, 500, 5)] = np.nan  # masked, as on the CPU
        want = sample_mod.sample(logits, [], params, 1234, pos)
        row = np.asarray([draw_row(params, 1234, pos)])
        same += int(sample.ref_sample_rows(logits[None], row)[0]) == want
        total += 1
    # the twin sums in sequence where numpy sums pairwise: only a draw within rounding of an edge may differ
    assert same >= total - 1, f"the device draw agreed with sampler.sample on {same} of {total} draws"


@pytest.mark.parametrize("v", [500, 20, 151_936])  # chunks of 16, of 1 or none, of 4,748 tokens
def test_the_draws_chunk_candidates_hold_every_rows_top_k(v):
    """sample_chunks' twin: the top k of its candidates, in the kernels' order (key, then id), are the row's
    own top k, ties across chunk edges and NaNs included; greedy rows give none."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((len(DRAWS), v)) * 3).astype(np.float32)
    logits[:, rng.integers(0, v, max(1, v // 12))] = logits.max()  # ties at the top, in many chunks
    logits[:, rng.integers(0, v, max(1, v // 100))] = np.nan
    draws = np.asarray([draw_row(p, 1, 0) for p in DRAWS])
    keys, ids = sample.ref_sample_chunks(logits, draws)
    for row, d, kk, ii in zip(logits, draws, keys, ids):
        if d[0] == 0.0:
            assert (ii == v).all()
            continue
        k = min(int(d[1]), v)
        real = ii < v
        assert real.sum() >= k and np.array_equal(kk[real], sample._order_key(row[ii[real]]))
        cand = ii[real]
        order = np.lexsort((cand, -kk[real].astype(np.int64)))[:k]
        np.testing.assert_array_equal(cand[order], sample._top_k(row, k))


class _TableKV:
    """The part of GpuKV that GpuModel.table_row reads: k and v addresses, capacity, position, int8 scales."""

    def __init__(self, i: int) -> None:
        self.k, self.v, self.cap = 1 << 40 | i << 20, 1 << 41 | i << 20, 64 + i

    def table_row(self, pos: int) -> list[int]:
        return [self.k, self.v, self.cap, pos]

    def scale_cols(self) -> list[int]:
        return [0, 0]

    def cold_cols(self) -> list[int]:
        return [0] * 6


def test_draw_and_advance_twins_leave_the_table_the_host_would_write():
    """Graph replays never go back to the host (DecodeGraphs.greedy_loop): after sample_rows and advance, the
    table must be what _load would write from the host's bookkeeping (n_past + 1, the token drawn)."""
    from strata.gpu.layers import TAB
    from strata.gpu.model import GpuModel
    from strata.runtime.state import SequenceState

    rng = np.random.default_rng(3)
    b, rows_ = 5, 8  # slots past b hold a finished window's rows: advance must leave them
    kvs = [_TableKV(i) for i in range(rows_)]
    states = [SequenceState(kv, n_past=int(rng.integers(0, 40))) for kv in kvs]  # type: ignore[arg-type]
    tokens = [int(t) for t in rng.integers(0, 500, rows_)]
    tab = np.asarray([GpuModel.table_row(s, s.n_past, t) for s, t in zip(states, tokens)], np.int64)
    assert tab.shape == (rows_, TAB)
    idle = tab[b:].copy()
    draws = np.asarray([draw_row(DRAWS[j % len(DRAWS)], 7, 0) for j in range(b)])
    for _ in range(4):
        chosen = sample.ref_sample_rows((rng.standard_normal((b, 500)) * 3).astype(np.float32), draws)
        tab[:b, sample.TOKEN] = chosen  # sample_rows's write
        tab = sample.ref_advance(tab, b)
        for s in states[:b]:  # the host's side of the same step
            s.n_past += 1
        want = [GpuModel.table_row(s, s.n_past, int(t)) for s, t in zip(states, chosen)]
        np.testing.assert_array_equal(tab[:b], np.asarray(want, np.int64))
        np.testing.assert_array_equal(tab[b:], idle)


def test_device_draws_are_the_ones_it_can_make():
    assert device_drawable(SamplingParams(temperature=0.0), 100)
    assert device_drawable(SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.1), 151_936)
    assert not device_drawable(SamplingParams(temperature=0.8, top_k=0), 151_936)  # the whole vocabulary
    assert not device_drawable(SamplingParams(temperature=0.8, top_k=257), 151_936)
    assert not device_drawable(SamplingParams(temperature=0.8, top_k=40), 40)  # top_k >= vocab: untruncated
    assert not device_drawable(SamplingParams(temperature=0.8, top_k=40, repeat_penalty=1.1), 151_936)
    assert not device_drawable(SamplingParams(temperature=0.0, presence_penalty=0.5), 151_936)


def _deltanet_store(p: DeltaNetParams, d: int, seed: int) -> DictWeights:
    rng = np.random.default_rng(seed)
    c, inner = p.conv_channels, p.n_v_heads * p.v_dim

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * cols**-0.5).astype(np.float32)

    t = {
        tensor(T.ATTN_QKV, 0): mat(c, d),
        tensor(T.ATTN_GATE, 0): mat(inner, d),
        tensor(T.SSM_OUT, 0): mat(d, inner),
        tensor(T.SSM_CONV1D, 0): (rng.standard_normal((c, p.conv_kernel)) * 0.5).astype(np.float32),
        tensor(T.SSM_A, 0, ""): -np.exp(rng.standard_normal(p.n_v_heads) * 0.5).astype(np.float32),
        tensor(T.SSM_DT, 0, "bias"): rng.standard_normal(p.n_v_heads).astype(np.float32),
        tensor(T.SSM_NORM, 0): rng.uniform(0.5, 1.5, p.v_dim).astype(np.float32),
    }
    if p.fused_ba:
        t[tensor(T.SSM_BETA_ALPHA, 0)] = mat(2 * p.n_v_heads, d)
    else:
        t[tensor(T.SSM_BETA, 0)], t[tensor(T.SSM_ALPHA, 0)] = mat(p.n_v_heads, d), mat(p.n_v_heads, d)
    return DictWeights(t)


@pytest.mark.parametrize(
    "order,fused", [(HeadOrder.GROUPED, True), (HeadOrder.TILED, False)], ids=["qwen3next", "qwen4exp"]
)
def test_deltanet_twins_compose_to_the_cpu_sublayer(order, fused):
    """mix projections -> ref_conv -> ref_recur -> ref_gated_norm -> ssm_out, on the kernels' column layout
    and state layout, equals strata.blocks.linear_attn.deltanet (whose prefill is the chunked form) over a
    37-token prompt and 3 decode tokens carried on the state."""
    p = DeltaNetParams(
        n_k_heads=2, n_v_heads=6, k_dim=16, v_dim=24, conv_kernel=4, eps=1e-6, order=order, fused_ba=fused
    )
    d = 48
    w = _deltanet_store(p, d, 5)
    rng = np.random.default_rng(6)
    h = rng.standard_normal((40, d)).astype(np.float32)
    ref_state = DeltaNetState.empty(p)
    ref = np.concatenate(
        [deltanet(h[:37], w, 0, p, ref_state)]
        + [deltanet(h[j : j + 1], w, 0, p, ref_state) for j in range(37, 40)]
    )
    ba = [tensor(T.SSM_BETA_ALPHA, 0)] if fused else [tensor(T.SSM_BETA, 0), tensor(T.SSM_ALPHA, 0)]
    names = [tensor(T.ATTN_QKV, 0), tensor(T.ATTN_GATE, 0), *ba]
    c, inner = p.conv_channels, p.n_v_heads * p.v_dim
    window, ssm = (
        np.zeros((p.conv_kernel - 1, c), np.float32),
        np.zeros((p.n_v_heads, p.k_dim, p.v_dim), np.float32),
    )
    fused_r = p.n_v_heads // p.n_k_heads if fused else 0
    got = []
    for lo, hi in ((0, 37), (37, 38), (38, 39), (39, 40)):
        mix = np.concatenate([w.matmul(h[lo:hi], n) for n in names], axis=1)
        y, window = dk.ref_conv(mix, c, window, w.t[tensor(T.SSM_CONV1D, 0)])
        o, ssm = dk.ref_recur(
            y,
            mix[:, c + inner :],
            p.n_k_heads,
            p.n_v_heads,
            p.k_dim,
            p.v_dim,
            fused_r,
            order is HeadOrder.TILED,
            w.vector(tensor(T.SSM_A, 0, "")),
            w.vector(tensor(T.SSM_DT, 0, "bias")),
            ssm,
        )
        o = dk.ref_gated_norm(o, mix[:, c : c + inner], w.vector(tensor(T.SSM_NORM, 0)), p.n_v_heads, p.eps)
        got.append(w.matmul(o, tensor(T.SSM_OUT, 0)))
    err = _rel(np.concatenate(got), ref)
    print(f"\n{order.value}: twin chain vs deltanet() rel {err:.2e}")
    assert err < 1e-5
    np.testing.assert_allclose(ssm, ref_state.ssm, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(window, ref_state.conv)


def test_gate_twins():
    rng = np.random.default_rng(7)
    x, g, y = (rng.standard_normal((5, 12)).astype(np.float32) for _ in range(3))
    s = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(rows.ref_gate_mul(x, g), x / (1 + np.exp(-g)), rtol=1e-6)
    np.testing.assert_allclose(
        rows.ref_gated_add(x, y, s), x + y / (1 + np.exp(-s[:, None])), rtol=1e-6, atol=1e-7
    )


def test_plan_refuses_with_every_component_named():
    plan = VramPlan(24 * 1024 * MIB, {"weights: attention": 30 * 1024 * MIB, "KV cache": 4 * 1024 * MIB})
    with pytest.raises(ConfigError) as err:
        plan.size_cache()
    msg = str(err.value)
    assert msg.startswith("vram_budget_mib=24576") and "weights: attention 30,720 MiB" in msg
    assert "at least 34816 MiB" in msg and "dense part does not fit" in msg
    VramPlan(64 * 1024 * MIB, dict(plan.parts)).size_cache()


def test_ledger_takes_and_gives_back():
    led = Ledger(100 * MIB, 60 * MIB)
    led.take(30 * MIB, "KV cache")
    with pytest.raises(VramBudgetError, match="KV cache for 512 positions needs 20.0 MiB more"):
        led.take(20 * MIB, "KV cache for 512 positions")
    led.give(30 * MIB)
    led.take(40 * MIB, "KV")


def test_device_selection_names_the_option():
    assert resolve_device("cpu", "qwen3moe") == "cpu"
    with pytest.raises(ConfigError, match="^device='gpu'"):
        resolve_device("gpu", "llama")
    if not available():
        with pytest.raises(ConfigError, match="^device='cuda'"):
            resolve_device("cuda", "qwen4exp")  # no GPU: an error, never a silent CPU run
    assert resolve_device("auto", "qwen4exp") == ("cuda" if available() else "cpu")


def test_prefetch_twins_pick_rank_by_rank_and_count_the_used():
    """The lookahead's picks: each row's best prediction first, rows interleaved, only experts the decode
    table reads over PCIe (-1; not a slot, not the CPU's -2), no repeats, -1 padding; the restore's counts."""
    from strata.gpu.kernels import tiers as kt

    where = np.array([-1, 0, -1, -2, -1, -1], np.int32)
    pred = np.array(
        [[2, 1, 4], [2, 5, 0]], np.int32
    )  # rank 0: 2, 2 (repeat); rank 1: 1 (slot), 5; rank 2: 4, 0
    np.testing.assert_array_equal(kt.ref_prefetch_pick(pred, where, 3), [2, 5, 4])
    np.testing.assert_array_equal(kt.ref_prefetch_pick(pred, where, 6), [2, 5, 4, 0, -1, -1])
    np.testing.assert_array_equal(kt.ref_prefetch_pick(np.array([[1, 3]], np.int32), where, 2), [-1, -1])
    flipped = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)  # pick 2 (-1) has nothing to restore
    stats = kt.ref_prefetch_restore(
        np.array([2, 5, -1], np.int32), flipped, np.array([5, 1, 0]), (10, 20, 30)
    )
    np.testing.assert_array_equal(stats, [3, 1, 10, 30])  # 2's gate and up unused, 5's gate used


def test_prefetch_flag_is_checked():
    from strata.engine import EngineOptions
    from strata.tiers.lookahead import PREFETCH_MAX

    with pytest.raises(ConfigError, match="prefetch"):
        EngineOptions.from_kwargs(prefetch=PREFETCH_MAX + 1)
    with pytest.raises(ConfigError, match="prefetch"):
        EngineOptions.from_kwargs(prefetch=-1)
    assert EngineOptions.from_kwargs(prefetch=0).prefetch == 0

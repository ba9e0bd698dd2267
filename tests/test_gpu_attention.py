"""The attention kernels against their numpy twins (strata/gpu/kernels/attention.py and flash.py), in every
kernel generation, on fp16 and int8 (--kv-type) cells: decode attention, flash, the decode launch fused with
the qkv post-processing, split-K decode, and the int8 cells those write.

Tolerances: fp32 decode attention to 1e-5 of the magnitude bound, as tests/test_gpu_kernels.py states; int8
cells against the twin's codes; stated per test where they differ.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.blocks.rope import Rope, RopeStyle
from strata.gpu.kernels import attention, cells, flash, rows
from strata.gpu.layers import TAB
from strata.runtime.kvcache import dequantize_rows, group_of, quantize_rows

pytestmark = pytest.mark.gpu

HDS = [16, 64, 128, 256]
# decode (attention.decode_mma) multiplies fp16 queries, cells and probabilities on the tensor cores, as
# flash_attn does: against its twin to within fp16 roundings of the probabilities (a split's and a warp's
# running max differ from the twin's tiles)
DECODE_TOL = {"rtol": 1e-3, "atol": 2e-3}


@pytest.fixture(scope="module")
def ops(kernel_generations):
    return kernel_generations


def _cache(cp, k: np.ndarray, v: np.ndarray, layer: int, cap: int):
    s, kv, hd = k.shape
    kc = cp.zeros((2, kv, cap, hd), cp.float16)
    vc = cp.zeros_like(kc)
    kc[layer, :, :s] = cp.asarray(k.transpose(1, 0, 2).astype(np.float16))
    vc[layer, :, :s] = cp.asarray(v.transpose(1, 0, 2).astype(np.float16))
    return kc, vc


def _tab(cp, rows_: list[list[int]]):
    """Table rows on the device, padded with zeros to layers.TAB columns (no --kv-resident window: the
    attention kernels' cold columns 10-15 are 0)."""
    return cp.asarray(np.array([list(r) + [0] * (TAB - len(r)) for r in rows_], np.int64))


def _cells(cp, k: np.ndarray, v: np.ndarray, layer: int, cap: int, q8: bool):
    """One sequence's cache of k, v [S, KV, hd] at `layer`: fp16 cells, or int8 ones (_cache8). Returns the
    arrays (kept alive by the caller), the table row at the last key, flash's k, v and head stride, and its
    scales argument."""
    s, kv, hd = k.shape
    if q8:
        kc, ks, vc, vs = _cache8(cp, k, v, layer, cap)
        ng = hd // group_of(hd)
        lb, sb = kv * cap * hd, kv * cap * ng * 4
        args = (kc.data.ptr + layer * lb, vc.data.ptr + layer * lb, cap * hd)
        return (
            (kc, ks, vc, vs),
            _row8(kc, ks, vc, vs, cap, s - 1),
            args,
            (ks.data.ptr + layer * sb, vs.data.ptr + layer * sb, cap * ng),
        )
    kc, vc = _cache(cp, k, v, layer, cap)
    lb = kv * cap * hd * 2
    args = (kc.data.ptr + layer * lb, vc.data.ptr + layer * lb, cap * hd)
    return (kc, vc), [kc.data.ptr, vc.data.ptr, cap, s - 1, 0, 0, 0, 0, 0], args, None


def _rows(cp, rng, lengths: list[int], kv: int, hd: int, layer: int, q8: bool):
    """One cached sequence of random keys and values a length (each its own cache, one capacity), and the
    table of their rows at their last keys; the caches come back with their k and v for the twins."""
    cap = max(lengths) + 3
    caches, rows_ = [], []
    for s_ in lengths:
        k = rng.standard_normal((s_, kv, hd)).astype(np.float32)
        v = rng.standard_normal((s_, kv, hd)).astype(np.float32)
        keep, row, _, _ = _cells(cp, k, v, layer, cap, q8)
        rows_.append(row)
        caches.append((keep, k, v))
    return _tab(cp, rows_), caches


def _fused_equals_two_launches(
    cp, ops, rng, tab, n: int, h: int, kv: int, hd: int, layer: int, q8: bool, part
) -> None:
    """attn_decode_qkv on random q/k/v rows against qkv_post then attn_decode on the same caches (which the
    second writes again, the same cells)."""
    scale = 1 / np.sqrt(hd)
    rope = Rope(n_rot=hd, base=1e6, style=RopeStyle.NEOX)
    qkv = rng.standard_normal((n, (h + 2 * kv) * hd)).astype(np.float32)
    args = (None, None, 1e-6, cp.asarray(rows.inv_freq(rope)), hd, True, rope.scale)
    fused = cp.full((n, h * hd), cp.nan, cp.float32)
    ops.attn_decode_qkv(cp.asarray(qkv), tab, TAB, layer, n, h, kv, hd, *args, scale, fused, q8, part)
    qq = cp.empty((n, h * hd), cp.float32)
    ops.qkv_post(cp.asarray(qkv), n, h, kv, hd, *args, tab, TAB, layer, qq, q8)
    again = cp.full((n, h * hd), cp.nan, cp.float32)
    ops.attn_decode(qq, tab, TAB, layer, n, h, kv, hd, scale, again, q8)
    np.testing.assert_allclose(fused.get(), again.get(), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize("hd", HDS)
def test_attention_decode_and_flash(cp, ops, hd, q8):
    """Decode attention and flash against the twins on the cached cells: fp16, or (q8, --kv-type int8) int8
    codes with their scales, decoded in fp32 as code * scale by decode and to fp16 tiles by flash; flash at
    both block sizes (4 and 8 warps)."""
    rng = np.random.default_rng(hd + 70 * q8)
    h, kv, layer = 8, 2, 1
    for t, n_past in [(1, 0), (1, 300), (70, 0), (33, 100), (200, 900)]:
        s = n_past + t
        q = rng.standard_normal((t, h, hd)).astype(np.float32)
        k = rng.standard_normal((s, kv, hd)).astype(np.float32)
        v = rng.standard_normal((s, kv, hd)).astype(np.float32)
        _keep, row, kv_cells, scales = _cells(cp, k, v, layer, s + 13, q8)
        out = cp.full((t, h * hd), cp.nan, cp.float32)
        scale = 1 / np.sqrt(hd)
        if t == 1:
            tab = _tab(cp, [row])
            ops.attn_decode(cp.asarray(q.reshape(1, -1)), tab, TAB, layer, 1, h, kv, hd, scale, out, q8)
            got = out.get().reshape(t, h, hd)
            np.testing.assert_allclose(got, attention.ref_decode(q, k, v, scale, q8), **DECODE_TOL)
            ref = cells.ref_attention(q, k, v, scale, q8)
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-3
            continue
        want = flash.ref_flash(q, cells.ref_cells(k, q8), cells.ref_cells(v, q8), scale)
        for warps in flash.FLASH_WARPS:  # blocks of 64 and of 128 queries: the same rows, the same order
            out.fill(cp.nan)
            ops.flash(cp.asarray(q), *kv_cells, t, n_past, h, kv, hd, scale, out, scales, warps=warps)
            got = out.get().reshape(t, h, hd)
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-3, err_msg=f"{warps} warps")
            if not q8:
                ref = cells.ref_attention(q, k, v, scale)
                assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-3


@pytest.mark.parametrize("hd", HDS)
def test_attention_decode_fused_with_qkv_post(cp, ops, hd):
    """attn_decode_qkv (q/k norm, RoPE, cache write and decode attention in one launch) against qkv_post then
    attn_decode on a copy of the same caches, and against the numpy twins; one cache per row."""
    rng = np.random.default_rng(50 + hd)
    h, kv, layer = 8, 2, 1
    rope = Rope(n_rot=hd, base=1e6, style=RopeStyle.NEOX)
    qn, kn = rng.uniform(0.5, 1.5, hd).astype(np.float32), rng.uniform(0.5, 1.5, hd).astype(np.float32)
    pos = np.array([0, 37, 300])
    n = pos.size
    qkv = rng.standard_normal((n, (h + 2 * kv) * hd)).astype(np.float32)
    caches, tabs = [], []
    for _ in range(2):  # [0]: the two-launch path, [1]: the fused kernel
        rows_, cs = [], []
        for p in pos:
            k = rng.standard_normal((p + 1, kv, hd)).astype(np.float32)
            kc, vc = _cache(cp, k, k[::-1].copy(), layer, p + 5)
            cs.append((kc, vc))
            rows_.append([kc.data.ptr, vc.data.ptr, p + 5, p, 0])
        caches.append(cs)
        tabs.append(_tab(cp, rows_))
    for r in range(n):  # the same past keys in both copies
        caches[1][r][0][...] = caches[0][r][0]
        caches[1][r][1][...] = caches[0][r][1]
    args = (cp.asarray(qn), cp.asarray(kn), 1e-6, cp.asarray(rows.inv_freq(rope)), hd, True, rope.scale)
    scale = 1 / np.sqrt(hd)
    q = cp.empty((n, h * hd), cp.float32)
    want = cp.full((n, h * hd), cp.nan, cp.float32)
    ops.qkv_post(cp.asarray(qkv), n, h, kv, hd, *args, tabs[0], TAB, layer, q)
    ops.attn_decode(q, tabs[0], TAB, layer, n, h, kv, hd, scale, want)
    got = cp.full((n, h * hd), cp.nan, cp.float32)
    ops.attn_decode_qkv(cp.asarray(qkv), tabs[1], TAB, layer, n, h, kv, hd, *args, scale, got)
    np.testing.assert_allclose(got.get(), want.get(), rtol=2e-4, atol=2e-4)  # an fp16 ulp of a key at most
    rq, rk, rv = rows.ref_qkv_post(qkv, h, kv, hd, rope, pos, qn, kn, 1e-6)
    for r, p in enumerate(pos):
        (k0, v0), (k1, v1) = caches[0][r], caches[1][r]
        np.testing.assert_allclose(
            k1.get().astype(np.float32), k0.get().astype(np.float32), rtol=2e-3, atol=2e-3
        )
        np.testing.assert_array_equal(v1.get(), v0.get())
        kk = k1.get()[layer][:, : p + 1].transpose(1, 0, 2).astype(np.float32)
        vv = v1.get()[layer][:, : p + 1].transpose(1, 0, 2).astype(np.float32)
        np.testing.assert_array_equal(vv[p], rv[r].astype(np.float32))
        np.testing.assert_allclose(kk[p], rk[r].astype(np.float32), rtol=2e-3, atol=2e-3)  # 1 fp16 ulp
        ref = attention.ref_decode(rq[r][None], kk, vv, scale)
        np.testing.assert_allclose(got.get()[r].reshape(1, h, hd), ref, **DECODE_TOL)


def _cache8(cp, k: np.ndarray, v: np.ndarray, layer: int, cap: int):
    """int8 cells of k, v [S, KV, hd] at `layer` (strata.runtime.kvcache.quantize_rows), as GpuKV lays them
    out."""
    s, kv, hd = k.shape
    ng = hd // group_of(hd)
    out = []
    for x in (k, v):
        codes, scales = quantize_rows(x)
        c = cp.zeros((2, kv, cap, hd), cp.int8)
        sc = cp.zeros((2, kv, cap, ng), cp.float32)
        c[layer, :, :s] = cp.asarray(codes.transpose(1, 0, 2))
        sc[layer, :, :s] = cp.asarray(scales.transpose(1, 0, 2))
        out += [c, sc]
    return out  # k codes, k scales, v codes, v scales


def _row8(kc, ks, vc, vs, cap: int, pos: int) -> list[int]:
    return [kc.data.ptr, vc.data.ptr, cap, pos, 0, 0, 0, ks.data.ptr, vs.data.ptr]


@pytest.mark.parametrize("hd", HDS)
def test_int8_cells_written_by_qkv_post_and_the_fused_decode(cp, ops, hd):
    """qkv_post and attn_decode_qkv write the same int8 cells as strata.runtime.kvcache.quantize_rows (within
    one code: the GPU's rotation differs from numpy's in the last fp32 bits), and the fused kernel's attention
    reads the new key from its own copy as the cache holds it."""
    rng = np.random.default_rng(90 + hd)
    h, kv, layer = 8, 2, 1
    rope = Rope(n_rot=hd, base=1e6, style=RopeStyle.NEOX)
    qn, kn = rng.uniform(0.5, 1.5, hd).astype(np.float32), rng.uniform(0.5, 1.5, hd).astype(np.float32)
    pos = np.array([0, 37, 300])
    n = pos.size
    qkv = rng.standard_normal((n, (h + 2 * kv) * hd)).astype(np.float32)
    args = (cp.asarray(qn), cp.asarray(kn), 1e-6, cp.asarray(rows.inv_freq(rope)), hd, True, rope.scale)
    scale = 1 / np.sqrt(hd)
    rq, (rkc, rks), (rvc, rvs) = rows.ref_qkv_post(qkv, h, kv, hd, rope, pos, qn, kn, 1e-6, q8=True)
    for fused in (False, True):
        caches, rows_ = [], []
        for p in pos:
            past = rng.standard_normal((p + 1, kv, hd)).astype(np.float32)
            c = _cache8(cp, past, past[::-1].copy(), layer, p + 5)
            caches.append((c, past))
            rows_.append(_row8(*c, p + 5, p))
        tab = _tab(cp, rows_)
        got = cp.full((n, h * hd), cp.nan, cp.float32)
        if fused:
            ops.attn_decode_qkv(cp.asarray(qkv), tab, TAB, layer, n, h, kv, hd, *args, scale, got, q8=True)
        else:
            q = cp.empty((n, h * hd), cp.float32)
            ops.qkv_post(cp.asarray(qkv), n, h, kv, hd, *args, tab, TAB, layer, q, q8=True)
            ops.attn_decode(q, tab, TAB, layer, n, h, kv, hd, scale, got, q8=True)
        for r, p in enumerate(pos):
            (kc, ks, vc, vs), past = caches[r]
            for codes, scales, rc, rs in ((kc, ks, rkc, rks), (vc, vs, rvc, rvs)):
                c8 = codes.get()[layer][:, p].astype(np.float32)
                s8 = scales.get()[layer][:, p]
                np.testing.assert_allclose(s8, rs[r], rtol=1e-5)
                assert np.abs(c8 - rc[r].astype(np.float32)).max() <= 1, (fused, r)
            kk = dequantize_rows(kc.get()[layer][:, : p + 1], ks.get()[layer][:, : p + 1]).transpose(1, 0, 2)
            vv = dequantize_rows(vc.get()[layer][:, : p + 1], vs.get()[layer][:, : p + 1]).transpose(1, 0, 2)
            ref = attention.ref_decode(rq[r][None], kk, vv, scale)  # the cells as cached, decoded
            np.testing.assert_allclose(got.get()[r].reshape(1, h, hd), ref.reshape(1, h, hd), **DECODE_TOL)


@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize("hd", [64, 256])
def test_split_decode_equals_one_block(cp, ops, hd, q8):
    """Split-K decode (attention.SPLITS blocks a head, merged by log-sum-exp) against the one-block kernel and
    the twin, from one key to 70k, fused with the q/k/v epilogue too; rows at different lengths share a
    launch."""
    rng = np.random.default_rng(110 + hd)
    h, kv, layer = 8, 2, 0
    lengths = [1, 100, 4097, 70_000]
    n = len(lengths)
    tab, caches = _rows(cp, rng, lengths, kv, hd, layer, q8)
    q = rng.standard_normal((n, h, hd)).astype(np.float32)
    scale = 1 / np.sqrt(hd)
    part = cp.empty(n * h * attention.SPLITS * (hd + 2), cp.float32)
    one = cp.full((n, h * hd), cp.nan, cp.float32)
    split = cp.full((n, h * hd), cp.nan, cp.float32)
    ops.attn_decode(cp.asarray(q.reshape(n, -1)), tab, TAB, layer, n, h, kv, hd, scale, one, q8)
    ops.attn_decode(cp.asarray(q.reshape(n, -1)), tab, TAB, layer, n, h, kv, hd, scale, split, q8, part)
    np.testing.assert_allclose(split.get(), one.get(), **DECODE_TOL)
    for r, (_, k, v) in enumerate(caches):
        ref = attention.ref_decode(q[r][None], k, v, scale, q8)
        np.testing.assert_allclose(split.get()[r].reshape(1, h, hd), ref, **DECODE_TOL)
    # the fused kernel: each split computes the query; only the split with the new key makes and stores it
    _fused_equals_two_launches(cp, ops, rng, tab, n, h, kv, hd, layer, q8, part)


@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize("h, kv", [(16, 2), (12, 2), (6, 6), (9, 3)])
def test_decode_blocks_of_query_groups(cp, ops, h, kv, q8):
    """Decode blocks take the query heads of a kv group together (attention.group_heads: 8, 6 of a padded 8,
    1 and 3 of a padded 4): one block a group and split-K against the twin, and the launch fused with the
    q/k/v epilogue against qkv_post then attn_decode; rows at different lengths share a launch."""
    rng = np.random.default_rng(130 + h + kv + 7 * q8)
    hd, layer = 128, 1
    lengths = [1, 300, 5000]
    n = len(lengths)
    tab, caches = _rows(cp, rng, lengths, kv, hd, layer, q8)
    q = rng.standard_normal((n, h, hd)).astype(np.float32)
    scale = 1 / np.sqrt(hd)
    part = cp.empty(n * h * attention.SPLITS * (hd + 2), cp.float32)
    for p in (None, part):
        out = cp.full((n, h * hd), cp.nan, cp.float32)
        ops.attn_decode(cp.asarray(q.reshape(n, -1)), tab, TAB, layer, n, h, kv, hd, scale, out, q8, p)
        for r, (_, k, v) in enumerate(caches):
            ref = attention.ref_decode(q[r][None], k, v, scale, q8)
            np.testing.assert_allclose(out.get()[r].reshape(1, h, hd), ref, **DECODE_TOL)
    _fused_equals_two_launches(cp, ops, rng, tab, n, h, kv, hd, layer, q8, part)

"""The QSA kernels (strata/gpu/kernels/qsa.py) against their numpy twins, which tests/test_gpu_qsa_refs.py
holds to the CPU path.

Every pass mixes sequences at different positions (prefill chunks and decode rows). Tolerances: the
compressed keys and indexer queries (fp32 norm and rotation) to 1e-5, the raw-key ring exactly, and the other
layer's record untouched; block scores to 1e-5 of their size, and the selection exactly: from the GPU's own
scores with random floats (a near-tie may round either way), from the twin's with small integers, whose
scores are exact in fp32 (there ties are everywhere); attention to 1e-4 (fp32 on the cached cells).
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.blocks.rope import Rope, RopeStyle
from strata.gpu.kernels import attention, rows
from strata.gpu.kernels import qsa as qk
from strata.gpu.kernels import qsa_select as qsel
from strata.runtime.kvcache import group_of, quantize_rows

pytestmark = pytest.mark.gpu

TAB = 17  # a row stride past layers.TAB's 16 (the kernels take the stride), the state at qk.QSA_COL
EPS = 1e-6


def _row(pos: int, state: int = 0, cells: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)) -> list[int]:
    """A table row: cells = (k, v, cap, k scales, v scales) of the KV cache, state = the QSA buffer."""
    k, v, cap, ks, vs = cells
    row = [k, v, cap, pos, 0, 0, 0, ks, vs, 0] + [0] * 7  # no --kv-resident window: cold columns 10-15 zero
    row[qk.QSA_COL] = state
    return row


@pytest.mark.parametrize("d", [16, 128])
def test_compressed_keys_and_ring(cp, ops, d):
    """qsa_keys on a pass of four sequences (a prompt from 0, a chunk from 10 whose first block began in the
    ring, a decode row completing a block from the ring, one completing none), then decode steps; layer 1 of
    a two-layer buffer."""
    rng = np.random.default_rng(d)
    ratio, max_blocks, j = 4, 16, 1
    stride = qk.qsa_stride(max_blocks, ratio, d)
    rope = Rope(n_rot=d // 2, base=1e4, style=RopeStyle.NEOX)  # partial: the tail dims pass through
    kn = rng.uniform(0.5, 1.5, d).astype(np.float32)
    args = (cp.asarray(kn), EPS, cp.asarray(rows.inv_freq(rope)), rope.n_rot, True, rope.scale)
    host = [rng.standard_normal(2 * stride).astype(np.float32) for _ in range(4)]
    dev = [cp.asarray(x) for x in host]

    def step(runs: list[tuple[int, np.ndarray]]) -> None:
        tab = cp.asarray(np.array([_row(int(p), dev[i].data.ptr) for i, pos in runs for p in pos], np.int64))
        n = tab.shape[0]
        raw = rng.standard_normal((n, d)).astype(np.float32)
        ops.qsa_keys(cp.asarray(raw), n, tab, TAB, j, stride, ratio, d, *args)
        r0 = 0
        for i, pos in runs:
            rec = host[i][j * stride :]
            rec[...] = qk.ref_qsa_keys(raw[r0 : r0 + pos.size], pos, rec, max_blocks, ratio, kn, EPS, rope)
            r0 += pos.size
        for i, pos in runs:
            got = dev[i].get()
            np.testing.assert_array_equal(got[:stride], host[i][:stride], err_msg="layer 0 was written")
            want_blocks, want_ring = qk.record_views(host[i][stride:], max_blocks, ratio, d)
            blocks, ring = qk.record_views(got[stride:], max_blocks, ratio, d)
            np.testing.assert_allclose(blocks, want_blocks, rtol=1e-5, atol=1e-5, err_msg=f"positions {pos}")
            np.testing.assert_array_equal(ring, want_ring)

    step([(0, np.arange(13)), (1, np.array([39])), (2, np.arange(10, 17)), (3, np.array([41]))])
    for s in range(6):
        step([(0, np.array([13 + s])), (2, np.array([17 + s]))])


@pytest.mark.parametrize("d", [16, 128])
def test_indexer_queries(cp, ops, d):
    rng = np.random.default_rng(20 + d)
    hi = 8
    rope = Rope(n_rot=d // 2, base=1e4, style=RopeStyle.NEOX)
    qn = rng.uniform(0.5, 1.5, d).astype(np.float32)
    pos = np.array([0, 5, 300, 4099])
    n = pos.size
    q = rng.standard_normal((n, hi, d)).astype(np.float32)
    tab = cp.asarray(np.array([_row(int(p)) for p in pos], np.int64))
    got = cp.asarray(q.reshape(n, -1))
    inv = cp.asarray(rows.inv_freq(rope))
    ops.qsa_query(got, n, hi, d, cp.asarray(qn), EPS, inv, rope.n_rot, True, rope.scale, tab, TAB)
    want = qk.ref_qsa_query(q, pos, qn, EPS, rope)
    np.testing.assert_allclose(got.get().reshape(n, hi, d), want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("top", [8, 512])
@pytest.mark.parametrize("d", [16, 128])
@pytest.mark.parametrize("integer", [False, True], ids=["float", "integer"])
def test_block_selection(cp, ops, d, top, integer):
    """qsa_select on a prompt's first 13 rows, a chunk at 400.., and decode rows with 20,000 and max_blocks
    (20,480) complete blocks; qsa_score 5 rows at a time and with scratch for every row, and qsa_score_tiled
    (told the bound, its row tiles mixing sequences): the same answer. integer: q and keys in {-1, 0, 1}, one
    decode row's q all 0 (every block ties at 0: the earliest win)."""
    rng = np.random.default_rng(30 + d + top + integer)
    hi, ratio, j, max_blocks = 8, 4, 1, 20_480
    stride = qk.qsa_stride(max_blocks, ratio, d)
    runs = [
        np.arange(13),
        np.array([20_000 * ratio - 1]),
        np.arange(400, 408),
        np.array([max_blocks * ratio - 1]),
    ]

    def draw(*shape: int) -> np.ndarray:
        x = rng.integers(-1, 2, shape) if integer else rng.standard_normal(shape)
        return x.astype(np.float32)

    states = [draw(2 * stride) for _ in runs]
    dev = [cp.asarray(s) for s in states]
    tab = cp.asarray(
        np.array([_row(int(p), dev[i].data.ptr) for i, pos in enumerate(runs) for p in pos], np.int64)
    )
    n = sum(r.size for r in runs)
    q = draw(n, hi, d)
    if integer:
        q[13] = 0.0  # the 20,000-block decode row
    sels, every = [], []
    for chunk, seen in ((5, None), (n, None), (n, max_blocks)):  # the last two hold every row's scores
        scratch = cp.full(ops.qsa_scratch(chunk, max_blocks), cp.nan, cp.float32)
        sel = cp.full((n, top), -7, cp.int32)
        nsel = cp.full(n, -7, cp.int32)
        ld = ops.qsa_select(
            cp.asarray(q.reshape(n, -1)), n, tab, TAB, j, stride, hi, d, ratio, top, sel, nsel, scratch, seen
        )
        assert ld == max_blocks
        sels.append((sel.get(), nsel.get()))
        every.append(scratch.get())
    (sel, nsel) = sels[0]
    for other, onsel in sels[1:]:
        np.testing.assert_array_equal(other, sel)
        np.testing.assert_array_equal(onsel, nsel)
    for scores in every[1:]:
        _check_selection(scores, sel, nsel, q, states, runs, stride, max_blocks, ratio, d, top, integer)
    if integer:
        np.testing.assert_array_equal(sel[13], np.arange(top))
    assert (nsel < np.concatenate([(r + 1) // ratio for r in runs])).any()


def _check_selection(scores, sel, nsel, q, states, runs, stride, max_blocks, ratio, d, top, integer) -> None:
    """Each run's scores (a row each in `scores`) against the twin's, and its selection against the pick of
    those scores (with integers, of the twin's)."""
    r0 = 0
    for i, pos in enumerate(runs):
        blocks, _ = qk.record_views(states[i][stride:], max_blocks, ratio, d)
        mine = slice(r0, r0 + pos.size)
        complete = (pos + 1) // ratio
        want = qsel.ref_qsa_scores(q[mine], blocks[: complete.max()])
        for r, c in enumerate(complete):
            got = scores[r0 + r, :c]
            if integer:  # exact sums of small integers, one correctly rounded division
                np.testing.assert_array_equal(got, want[r, :c])
            else:
                err = np.abs(got - want[r, :c])
                assert err.max(initial=0) <= 1e-5 * max(1.0, want[r, :c].max(initial=0)), f"row {r0 + r}"
            ws, wn = qsel.ref_qsa_pick(got[None], complete[r : r + 1], top)
            np.testing.assert_array_equal(sel[r0 + r], ws[0], err_msg=f"row {r0 + r}: {c} blocks")
            assert nsel[r0 + r] == wn[0]
        if integer:
            ws, wn = qsel.ref_qsa_select(q[mine], blocks[: complete.max()], pos, ratio, top)
            np.testing.assert_array_equal(sel[mine], ws)
            np.testing.assert_array_equal(nsel[mine], wn)
        r0 += pos.size


@pytest.mark.parametrize("d", [32, 128])
def test_tiled_scores_short_rows(cp, ops, d):
    """A prefill pass told its bound (85 complete blocks): score rows 88 floats long, 8 rows a launch in a
    scratch of 800 floats, 20 indexer heads (a second group of 16, mostly empty); two sequences, the
    second's rows at 0..8 (none to 2 complete blocks), against the twin's scores and picks."""
    rng = np.random.default_rng(d)
    hi, ratio, j, max_blocks, top = 20, 4, 0, 100, 16
    stride = qk.qsa_stride(max_blocks, ratio, d)
    runs = [np.arange(300, 340), np.arange(9)]
    states = [rng.standard_normal(stride).astype(np.float32) for _ in runs]
    dev = [cp.asarray(s) for s in states]
    rows_ = [_row(int(p), dev[i].data.ptr) for i, r in enumerate(runs) for p in r]
    tab = cp.asarray(np.array(rows_, np.int64))
    n = sum(r.size for r in runs)
    q = rng.standard_normal((n, hi, d)).astype(np.float32)
    scratch = cp.full(ops.qsa_scratch(8, max_blocks), cp.nan, cp.float32)
    sel, nsel = cp.full((n, top), -7, cp.int32), cp.full(n, -7, cp.int32)
    ld = ops.qsa_select(cp.asarray(q.reshape(n, -1)), n, tab, TAB, j, stride, hi, d, ratio, top, sel, nsel,
                        scratch, 340 // ratio)  # fmt: skip
    assert ld == 88
    last = scratch.get().reshape(-1)[:ld]  # the last launch's one row: position 8, two complete blocks
    want = qsel.ref_qsa_scores(q[-1:], qk.record_views(states[1], max_blocks, ratio, d)[0][:2])
    np.testing.assert_allclose(last[:2], want[0], rtol=1e-5, atol=1e-5)
    r0, sel, nsel = 0, sel.get(), nsel.get()
    for i, pos in enumerate(runs):
        blocks, _ = qk.record_views(states[i], max_blocks, ratio, d)
        complete = (pos + 1) // ratio
        mine = slice(r0, r0 + pos.size)
        blocks = blocks[: max(complete.max(), 1)]
        ws, wn = qsel.ref_qsa_select(q[mine], blocks, pos, ratio, top)
        scores = qsel.ref_qsa_scores(q[mine], blocks)
        scores[np.arange(len(blocks))[None] >= complete[:, None]] = -np.inf
        near = np.sort(scores, axis=1)
        for r in range(pos.size):  # a row whose k-th and k+1-th scores nearly tie may pick either
            gap = near[r, -top] - near[r, -top - 1] if complete[r] > top else 1.0
            if gap > 1e-4:
                np.testing.assert_array_equal(sel[r0 + r], ws[r], err_msg=f"row {r0 + r}")
            assert nsel[r0 + r] == wn[r]
        r0 += pos.size


def _cells(cp, k: np.ndarray, v: np.ndarray, layer: int, cap: int, q8: bool):
    """One sequence's cache of k, v [S, KV, hd] at `layer` of two, as GpuKV lays it out (fp16 cells, or
    int8 codes and scales): the arrays (kept alive by the caller) and the table's (k, v, cap, k scales,
    v scales)."""
    s, kv, hd = k.shape
    arrays = []
    for x in (k, v):
        if q8:
            codes, scales = quantize_rows(x)
            c = cp.zeros((2, kv, cap, hd), cp.int8)
            sc = cp.zeros((2, kv, cap, hd // group_of(hd)), cp.float32)
            c[layer, :, :s] = cp.asarray(codes.transpose(1, 0, 2))
            sc[layer, :, :s] = cp.asarray(scales.transpose(1, 0, 2))
            arrays += [c, sc]
        else:
            c = cp.zeros((2, kv, cap, hd), cp.float16)
            c[layer, :, :s] = cp.asarray(x.transpose(1, 0, 2).astype(np.float16))
            arrays += [c, None]
    kc, ks, vc, vs = arrays
    scale_ptrs = (ks.data.ptr, vs.data.ptr) if q8 else (0, 0)
    return arrays, (kc.data.ptr, vc.data.ptr, cap, *scale_ptrs)


@pytest.mark.parametrize("split", [False, True], ids=["one", "split"])
@pytest.mark.parametrize("q8", [False, True], ids=["f16", "int8"])
@pytest.mark.parametrize("hd", [16, 64, 128, 256])
def test_attention_over_selected_blocks(cp, ops, hd, q8, split):
    """qsa_attend over random selections against the twin (attend_masked on the cached cells): a prompt's
    13 rows, a chunk at 100.., decode rows at 300 and 4095; a decode row whose every block is selected (40)
    equals attn_decode on the same table row, within the tensor-core decode's fp16 roundings
    (test_gpu_attention.py DECODE_TOL)."""
    rng = np.random.default_rng(40 + hd + 3 * q8 + split)
    h, kv, layer, ratio, top = 8, 2, 1, 4, 16
    runs = [np.arange(13), np.array([300]), np.arange(100, 105), np.array([4095]), np.array([40])]
    keep, kvs, tab_rows, sels = [], [], [], []
    for pos in runs:
        s = int(pos[-1]) + 1
        k = rng.standard_normal((s, kv, hd)).astype(np.float32)
        v = rng.standard_normal((s, kv, hd)).astype(np.float32)
        arrays, cells = _cells(cp, k, v, layer, s + 3, q8)
        keep.append(arrays)
        kvs.append((k, v))
        tab_rows += [_row(int(p), 0, cells) for p in pos]
        complete = (pos + 1) // ratio
        sels.append(
            qsel.ref_qsa_pick(rng.random((pos.size, complete.max())).astype(np.float32), complete, top)
        )
    n = len(tab_rows)
    tab = cp.asarray(np.array(tab_rows, np.int64))
    sel = np.concatenate([s for s, _ in sels])
    nsel = np.concatenate([c for _, c in sels])
    q = rng.standard_normal((n, h, hd)).astype(np.float32)
    scale = 1 / np.sqrt(hd)
    part = cp.empty(n * h * attention.SPLITS * (hd + 2), cp.float32) if split else None
    out = cp.full((n, h * hd), cp.nan, cp.float32)
    args = (cp.asarray(sel), cp.asarray(nsel), top, ratio, out, q8, part)
    ops.qsa_attend(cp.asarray(q.reshape(n, -1)), tab, TAB, layer, n, h, kv, hd, scale, *args)
    got = out.get().reshape(n, h, hd)
    r0 = 0
    for pos, (k, v), (s, c) in zip(runs, kvs, sels):
        want = qk.ref_qsa_attend(q[r0 : r0 + pos.size], k, v, pos, s, c, ratio, scale, q8)
        np.testing.assert_allclose(got[r0 : r0 + pos.size], want, rtol=1e-4, atol=1e-5, err_msg=f"{pos}")
        r0 += pos.size
    assert nsel[-1] == 10, "the last row should keep every block"
    full = cp.full((1, h * hd), cp.nan, cp.float32)
    last = tab[n - 1 :]
    ops.attn_decode(
        cp.asarray(q[n - 1 :].reshape(1, -1)), last, TAB, layer, 1, h, kv, hd, scale, full, q8, part
    )
    np.testing.assert_allclose(got[n - 1], full.get().reshape(h, hd), rtol=1e-3, atol=2e-3)

"""The qwen4exp kernels (strata/gpu/kernels/hyper.py) against their numpy twins, on fresh random inputs:
S = 4 streams, hidden sizes 64, 200 (columns past the last full block) and 2048, decode-sized and
prefill-sized row counts. fp32 throughout, sums reordered (block reductions, fused multiply-adds): 1e-5 of
each output's magnitude, reporting the worst element; the conv windows are copies, so they match exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.gpu.kernels import hyper as hk
from strata.gpu.runtime import ptr

pytestmark = pytest.mark.gpu

S, EPS = 4, 1e-6
DS = [64, 200, 2048]
NS = [1, 3, 8, 67]


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


@pytest.fixture(scope="module")
def ops(cp):
    from strata.gpu.ops import Ops

    return Ops()


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    err = np.abs(got - want).max() / (np.abs(want).max() + 1e-30)
    worst = np.unravel_index(np.abs(got - want).argmax(), want.shape)
    assert err < 1e-5, f"{what}: worst {err:.2e} at {worst} (got {got[worst]}, want {want[worst]})"


def _randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("d", DS)
def test_hc_norm_and_silu_scale(cp, ops, d):
    rng = np.random.default_rng(d)
    w = rng.uniform(0.5, 1.5, S * d).astype(np.float32)
    for n in NS:
        x = _randn(rng, n, S * d, scale=3.0)
        x[0, :d] *= 100.0  # streams of one row on different scales: each must use its own RMS
        out = cp.full((n, S * d), cp.nan, cp.float32)
        ops.hc_norm(cp.asarray(x), cp.asarray(w), EPS, n, S, d, out)
        _close(out.get(), hk.ref_hc_norm(x, w, S, EPS), f"hc_norm n={n} d={d}")
        low = _randn(rng, n, 40, scale=4.0)  # 40 columns: n * 40 is rarely a multiple of the block
        dev = cp.asarray(low)
        ops.silu_scale(dev, n, 40, 1.0 / S)
        _close(dev.get(), hk.ref_silu_scale(low, 1.0 / S), f"silu_scale n={n}")


@pytest.mark.parametrize("d", DS)
def test_hc_read(cp, ops, d):
    """With the inject logits and a buffer to clear (a mixer before a sublayer), and without (the final
    mixer); inject logits and the cleared buffer start as garbage."""
    rng = np.random.default_rng(10 + d)
    for n in NS:
        mix, normed = _randn(rng, n, S * d, scale=3.0), _randn(rng, n, S * d)
        logits = _randn(rng, n, S, scale=5.0)
        want_h, want_inj = hk.ref_hc_read(mix, normed, S, logits)
        assert want_inj is not None
        h = cp.full((n, d), cp.nan, cp.float32)
        inj, zero = cp.asarray(logits), cp.full((n, d), cp.nan, cp.float32)
        ops.hc_read(cp.asarray(mix), cp.asarray(normed), n, S, d, h, inj=inj, zero=zero)
        _close(h.get(), want_h, f"hc_read h n={n} d={d}")
        _close(inj.get(), want_inj, f"hc_read inject weights n={n}")
        np.testing.assert_array_equal(zero.get(), np.zeros((n, d), np.float32))
        h = cp.full((n, d), cp.nan, cp.float32)
        ops.hc_read(cp.asarray(mix), cp.asarray(normed), n, S, d, h)
        _close(h.get(), want_h, f"hc_read final n={n} d={d}")


@pytest.mark.parametrize("d", DS)
def test_hc_inject(cp, ops, d):
    rng = np.random.default_rng(20 + d)
    for n in NS:
        streams, y = _randn(rng, n, S * d, scale=2.0), _randn(rng, n, d)
        inj = rng.uniform(0.0, 2.0, (n, S)).astype(np.float32)
        dev = cp.asarray(streams)
        ops.hc_inject(dev, cp.asarray(y), cp.asarray(inj), n, S, d)
        _close(dev.get(), hk.ref_hc_inject(streams, y, inj), f"hc_inject n={n} d={d}")


@pytest.mark.parametrize("d", DS)
def test_ple_gate(cp, ops, d):
    """Normed keys and queries as the layer feeds them; one stream's key all zeros, so its gate is
    sign(0) * sqrt(1e-6) = 0 and its values are halved."""
    rng = np.random.default_rng(30 + d)
    w = np.ones(S * d, np.float32)
    for n in NS:
        key = hk.ref_hc_norm(_randn(rng, n, S * d), w, S, EPS)
        query = hk.ref_hc_norm(_randn(rng, n, S * d), w, S, EPS)
        key[0, d : 2 * d] = 0.0
        value = _randn(rng, n, d, scale=2.0)
        out = cp.full((n, S * d), cp.nan, cp.float32)
        ops.ple_gate(cp.asarray(key), cp.asarray(query), cp.asarray(value), n, S, d, out)
        want = hk.ref_ple_gate(key, query, value, S)
        np.testing.assert_array_equal(want[0, d : 2 * d], value[0] * np.float32(0.5))
        _close(out.get(), want, f"ple_gate n={n} d={d}")


TAB_STRIDE, TAB_COL, N_LAYER, LAYER = 10, 8, 2, 1  # the window of the second PLE layer, at column 8


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("width,dil", [(4, 3), (4, 6), (3, 1), (2, 5)], ids=["w4d3", "w4d6", "w3d1", "w2d5"])
def test_ple_conv(cp, ops, d, width, dil):
    """Three sequences, each window found through its table row (column 8, second layer's offset), starting
    from random windows. One prefill pass of two sequences as the layer launches it (one launch each, the
    pointers offset to its rows): 37 tokens (several token chunks; w4d6's 18-row window is longer than a
    chunk's 16 tokens) and 2 (shorter than the window: most of the new one is the old one shifted); then a
    launch of two 5-token segments, then two decode steps of one row per sequence in one launch. Streams
    and every window buffer (the first layer's part included, never to be touched) are compared after every
    pass."""
    rng = np.random.default_rng(40 + d + 7 * width + dil)
    c, p = S * d, (width - 1) * dil
    weight = _randn(rng, c, width, scale=0.5)  # [C, W], the GGUF layout
    states = [_randn(rng, N_LAYER * p * c) for _ in range(3)]  # [L, P, C] per sequence
    dev_states = [cp.asarray(s) for s in states]
    dev_weight = cp.asarray(weight)

    def table(seqs):
        tab = np.zeros((len(seqs), TAB_STRIDE), np.int64)
        tab[:, TAB_COL] = [dev_states[j].data.ptr for j in seqs]
        return cp.asarray(tab)

    def window(j):
        return states[j][LAYER * p * c : (LAYER + 1) * p * c].reshape(p, c)

    def check(what, got, want):  # every window buffer, whole: the other sequences' and layer's untouched
        _close(got.get(), want, f"{what} streams")
        for j in range(3):
            np.testing.assert_array_equal(dev_states[j].get(), states[j], err_msg=f"{what} window {j}")

    def ref(rows, x, gated, streams, seqs):
        out, new = hk.ref_ple_conv(
            x[rows], gated[rows], streams[rows], [window(j) for j in seqs], weight, dil
        )
        for j, after in zip(seqs, new):
            states[j][LAYER * p * c : (LAYER + 1) * p * c] = after.reshape(-1)
        return out

    def inputs(n):
        return _randn(rng, n, c), _randn(rng, n, c), _randn(rng, n, c, scale=2.0)

    # prefill pass: sequence 0 on rows 0..36, sequence 1 on rows 37..38
    x, gated, streams = inputs(39)
    tab, dx, dg, ds = table([0] * 37 + [1] * 2), cp.asarray(x), cp.asarray(gated), cp.asarray(streams)
    for start, t in ((0, 37), (37, 2)):
        ops.ple_conv(
            width,
            dil,
            ptr(dx, 4 * c * start),
            c,
            t,
            1,
            ptr(tab, 8 * TAB_STRIDE * start),
            TAB_STRIDE,
            TAB_COL,
            dev_weight,
            ptr(dg, 4 * c * start),
            ptr(ds, 4 * c * start),
            state_off=LAYER * p * c,
        )
    want = np.concatenate(
        [ref(slice(0, 37), x, gated, streams, [0]), ref(slice(37, 39), x, gated, streams, [1])]
    )
    check("prefill", ds, want)

    for what, seqs, t in (
        ("two segments", [1, 2], 5),
        ("decode 1", [0, 1, 2], 1),
        ("decode 2", [2, 0, 1], 1),
    ):
        n = len(seqs) * t
        x, gated, streams = inputs(n)
        ds = cp.asarray(streams)
        ops.ple_conv(
            width,
            dil,
            cp.asarray(x),
            c,
            t,
            len(seqs),
            table([j for j in seqs for _ in range(t)]),
            TAB_STRIDE,
            TAB_COL,
            dev_weight,
            cp.asarray(gated),
            ds,
            state_off=LAYER * p * c,
        )
        check(what, ds, ref(slice(0, n), x, gated, streams, seqs))

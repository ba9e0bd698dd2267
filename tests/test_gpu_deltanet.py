"""The Qwen3-Next kernels against their numpy twins: DeltaNet (kernels/deltanet.py) and the two sigmoid
gates (rows.py). They are the same in every kernel generation (tests/conftest.py's
`kernel_generations`), so they run once, on the default one (`ops`). Tolerances as stated per test.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.gpu.kernels import deltanet as dk
from strata.gpu.kernels import rows
from strata.gpu.runtime import ptr

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kd", dk.KEY_DIMS)
def test_deltanet_kernels_match_twins(cp, ops, kd):
    """dn_conv, dn_recur and dn_gated_norm against ref_conv / ref_recur / ref_gated_norm: a 37-token segment
    (prefill: conv in 16-token chunks, the recurrence in order in one launch), a 2-token one (shorter than the
    conv window), then 3 decode rows of 3 sequences in one launch, each finding its own state through its
    table row; both b/a layouts and head orders. fp32 throughout: 1e-5
    of each output's magnitude (the recurrence's sums are reordered, not rounded differently)."""
    rng = np.random.default_rng(kd)
    for n_k, n_v, v, fused, tiled, width in [(2, 4, 40, True, False, 4), (1, 3, kd, False, True, 3)]:
        _deltanet_case(cp, ops, rng, kd, n_k, n_v, v, fused, tiled, width)


def _deltanet_case(cp, ops, rng, kd, n_k, n_v, v, fused, tiled, width) -> None:
    c, inner = (2 * n_k * kd + n_v * v), n_v * v
    ld = c + inner + 2 * n_v
    fused_r = n_v // n_k if fused else 0
    conv_w = (rng.standard_normal((c, width)) * 0.5).astype(np.float32)
    a_coef = -np.exp(rng.standard_normal(n_v) * 0.5).astype(np.float32)
    dt = rng.standard_normal(n_v).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, v).astype(np.float32)
    n_layer, layer = 2, 1  # state of the second DeltaNet layer
    nc, ns = (width - 1) * c, n_v * kd * v
    states = [
        (
            rng.standard_normal(n_layer * nc).astype(np.float32),
            (rng.standard_normal(n_layer * ns) * 0.1).astype(np.float32),
        )
        for _ in range(3)
    ]
    dev_states = [(cp.asarray(a), cp.asarray(b)) for a, b in states]

    def run(mix, seqs, t, count):
        m = cp.asarray(mix)
        y, o = (
            cp.full((mix.shape[0], c), cp.nan, cp.float32),
            cp.full((mix.shape[0], inner), cp.nan, cp.float32),
        )
        tab = cp.asarray(
            np.array(
                [[0, 0, 0, 0, 0, dev_states[j][0].data.ptr, dev_states[j][1].data.ptr] for j in seqs],
                np.int64,
            )
        )
        ops.dn_conv(width, m, ld, c, t, count, tab, 7, layer * nc, cp.asarray(conv_w), y, c)
        ops.dn_recur(
            kd,
            y,
            c,
            ptr(m, 4 * (c + inner)),
            ld,
            t,
            count,
            tab,
            7,
            layer * ns,
            n_k,
            n_v,
            v,
            tiled,
            fused_r,
            cp.asarray(a_coef),
            cp.asarray(dt),
            o,
            inner,
        )
        raw = o.get()
        ops.dn_gated_norm(o, inner, ptr(m, 4 * c), ld, cp.asarray(norm_w), n_v, v, 1e-6, mix.shape[0])
        return y.get(), raw, o.get()

    def ref(mix, j):
        window = states[j][0][layer * nc : (layer + 1) * nc].reshape(width - 1, c)
        ssm = states[j][1][layer * ns : (layer + 1) * ns].reshape(n_v, kd, v)
        y, window = dk.ref_conv(mix, c, window, conv_w)
        o, ssm = dk.ref_recur(y, mix[:, c + inner :], n_k, n_v, kd, v, fused_r, tiled, a_coef, dt, ssm)
        states[j][0][layer * nc : (layer + 1) * nc] = window.reshape(-1)
        states[j][1][layer * ns : (layer + 1) * ns] = ssm.reshape(-1)
        return y, o, dk.ref_gated_norm(o, mix[:, c : c + inner], norm_w, n_v, 1e-6)

    def close(got, want, what):
        err = np.abs(got - want).max() / (np.abs(want).max() + 1e-30)
        assert err < 1e-5, f"{what} (K={kd}, fused={fused}): worst {err:.2e}"

    for t in (37, 2):
        prompt = rng.standard_normal((t, ld)).astype(np.float32)
        got, want = run(prompt, [0], t, 1), ref(prompt, 0)
        for g, w_, what in zip(got, want, ("conv", "recurrence", "gated norm")):
            close(g, w_, f"prefill({t}) {what}")
    for _ in range(2):
        rows_ = rng.standard_normal((3, ld)).astype(np.float32)
        got = run(rows_, [0, 1, 2], 1, 3)
        want = [ref(rows_[j : j + 1], j) for j in range(3)]
        for i, what in enumerate(("conv", "recurrence", "gated norm")):
            close(got[i], np.concatenate([w_[i] for w_ in want]), f"decode {what}")
    for j in range(3):
        close(dev_states[j][0].get(), states[j][0], "conv state")
        close(dev_states[j][1].get(), states[j][1], "recurrent state")


def test_gate_kernels(cp, ops):
    rng = np.random.default_rng(11)
    x, g, y = (rng.standard_normal((6, 200)).astype(np.float32) for _ in range(3))
    s = rng.standard_normal((6, 1)).astype(np.float32)
    dx = cp.asarray(x)
    ops.gate_mul(dx, cp.asarray(g), 6, 200)
    np.testing.assert_allclose(dx.get(), rows.ref_gate_mul(x, g), rtol=1e-6, atol=1e-7)
    dx = cp.asarray(x)
    ops.gated_add(dx, cp.asarray(y), cp.asarray(s), 6, 200)
    np.testing.assert_allclose(dx.get(), rows.ref_gated_add(x, y, s[:, 0]), rtol=1e-6, atol=1e-6)

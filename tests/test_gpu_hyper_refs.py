"""The qwen4exp GPU kernels' numpy twins (strata/gpu/kernels/hyper.py) on the CPU (CI): composed the way
the GPU layer launches them, with the projections as plain numpy products, they give what the CPU blocks
(strata.blocks.hyper, strata.blocks.ple) give, to 1e-5 of each output's magnitude.
"""

from __future__ import annotations

import numpy as np
from dict_weights import DictWeights

from strata.blocks.hyper import HCNames, hc_final, hc_inject, hc_mix
from strata.blocks.ple import PLEParams, PLEState, ple
from strata.gguf.names import X, tensor
from strata.gpu.kernels import hyper as hk

S, D, R, EPS = 4, 16, 8, 1e-6  # streams, hidden size, the mixers' low rank


def _mat(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    return (rng.standard_normal((rows, cols)) * cols**-0.5).astype(np.float32)


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    err = np.abs(got - want).max() / (np.abs(want).max() + 1e-30)
    worst = np.unravel_index(np.abs(got - want).argmax(), want.shape)
    assert err < 1e-5, f"{what}: worst {err:.2e} at {worst}"


def test_mixer_twins_compose_to_hc_mix_and_hc_final() -> None:
    """hc_norm -> down -> silu_scale(1/S) -> up -> hc_read (with the inject projection's logits) == hc_mix,
    and without them == hc_final; hc_inject's twin == hyper.hc_inject."""
    rng = np.random.default_rng(0)
    t = {
        "norm": rng.uniform(0.5, 1.5, S * D).astype(np.float32),
        "down": _mat(rng, R, S * D),
        "up": _mat(rng, S * D, R),
        "inject": _mat(rng, S, S * D),
    }
    w = DictWeights(t)
    streams = (rng.standard_normal((9, S * D)) * 3).astype(np.float32)
    normed = hk.ref_hc_norm(streams, t["norm"], S, EPS)
    low = hk.ref_silu_scale(normed @ t["down"].T, 1.0 / S)
    mix = low @ t["up"].T  # [T, S*D] logits
    h, inject = hk.ref_hc_read(mix, normed, S, normed @ t["inject"].T)
    want_h, want_inject = hc_mix(streams, w, HCNames("norm", "down", "up", "inject"), S, EPS)  # type: ignore[arg-type]
    assert inject is not None
    _close(h, want_h, "hc_read h")
    _close(inject, want_inject, "hc_read inject weights")
    final, none = hk.ref_hc_read(mix, normed, S)
    assert none is None
    _close(final, hc_final(streams, w, HCNames("norm", "down", "up", None), S, EPS), "hc_read final")  # type: ignore[arg-type]
    y = rng.standard_normal((9, D)).astype(np.float32)
    _close(hk.ref_hc_inject(streams, y, inject), hc_inject(streams, y, want_inject), "hc_inject")
    # the fused decode mixer's twin (hc_mix_in + hc_mix_out) gives the same
    fused_h, fused_inject = hk.ref_hc_mix(streams, t["norm"], EPS, S, t["down"], t["up"], t["inject"])
    assert fused_inject is not None
    _close(fused_h, want_h, "ref_hc_mix h")
    _close(fused_inject, want_inject, "ref_hc_mix inject weights")
    fused_final, _ = hk.ref_hc_mix(streams, t["norm"], EPS, S, t["down"], t["up"], None)
    _close(fused_final, final, "ref_hc_mix final")


def _ple_setup(
    rng: np.random.Generator, e_width: int
) -> tuple[PLEParams, DictWeights, dict[str, np.ndarray]]:
    p = PLEParams(
        ngram=3,
        heads_per_ngram=1,
        multipliers=np.ones(3, np.uint64),
        vocab_sizes=np.array([5, 7], np.int64),
        offsets=np.array([0, 5], np.int64),
        eos=0,
        conv_kernel=4,
        n_streams=S,
        d_model=D,
        eps=EPS,
    )
    t = {
        tensor(X.PLE_KEY, 0): _mat(rng, S * D, e_width),
        tensor(X.PLE_VALUE, 0): _mat(rng, D, e_width),
        tensor(X.PLE_NORM_KEY, 0): rng.uniform(0.5, 1.5, S * D).astype(np.float32),
        tensor(X.PLE_NORM_QUERY, 0): rng.uniform(0.5, 1.5, S * D).astype(np.float32),
        tensor(X.PLE_NORM_CONV, 0): rng.uniform(0.5, 1.5, S * D).astype(np.float32),
        # (C, W) as the GGUF reader reports it: row c is channel c's taps, oldest first
        tensor(X.PLE_CONV1D, 0): (rng.standard_normal((S * D, p.conv_kernel)) * 0.5).astype(np.float32),
    }
    return p, DictWeights(t), t


def _twin_ple(
    t: dict[str, np.ndarray], p: PLEParams, streams: np.ndarray, e: np.ndarray, window: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The GPU layer's sequence: projections, hc_norm (key, query), ple_gate, hc_norm (conv), ple_conv."""
    key = hk.ref_hc_norm(e @ t[tensor(X.PLE_KEY, 0)].T, t[tensor(X.PLE_NORM_KEY, 0)], S, EPS)
    value = e @ t[tensor(X.PLE_VALUE, 0)].T
    query = hk.ref_hc_norm(streams, t[tensor(X.PLE_NORM_QUERY, 0)], S, EPS)
    gated = hk.ref_ple_gate(key, query, value, S)
    x = hk.ref_hc_norm(gated, t[tensor(X.PLE_NORM_CONV, 0)], S, EPS)
    out, (after,) = hk.ref_ple_conv(x, gated, streams, [window], t[tensor(X.PLE_CONV1D, 0)], p.ngram)
    return out, after


def test_ple_twins_compose_to_ple_across_prefill_and_decode() -> None:
    """A 7-token prefill then 3 decode tokens through the twins, each continuing the window the last left,
    == streams + ple(...) over all 10 tokens in one call (dilation 3, width 4: a 9-row window, longer than
    a decode step, so each new window is mostly the old one shifted), and the same final window."""
    rng = np.random.default_rng(1)
    p, w, t = _ple_setup(rng, 24)
    streams = (rng.standard_normal((10, S * D)) * 2).astype(np.float32)
    tokens = rng.integers(1, 50, 10)
    e = rng.standard_normal((10, 24)).astype(np.float32)
    st = PLEState.empty(p)
    want = streams + ple(streams, tokens, w, 0, p, st, e)  # type: ignore[arg-type]
    window = np.zeros((p.conv_window, S * D), np.float32)
    got = []
    for a, b in ((0, 7), (7, 8), (8, 9), (9, 10)):
        out, window = _twin_ple(t, p, streams[a:b], e[a:b], window)
        got.append(out)
    _close(np.concatenate(got), want, "streams after the PLE")
    _close(window, st.conv, "conv window")


def test_ple_conv_twin_segments_are_independent() -> None:
    """ref_ple_conv over several segments == one call per segment, each on its own window (the decode
    launch: one row per sequence)."""
    rng = np.random.default_rng(2)
    c, width, dil = S * D, 4, 3
    x, gated, streams = (rng.standard_normal((3, c)).astype(np.float32) for _ in range(3))
    windows = [rng.standard_normal(((width - 1) * dil, c)).astype(np.float32) for _ in range(3)]
    weight = rng.standard_normal((c, width)).astype(np.float32)
    out, new = hk.ref_ple_conv(x, gated, streams, windows, weight, dil)
    for i in range(3):
        one, (after,) = hk.ref_ple_conv(
            x[i : i + 1], gated[i : i + 1], streams[i : i + 1], [windows[i]], weight, dil
        )
        np.testing.assert_array_equal(out[i : i + 1], one)
        np.testing.assert_array_equal(new[i], after)

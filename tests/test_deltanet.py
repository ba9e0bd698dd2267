"""Gated DeltaNet arithmetic: the chunked and recurrent forms agree with each other and with a direct
numpy transcription of transformers' torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule
(itself checked against the torch functions); the rolling conv window equals one full convolution."""

from __future__ import annotations

import numpy as np
import pytest

from strata.blocks.deltanet import (
    causal_conv1d,
    gated_delta_chunked,
    gated_delta_recurrent,
    l2norm,
    normalize_qk,
    softplus,
)

T_, H, K, V = 45, 3, 8, 6


def _inputs(seed: int, t: int = T_) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = np.float32
    return {
        "q": rng.standard_normal((t, H, K)).astype(f),
        "k": rng.standard_normal((t, H, K)).astype(f),
        "v": rng.standard_normal((t, H, V)).astype(f),
        # decays from gentle to strong, as -exp(A_log) * softplus(a + dt_bias) gives
        "g": (-np.exp(rng.standard_normal(H)) * softplus(rng.standard_normal((t, H)).astype(f))).astype(f),
        "beta": (1 / (1 + np.exp(-rng.standard_normal((t, H))))).astype(f),
        "state": (0.3 * rng.standard_normal((H, K, V))).astype(f),
    }


# ----------------------------------------------------------------- transcription of the torch reference
# Line by line from transformers/models/qwen3_next/modeling_qwen3_next.py (batch of one, H = Hk),
# with use_qk_l2norm_in_kernel=True; kept naive on purpose.


def ref_recurrent(q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
    query, key = l2norm(q.transpose(1, 0, 2)), l2norm(k.transpose(1, 0, 2))  # [H, T, K]
    value, beta_, decay = v.transpose(1, 0, 2), beta.T, g.T
    query = query / np.float32(np.sqrt(query.shape[-1]))
    s = state.copy()
    out = np.zeros_like(value)
    for i in range(q.shape[0]):
        s = s * np.exp(decay[:, i])[:, None, None]
        kv_mem = (s * key[:, i][:, :, None]).sum(axis=-2)
        delta = (value[:, i] - kv_mem) * beta_[:, i][:, None]
        s = s + key[:, i][:, :, None] * delta[:, None, :]
        out[:, i] = (s * query[:, i][:, :, None]).sum(axis=-2)
    return out.transpose(1, 0, 2), s


def ref_chunk(q, k, v, g, beta, state, chunk_size=64):  # type: ignore[no-untyped-def]
    query, key = l2norm(q.transpose(1, 0, 2)), l2norm(k.transpose(1, 0, 2))
    value, beta_, decay = v.transpose(1, 0, 2), beta.T, g.T
    query = query * np.float32(query.shape[-1] ** -0.5)
    seq = q.shape[0]
    pad = (chunk_size - seq % chunk_size) % chunk_size
    query, key, value = (np.pad(x, ((0, 0), (0, pad), (0, 0))) for x in (query, key, value))
    beta_, decay = (np.pad(x, ((0, 0), (0, pad))) for x in (beta_, decay))
    n_chunks = (seq + pad) // chunk_size
    v_beta, k_beta = value * beta_[..., None], key * beta_[..., None]
    query, key, k_beta, v_beta = (
        x.reshape(x.shape[0], -1, chunk_size, x.shape[-1]) for x in (query, key, k_beta, v_beta)
    )
    decay = decay.reshape(decay.shape[0], -1, chunk_size)
    upper = np.triu(np.ones((chunk_size, chunk_size), dtype=bool), 1)
    cum = np.cumsum(decay, axis=-1)
    pairwise = np.exp(np.where(upper, -np.inf, cum[..., :, None] - cum[..., None, :]))
    ut = (k_beta @ key.swapaxes(-1, -2)) * pairwise
    intra = (query @ key.swapaxes(-1, -2)) * pairwise
    decayed_k_beta = k_beta * np.exp(cum)[..., None]
    unit = np.tril(ut, -1) + np.eye(chunk_size, dtype=np.float32)  # solve_triangular(unitriangular=True)
    new_values = np.linalg.solve(unit, v_beta)
    k_cumdecay = np.linalg.solve(unit, decayed_k_beta)
    s = state.copy()
    out = np.zeros_like(new_values)
    query = query * np.exp(cum)[..., None]
    key = key * np.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = np.exp(cum[..., -1])[..., None, None]
    for i in range(n_chunks):
        v_new = new_values[:, i] - k_cumdecay[:, i] @ s
        out[:, i] = query[:, i] @ s + intra[:, i] @ v_new
        s = s * chunk_decay[:, i] + key[:, i].swapaxes(-1, -2) @ v_new
    out = out.reshape(out.shape[0], -1, out.shape[-1])[:, :seq]
    return out.transpose(1, 0, 2), s


def _ours(form: str, x: dict[str, np.ndarray], chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    q, k = normalize_qk(x["q"], x["k"])
    if form == "recurrent":
        return gated_delta_recurrent(q, k, x["v"], x["g"], x["beta"], x["state"])
    return gated_delta_chunked(q, k, x["v"], x["g"], x["beta"], x["state"], chunk)


def _close(a: np.ndarray, b: np.ndarray, tol: float, what: str) -> None:
    err = np.abs(a - b)
    idx = np.unravel_index(int(err.argmax()), err.shape)
    assert err.max() <= tol, f"{what}: max |diff| {err.max():.2e} at {idx} (scale {np.abs(b).max():.2f})"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_transcription_matches_torch(seed: int) -> None:
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    x = _inputs(seed)
    t = {n: torch.from_numpy(a)[None] for n, a in x.items() if n != "state"}
    s0 = torch.from_numpy(x["state"])[None]
    kw = {"initial_state": s0, "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    # by name: transformers 5.25 made these module objects, which have no __name__
    for name, ref in (
        ("torch_chunk_gated_delta_rule", ref_chunk),
        ("torch_recurrent_gated_delta_rule", ref_recurrent),
    ):
        fn = getattr(m, name)
        o_t, s_t = fn(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], **kw)
        o_r, s_r = ref(**x)
        _close(o_r, o_t[0].numpy(), 1e-5, f"{name} output")
        _close(s_r, s_t[0].numpy(), 1e-5, f"{name} state")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_ours_matches_reference(seed: int, form: str) -> None:
    x = _inputs(seed)
    o, s = _ours(form, x)
    for ref in (ref_chunk, ref_recurrent):
        o_r, s_r = ref(**x)
        _close(o, o_r, 1e-5, f"{form} vs {ref.__name__} output")
        _close(s, s_r, 1e-5, f"{form} vs {ref.__name__} state")


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_equals_recurrent_any_chunk_and_split(chunk: int) -> None:
    """Chunk size is invisible, and so is splitting the sequence across calls (state hand-over)."""
    x = _inputs(7)
    o_rec, s_rec = _ours("recurrent", x)
    o_chk, s_chk = _ours("chunked", x, chunk)
    _close(o_chk, o_rec, 1e-5, f"chunk {chunk} output")
    _close(s_chk, s_rec, 1e-5, f"chunk {chunk} state")
    q, k = normalize_qk(x["q"], x["k"])
    s = x["state"]
    parts = []
    for a, b in ((0, 13), (13, 14), (14, T_)):  # a call of 13, a single token, the rest
        o, s = gated_delta_chunked(q[a:b], k[a:b], x["v"][a:b], x["g"][a:b], x["beta"][a:b], s, chunk)
        parts.append(o)
    _close(np.concatenate(parts), o_rec, 1e-5, "split calls")
    _close(s, s_rec, 1e-5, "split calls state")


def test_strong_decay_stays_finite() -> None:
    """Decays of e^-60 per token underflow exp(cumsum) within a chunk; results stay finite and equal."""
    x = _inputs(3)
    x["g"] = np.full_like(x["g"], -60.0)
    o_rec, _ = _ours("recurrent", x)
    o_chk, _ = _ours("chunked", x)
    assert np.isfinite(o_chk).all()
    _close(o_chk, o_rec, 1e-5, "strong decay")


@pytest.mark.parametrize("dilation", [1, 3])
def test_conv_rolling_window_equals_full_conv(dilation: int) -> None:
    rng = np.random.default_rng(5)
    t, c, width = 23, 10, 4
    x = rng.standard_normal((t, c)).astype(np.float32)
    w = rng.standard_normal((c, width)).astype(np.float32)
    # direct definition: y[t] = sum_j w[:, j] * x[t - (W-1-j)*d], zero before the start
    xp = np.concatenate([np.zeros(((width - 1) * dilation, c), np.float32), x])
    full = sum(xp[j * dilation : j * dilation + t] * w[:, j] for j in range(width))
    window = np.zeros(((width - 1) * dilation, c), np.float32)
    parts = []
    for a, b in ((0, 1), (1, 8), (8, 9), (9, 10), (10, t)):
        y, window = causal_conv1d(x[a:b], window, w, dilation)
        parts.append(y)
    _close(np.concatenate(parts), full, 1e-6, "rolling conv")
    np.testing.assert_array_equal(window, x[-(width - 1) * dilation :])


def test_conv_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((17, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    want = torch.nn.functional.conv1d(
        torch.from_numpy(x.T)[None], torch.from_numpy(w)[:, None], padding=3, groups=6
    )
    got, _ = causal_conv1d(x, np.zeros((3, 6), np.float32), w)
    _close(got, want[0, :, :17].numpy().T, 1e-5, "conv vs torch")

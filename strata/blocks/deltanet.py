"""Gated DeltaNet arithmetic (Qwen3-Next, Qwen3.5, Qwen4-Exp), numpy float32 reference.

Legend: T = tokens, H = value heads, K = key head dim, V = value head dim, C = conv channels,
W = conv kernel width, L = chunk length.

The recurrent state S [H, K, V] maps keys to values. Per token t, with decay g_t <= 0 (log space)
and learning rate beta_t in (0, 1):
    S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - S^T k_t))^T;   o_t = S^T q_t
`gated_delta_recurrent` runs that loop (decode); `gated_delta_chunked` computes the same thing a
chunk at a time with a few matmuls per chunk (prefill), as transformers' torch_chunk_gated_delta_rule
does. q and k arrive already L2-normalised and q scaled by 1/sqrt(K) (see `normalize_qk`).
"""

from __future__ import annotations

import numpy as np

from strata.blocks.norms import sigmoid, silu

CHUNK = 64  # transformers' chunk size; any size gives the same result up to rounding


def causal_conv1d(
    x: np.ndarray, window: np.ndarray, weight: np.ndarray, dilation: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal convolution over time, continuing from `window`.

    x [T, C] new inputs; window [(W-1)*dilation, C] the inputs before them (zeros at the start);
    weight [C, W], tap W-1 on the newest input. Returns y [T, C] and the window after x.
    """
    n_taps = weight.shape[1]
    t = x.shape[0]
    xp = np.concatenate([window, x.astype(np.float32, copy=False)])  # [(W-1)*d + T, C]
    y = np.zeros((t, x.shape[1]), np.float32)
    for j in range(n_taps):
        y += xp[j * dilation : j * dilation + t] * weight[:, j]  # [T, C]
    return y, xp[xp.shape[0] - window.shape[0] :].copy()


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis (FLA's and transformers' form, eps inside)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(eps))


def normalize_qk(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """L2-normalise q and k [T, H, K] and scale q by 1/sqrt(K), as use_qk_l2norm_in_kernel does."""
    scale = np.float32(q.shape[-1] ** -0.5)
    return l2norm(q) * scale, l2norm(k)


def gated_delta_recurrent(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Token-by-token form. q, k [T, H, K]; v [T, H, V]; g, beta [T, H]; state [H, K, V].

    Returns o [T, H, V] and the new state.
    """
    s = state.astype(np.float32, copy=True)
    out = np.empty(v.shape, np.float32)
    for t in range(q.shape[0]):
        s *= np.exp(g[t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", s, k[t])  # [H, V]: what the state predicts for k_t
        delta = (v[t] - kv_mem) * beta[t][:, None]  # [H, V]
        s += k[t][:, :, None] * delta[:, None, :]  # rank-1 write per head
        out[t] = np.einsum("hkv,hk->hv", s, q[t])
    return out, s


def gated_delta_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk: int = CHUNK,
) -> tuple[np.ndarray, np.ndarray]:
    """Chunked (UT-transform) form; same arguments and results as `gated_delta_recurrent`.

    Within a chunk the delta-rule writes are condensed by solving (I + A) X = B, A the strictly lower
    triangle of beta_i k_i.k_j exp(G_i - G_j) (G the in-chunk cumulative decay); chunks then
    hand the state on one after another. The tail is padded with k = v = beta = g = 0, which
    leaves the state untouched.
    """
    t_all, n_head = q.shape[:2]
    dv = v.shape[-1]
    size = max(1, min(chunk, t_all))
    pad = (-t_all) % size
    qh, kh, vh = (np.pad(a, ((0, pad), (0, 0), (0, 0))).transpose(1, 0, 2) for a in (q, k, v))  # [H, T', *]
    gh, bh = (np.pad(a, ((0, pad), (0, 0))).T for a in (g, beta))  # [H, T']
    lower = np.tril(np.ones((size, size), dtype=bool))  # causal within the chunk, diagonal included
    s = state.astype(np.float32, copy=True)
    out = np.empty((n_head, t_all + pad, dv), np.float32)
    for c0 in range(0, t_all + pad, size):
        sl = slice(c0, c0 + size)
        qc, kc, vc, bc = qh[:, sl], kh[:, sl], vh[:, sl], bh[:, sl]  # [H, L, K|V], [H, L]
        cum = np.cumsum(gh[:, sl], axis=1)  # [H, L] log of the decay since the chunk start
        diff = np.where(lower, cum[:, :, None] - cum[:, None, :], -np.inf)  # [H, L, L]
        decay = np.exp(diff).astype(np.float32)  # exp(G_i - G_j) for j <= i, else 0
        k_beta = kc * bc[:, :, None]
        a = np.matmul(k_beta, kc.transpose(0, 2, 1)) * decay  # [H, L, L]
        rhs = np.concatenate([vc * bc[:, :, None], k_beta * np.exp(cum)[:, :, None]], axis=2)  # [H, L, V+K]
        x = _unit_lower_solve(a, rhs)
        u, w = x[:, :, :dv], x[:, :, dv:]  # new values; decayed keys that read the old state
        attn = np.matmul(qc, kc.transpose(0, 2, 1)) * decay  # [H, L, L] intra-chunk q.k
        v_new = u - np.matmul(w, s)  # [H, L, V] the part of u the old state does not already predict
        q_dec = qc * np.exp(cum)[:, :, None]
        out[:, sl] = np.matmul(q_dec, s) + np.matmul(attn, v_new)
        k_dec = kc * np.exp(cum[:, -1:] - cum)[:, :, None]  # decay from each token to the chunk end
        s = s * np.exp(cum[:, -1])[:, None, None] + np.matmul(k_dec.transpose(0, 2, 1), v_new)
    return out[:, :t_all].transpose(1, 0, 2).copy(), s


def _unit_lower_solve(a: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve (I + strictly_lower(a)) x = rhs by forward substitution; a [H, L, L], rhs [H, L, N]."""
    x = rhs.astype(np.float32, copy=True)
    for i in range(1, a.shape[1]):
        x[:, i] -= np.einsum("hj,hjn->hn", a[:, i, :i], x[:, :i])
    return x


def gated_delta(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The form transformers picks: recurrent for a single token, chunked otherwise."""
    if q.shape[0] == 1:
        return gated_delta_recurrent(q, k, v, g, beta, state)
    return gated_delta_chunked(q, k, v, g, beta, state)


def gated_rms_norm(
    x: np.ndarray, weight: np.ndarray, gate: np.ndarray, eps: float, act: str = "silu"
) -> np.ndarray:
    """RMSNorm of x over the last axis times weight, then times act(gate) (norm before gate)."""
    x = x.astype(np.float32, copy=False)
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return normed * weight * (silu(gate) if act == "silu" else sigmoid(gate))


def softplus(x: np.ndarray) -> np.ndarray:
    # torch's softplus returns x itself above 20; log1p(exp(x)) equals x there to float32 precision.
    with np.errstate(over="ignore"):
        return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))).astype(np.float32)

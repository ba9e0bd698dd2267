"""Causal grouped-query attention over a KV cache (numpy reference; float32 throughout)."""

from __future__ import annotations

import numpy as np

from strata.blocks.norms import softmax

# Queries are processed in blocks so a long prefill never materialises a T x S score matrix.
Q_BLOCK = 256


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """q [T, H, D] are the last T positions of a sequence whose keys/values are k, v [S, KV, D].

    Query t sits at position S - T + t and sees keys 0..S-T+t. Returns [T, H, Dv].
    """
    t_all, n_head, d = q.shape
    s_all, n_kv, dv = v.shape
    group = n_head // n_kv
    out = np.empty((t_all, n_head, dv), np.float32)
    # Strided views, not copies: BLAS takes them as transposed operands, and copying the whole
    # cache per layer per token would cost more than the attention itself at long context.
    kt = k.transpose(1, 2, 0)  # [KV, D, S]
    vt = v.transpose(1, 0, 2)  # [KV, S, Dv]
    if t_all == 1:  # a decode step: its one query sees every key, so no mask (same products)
        qb = q.reshape(1, n_kv, group, d).transpose(1, 2, 0, 3)  # [KV, G, 1, D]
        scores = np.matmul(qb, kt[:, None, :, :]) * np.float32(scale)  # [KV, G, 1, S]
        ob = np.matmul(softmax(scores, axis=-1), vt[:, None, :, :])  # [KV, G, 1, Dv]
        return ob.reshape(1, n_head, dv)
    for t0 in range(0, t_all, Q_BLOCK):
        t1 = min(t_all, t0 + Q_BLOCK)
        qb = q[t0:t1].reshape(t1 - t0, n_kv, group, d).transpose(1, 2, 0, 3)  # [KV, G, Tb, D]
        last = s_all - t_all + t1  # keys beyond the block's last query are never visible
        scores = np.matmul(qb, kt[:, None, :, :last]) * np.float32(scale)  # [KV, G, Tb, S']
        qpos = np.arange(s_all - t_all + t0, s_all - t_all + t1)[:, None]
        visible = np.arange(last)[None, :] <= qpos  # [Tb, S']
        scores = np.where(visible, scores, np.float32(-np.inf))
        probs = softmax(scores, axis=-1)
        ob = np.matmul(probs, vt[:, None, :last, :])  # [KV, G, Tb, Dv]
        out[t0:t1] = ob.transpose(2, 0, 1, 3).reshape(t1 - t0, n_head, dv)
    return out

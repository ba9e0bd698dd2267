"""Gated full attention (Qwen3-Next, Qwen3.5, Qwen4-Exp): q_proj yields a query and an output gate
per head, q/k get zero-centred RMSNorm (the converter already added the 1), partial NEOX RoPE,
GQA over the KV cache, and the output is multiplied by sigmoid(gate) before o_proj.

ATTN_Q rows are per head [query (hd) | gate (hd)], HF's layout, which the converter keeps.
An optional boolean mask [T, S] restricts each query to a subset of the causal keys (QSA).
"""

from __future__ import annotations

import numpy as np

from strata.blocks.attention import attend
from strata.blocks.norms import rms_norm, sigmoid, softmax
from strata.blocks.rope import Rope
from strata.blocks.self_attn import AttnParams
from strata.gguf.names import T, tensor
from strata.runtime.kvcache import KVCache
from strata.runtime.weights import WeightStore


def gated_attention(
    h: np.ndarray,
    w: WeightStore,
    layer: int,
    p: AttnParams,
    rope: Rope,
    cos_sin: tuple[np.ndarray, np.ndarray],
    kv: KVCache,
    select: np.ndarray | None = None,
) -> np.ndarray:
    """h [T, D] -> [T, D]. `select` [T, S] (S = keys after this call) limits what each query sees."""
    t, hd = h.shape[0], p.head_dim
    qg = w.matmul(h, tensor(T.ATTN_Q, layer)).reshape(t, p.n_head, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(t, p.n_head * hd)
    k = w.matmul(h, tensor(T.ATTN_K, layer)).reshape(t, p.n_kv, hd)
    v = w.matmul(h, tensor(T.ATTN_V, layer)).reshape(t, p.n_kv, hd)
    q = rope.apply(rms_norm(q, w.vector(tensor(T.ATTN_Q_NORM, layer)), p.eps), *cos_sin)
    k = rope.apply(rms_norm(k, w.vector(tensor(T.ATTN_K_NORM, layer)), p.eps), *cos_sin)
    keys, values = kv.append(layer, k, v)
    if select is None:
        a = attend(q, keys, values, p.scale)  # [T, H, hd]
    else:
        a = attend_masked(q, keys, values, p.scale, select)
    a = a.reshape(t, p.n_head * hd) * sigmoid(gate)
    return w.matmul(a, tensor(T.ATTN_OUT, layer))


def attend_masked(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray) -> np.ndarray:
    """GQA attention where query t sees exactly the keys with mask[t] True.

    q [T, H, D]; k, v [S, KV, D]; mask [T, S] (every row has at least one True). Returns [T, H, D].
    """
    t, n_head, d = q.shape
    n_kv = k.shape[1]
    group = n_head // n_kv
    qg = q.reshape(t, n_kv, group, d).transpose(1, 2, 0, 3)  # [KV, G, T, D]
    scores = np.matmul(qg, k.transpose(1, 2, 0)[:, None]) * np.float32(scale)  # [KV, G, T, S]
    probs = softmax(np.where(mask, scores, np.float32(-np.inf)), axis=-1)
    out = np.matmul(probs, v.transpose(1, 0, 2)[:, None])  # [KV, G, T, D]
    return out.transpose(2, 0, 1, 3).reshape(t, n_head, d)

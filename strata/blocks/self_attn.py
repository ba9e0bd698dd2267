"""The attention sublayer of a decoder layer: projections, optional q/k norms, RoPE, GQA, output.

Architectures differ only in parameters (head sizes, rope layout, whether q/k are normed), so
they share this one function and keep their own files for what really differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.blocks.attention import attend
from strata.blocks.norms import rms_norm
from strata.blocks.rope import Rope
from strata.gguf.names import T, tensor
from strata.kvcache import KVCache
from strata.weights import WeightStore


@dataclass(frozen=True, slots=True)
class AttnParams:
    n_head: int
    n_kv: int
    head_dim: int
    eps: float
    qk_norm: bool  # Qwen3: per-head RMSNorm on q and k before RoPE

    @property
    def scale(self) -> float:
        return 1.0 / float(np.sqrt(self.head_dim))


def self_attention(
    h: np.ndarray,
    w: WeightStore,
    layer: int,
    p: AttnParams,
    rope: Rope,
    cos_sin: tuple[np.ndarray, np.ndarray],
    segments: list[tuple[int, int, KVCache]],
) -> np.ndarray:
    """h [N, D] (already normed) -> attention output projected back to [N, D].

    The rows of h belong to several sequences: segments[j] = (start, end, that sequence's cache).
    Projections run once over all rows; each sequence attends only to its own cache.
    """
    t = h.shape[0]
    q = w.matmul(h, tensor(T.ATTN_Q, layer)).reshape(t, p.n_head, p.head_dim)
    k = w.matmul(h, tensor(T.ATTN_K, layer)).reshape(t, p.n_kv, p.head_dim)
    v = w.matmul(h, tensor(T.ATTN_V, layer)).reshape(t, p.n_kv, p.head_dim)
    if p.qk_norm:
        q = rms_norm(q, w.vector(tensor(T.ATTN_Q_NORM, layer)), p.eps)
        k = rms_norm(k, w.vector(tensor(T.ATTN_K_NORM, layer)), p.eps)
    q = rope.apply(q, *cos_sin)
    k = rope.apply(k, *cos_sin)
    a = np.empty_like(q)  # [N, H, D]
    for start, end, kv in segments:
        keys, values = kv.append(layer, k[start:end], v[start:end])
        a[start:end] = attend(q[start:end], keys, values, p.scale)
    return w.matmul(a.reshape(t, p.n_head * p.head_dim), tensor(T.ATTN_OUT, layer))

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
from strata.runtime.kvcache import KVCache
from strata.runtime.weights import WeightStore


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


@dataclass(frozen=True, slots=True)
class AttnNames:
    """One layer's attention tensor names, built once at load rather than formatted per token."""

    layer: int
    qkv: tuple[str, str, str]
    out: str
    q_norm: str
    k_norm: str

    @classmethod
    def of(cls, layer: int) -> AttnNames:
        return cls(
            layer=layer,
            qkv=(tensor(T.ATTN_Q, layer), tensor(T.ATTN_K, layer), tensor(T.ATTN_V, layer)),
            out=tensor(T.ATTN_OUT, layer),
            q_norm=tensor(T.ATTN_Q_NORM, layer),
            k_norm=tensor(T.ATTN_K_NORM, layer),
        )


def self_attention(
    h: np.ndarray,
    w: WeightStore,
    names: AttnNames,
    p: AttnParams,
    rope: Rope,
    cos_sin: tuple[np.ndarray, np.ndarray],
    segments: list[tuple[int, int, KVCache]],
) -> np.ndarray:
    """h [N, D] (already normed) -> attention output projected back to [N, D].

    The rows of h belong to several sequences: segments[j] = (start, end, that sequence's cache).
    Projections run once over all rows; each sequence attends only to its own cache.
    """
    t, nh, nkv = h.shape[0], p.n_head, p.n_kv
    qkv = w.matmul_cat(h, names.qkv).reshape(t, nh + 2 * nkv, p.head_dim)  # [N, H + 2 KV, hd]
    v = qkv[:, nh + nkv :]
    if p.qk_norm:
        q = rope.apply(rms_norm(qkv[:, :nh], w.vector(names.q_norm), p.eps), *cos_sin)
        k = rope.apply(rms_norm(qkv[:, nh : nh + nkv], w.vector(names.k_norm), p.eps), *cos_sin)
    else:  # q and k heads rotate alike: one pass over both
        qk = rope.apply(qkv[:, : nh + nkv], *cos_sin)  # [N, H + KV, hd]
        q, k = qk[:, :nh], qk[:, nh:]
    if len(segments) == 1:  # one sequence (every solo decode step): no scatter into a copy
        _, _, kv = segments[0]
        keys, values = kv.append(names.layer, k, v)
        a = attend(q, keys, values, p.scale)
    else:
        a = np.empty(q.shape, np.float32)  # [N, H, D]
        for start, end, kv in segments:
            keys, values = kv.append(names.layer, k[start:end], v[start:end])
            a[start:end] = attend(q[start:end], keys, values, p.scale)
    return w.matmul(a.reshape(t, nh * p.head_dim), names.out)

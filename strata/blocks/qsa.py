"""QSA sparse attention selection (Qwen4-Exp), following transformers' Qwen4ExpTextQSAIndexer.

The indexer has its own query heads and one key head. Token keys are averaged over consecutive,
complete blocks of `ratio` tokens, then RMSNormed and rotated at the block's first position: these
compressed keys are computed once per block and kept in the sequence state. A query at position P
sees the blocks that are complete by P; each block scores sum_h relu(q_h . k_block) / sqrt(d), the
best budget/ratio blocks are kept, and so are the tokens of the incomplete block at the end (P's
own, always). Attention then runs over exactly those tokens.

Ties in the block scores (possible only at exact zeros of the relu sum) are broken towards the
earlier block; torch.topk breaks them in an unspecified order.

Legend: T = new tokens, S = all tokens, B = complete blocks, Hi = indexer heads, d = indexer head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from strata.blocks.norms import rms_norm
from strata.blocks.rope import Rope
from strata.gguf.names import X, tensor
from strata.runtime.weights import WeightStore

Tables = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # positions [n] -> cos, sin [n, rot/2]


@dataclass(frozen=True, slots=True)
class QSAParams:
    n_heads: int
    head_dim: int
    budget: int  # tokens taken from complete blocks, at most
    ratio: int  # tokens per compressed block
    eps: float

    @property
    def top_blocks(self) -> int:
        return self.budget // self.ratio


@dataclass(slots=True)
class QSAState:
    """Compressed keys of every complete block [B, d], and raw keys of the incomplete one [< ratio, d]."""

    blocks: np.ndarray
    tail: np.ndarray

    @classmethod
    def empty(cls, p: QSAParams) -> QSAState:
        return cls(np.zeros((0, p.head_dim), np.float32), np.zeros((0, p.head_dim), np.float32))

    def copy(self) -> QSAState:
        return QSAState(self.blocks.copy(), self.tail.copy())

    def nbytes(self) -> int:
        return self.blocks.nbytes + self.tail.nbytes


def _compress(
    h: np.ndarray, w: WeightStore, layer: int, p: QSAParams, rope: Rope, tables: Tables, st: QSAState
) -> None:
    """Fold the new tokens' raw index keys into st: every block they complete gets its compressed key."""
    raw = np.concatenate([st.tail, w.matmul(h, tensor(X.INDEXER_K_PROJ, layer))])  # [m + T, d]
    n_new = raw.shape[0] // p.ratio
    if n_new:
        pooled = raw[: n_new * p.ratio].reshape(n_new, p.ratio, p.head_dim).mean(axis=1)  # [b, d]
        normed = rms_norm(pooled, w.vector(tensor(X.INDEXER_K_NORM, layer)), p.eps)
        starts = (st.blocks.shape[0] + np.arange(n_new)) * p.ratio
        keys = rope.apply(normed[:, None, :], *tables(starts))[:, 0]  # rotated at the block's first token
        st.blocks = np.concatenate([st.blocks, keys])
    st.tail = raw[n_new * p.ratio :].copy()


def qsa_select(
    h: np.ndarray,
    w: WeightStore,
    layer: int,
    p: QSAParams,
    rope: Rope,
    tables: Tables,
    cos_sin: tuple[np.ndarray, np.ndarray],
    st: QSAState,
    n_past: int,
) -> np.ndarray:
    """Boolean mask [T, S] (S = n_past + T) of the keys each new query attends to; advances `st`."""
    t = h.shape[0]
    q = w.matmul(h, tensor(X.INDEXER_Q_PROJ, layer)).reshape(t, p.n_heads, p.head_dim)
    q = rope.apply(rms_norm(q, w.vector(tensor(X.INDEXER_Q_NORM, layer)), p.eps), *cos_sin)
    _compress(h, w, layer, p, rope, tables, st)
    s_all = n_past + t
    pos = np.arange(n_past, s_all)  # [T] absolute query positions
    complete = (pos + 1) // p.ratio  # [T] blocks complete by each query (its own token included)
    n_blocks = st.blocks.shape[0]
    scores = np.matmul(q, st.blocks.T)  # [T, Hi, B]
    scores = np.maximum(scores, np.float32(0)).sum(axis=1) / np.float32(np.sqrt(p.head_dim))  # [T, B]
    visible = np.arange(n_blocks)[None, :] < complete[:, None]  # [T, B]
    ranked = np.argsort(np.where(visible, -scores, np.inf), axis=1, kind="stable")  # best first
    k = np.minimum(complete, p.top_blocks)  # [T] blocks kept per query
    chosen = np.zeros((t, n_blocks), dtype=bool)
    keep = np.arange(n_blocks)[None, :] < k[:, None]
    np.put_along_axis(chosen, ranked, keep, axis=1)
    mask = np.zeros((t, s_all), dtype=bool)
    mask[:, : n_blocks * p.ratio] = np.repeat(chosen, p.ratio, axis=1)
    key_pos = np.arange(s_all)[None, :]
    mask |= (key_pos >= (complete * p.ratio)[:, None]) & (key_pos <= pos[:, None])  # the incomplete block
    return mask

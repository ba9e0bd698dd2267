"""Mixture-of-experts routing and dispatch.

Legend: T = tokens, D = hidden size, E = experts, A = active experts per token.
Tokens are grouped by expert so each expert's weights are touched once per forward call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from strata.blocks.norms import silu, softmax

if TYPE_CHECKING:
    from strata.weights import WeightStore

ExpertFn = Callable[[int, np.ndarray], np.ndarray]  # (expert id, x [n, D]) -> [n, D]


def route_softmax_topk(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over all experts, keep the top k. Returns ids [T, A] and weights [T, A]."""
    probs = softmax(logits.astype(np.float32), axis=-1)  # [T, E]
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # [T, A]
    w = np.take_along_axis(probs, ids, axis=-1)  # [T, A]
    if normalize:
        w = w / np.sum(w, axis=-1, keepdims=True)
    return ids, w.astype(np.float32)


def dispatch(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, expert: ExpertFn) -> np.ndarray:
    """sum_a weights[t, a] * expert(ids[t, a], x[t]) for every token, one call per used expert."""
    t, a = ids.shape
    flat = ids.reshape(-1)  # [T*A]
    order = np.argsort(flat, kind="stable")
    sorted_ids = flat[order]
    bounds = np.flatnonzero(np.diff(sorted_ids)) + 1
    out = np.zeros_like(x, dtype=np.float32)
    for group in np.split(order, bounds):
        if group.size == 0:
            continue
        e = int(flat[group[0]])
        tok = group // a  # token index of each (token, slot) pair routed to e
        y = expert(e, x[tok])  # [n, D]
        # top-k picks distinct experts, so a token appears at most once per group: += is safe.
        out[tok] += y * weights.reshape(-1)[group][:, None]
    return out


def swiglu_experts(h: np.ndarray, ids: np.ndarray, weights: np.ndarray, w: WeightStore, gate: str, up: str,
                   down: str) -> np.ndarray:
    """sum_a weights[t, a] * down_e(silu(gate_e h_t) * up_e h_t) over the routed experts (3-D tensors
    [E, out, in]): fused on the JIT expert pool when the store has one and it reads these types (each
    used expert's weights read once per call), else one numpy dispatch per used expert."""
    if w.jit is not None:
        out = w.jit.moe(h, ids, weights, gate, up, down)
        if out is not None:
            return out

    def expert(e: int, xs: np.ndarray) -> np.ndarray:  # xs [n, D] -> [n, D]
        return w.matmul(silu(w.matmul(xs, gate, e)) * w.matmul(xs, up, e), down, e)

    return dispatch(h, ids, weights, expert)

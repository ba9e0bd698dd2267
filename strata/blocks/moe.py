"""Mixture-of-experts routing and dispatch.

Legend: T = tokens, D = hidden size, E = experts, A = active experts per token.
Tokens are grouped by expert so each expert's weights are touched once per forward call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from strata.blocks.norms import rms_norm, silu, softmax
from strata.gguf.names import T, tensor

if TYPE_CHECKING:
    from strata.runtime.weights import WeightStore
    from strata.tiers.slots import ExpertCache

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
    _t, a = ids.shape
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


def swiglu_experts(
    h: np.ndarray, ids: np.ndarray, weights: np.ndarray, w: WeightStore, gate: str, up: str, down: str
) -> np.ndarray:
    """sum_a weights[t, a] * down_e(silu(gate_e h_t) * up_e h_t) over the routed experts (3-D tensors
    [E, out, in]): fused on the JIT expert pool when the store has one and it reads these types (each
    used expert's weights read once per call), else one numpy dispatch per used expert. With expert
    tiers (w.tiers), each expert is read where the cache says: a slot or the arena."""
    if w.tiers is not None:
        return _tiered(h, ids, weights, w, w.tiers, gate)
    if w.jit is not None:
        out = w.jit.moe(h, ids, weights, gate, up, down)
        if out is not None:
            return out

    def expert(e: int, xs: np.ndarray) -> np.ndarray:  # xs [n, D] -> [n, D]
        return w.matmul(silu(w.matmul(xs, gate, e)) * w.matmul(xs, up, e), down, e)

    return dispatch(h, ids, weights, expert)


def lookahead(x: np.ndarray, w: WeightStore, layer: int, norm: str | None, eps: float, top_k: int) -> None:
    """At `layer`'s start, before its mixer (the expert tiers' --prefetch on the CPU, tiers/lookahead.py): its
    router on the input x [T, D], normed with the layer's FFN norm (norm None: hyper-connections, whose x is
    the mixer's mixed input, a router input as it stands), predicts its experts, and the cache stages the
    predicted misses. A no-op unless the pass predicts (decode rows, tiers with misses, K > 0)."""
    cache = w.tiers
    if cache is None or not cache.predicting or layer not in cache.layer_of:
        return
    h = x if norm is None else rms_norm(x, w.vector(norm), eps)
    pred, _ = route_softmax_topk(w.matmul(h, tensor(T.FFN_GATE_INP, layer)), top_k, False)  # [T, A]
    cache.stage_ahead(cache.layer_of[layer], pred)


def _tiered(
    h: np.ndarray, ids: np.ndarray, weights: np.ndarray, w: WeightStore, cache: ExpertCache, gate: str
) -> np.ndarray:
    """The routed experts of one MoE layer, each read at the address the expert cache gives for it (a staged
    copy when the lookahead staged the expert)."""
    li = cache.by_name[gate]
    table = cache.layer_table(li)  # [P, E]
    cache.count_rows(li, ids)
    cache.settle_ahead(li, ids)
    parts = cache.layout.layers[li].parts
    if w.jit is not None:
        ws = [w.jit.experts(p.name, table[j]) for j, p in enumerate(parts)]
        if all(x is not None for x in ws):
            return w.jit.pool.moe(h, ids, weights, *ws)  # type: ignore[arg-type]

    def matrix(j: int, e: int) -> np.ndarray:  # [rows, row_bytes] at the expert's address
        p = parts[j]
        buf = (ctypes.c_uint8 * p.nbytes).from_address(int(table[j, e]))
        return np.frombuffer(buf, np.uint8).reshape(p.rows, p.row_bytes)

    def expert(e: int, xs: np.ndarray) -> np.ndarray:  # xs [n, D] -> [n, D]
        g, u = (w.matmul_raw(xs, matrix(j, e), parts[j].qtype) for j in (0, 1))
        return w.matmul_raw(silu(g) * u, matrix(2, e), parts[2].qtype)

    return dispatch(h, ids, weights, expert)

"""MoE FFN with a shared expert behind a sigmoid gate (Qwen2-MoE lineage: Qwen3-Next, Qwen4-Exp).

Legend: T = tokens, D = hidden size, E = experts, A = active experts per token.
out = sum_a w[t, a] * expert_a(x_t) + sigmoid(x_t . g) * shared(x_t); routing is a softmax over
all experts, top-k, optionally renormalised over the k kept.
"""

from __future__ import annotations

import numpy as np

from strata.blocks.moe import route_softmax_topk, swiglu_experts
from strata.blocks.norms import sigmoid, silu
from strata.gguf.names import T, tensor
from strata.runtime.weights import WeightStore


def routed_experts(h: np.ndarray, w: WeightStore, layer: int, top_k: int, normalize: bool) -> np.ndarray:
    """The routed part: softmax top-k over ffn_gate_inp, SwiGLU experts in 3-D tensors [E, out, in]."""
    router = w.matmul(h, tensor(T.FFN_GATE_INP, layer))  # [T, E]
    ids, weights = route_softmax_topk(router, top_k, normalize)  # [T, A] x2
    gate_n, up_n, down_n = (tensor(k, layer) for k in (T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP))
    return swiglu_experts(h, ids, weights, w, gate_n, up_n, down_n)


def shared_expert(h: np.ndarray, w: WeightStore, layer: int) -> np.ndarray:
    """The always-on expert, scaled per token by sigmoid(h . ffn_gate_inp_shexp)."""
    act = silu(w.matmul(h, tensor(T.FFN_GATE_SHEXP, layer))) * w.matmul(
        h, tensor(T.FFN_UP_SHEXP, layer)
    )  # [T, F]
    gate = sigmoid(w.matmul(h, tensor(T.FFN_GATE_INP_SHEXP, layer)))  # [T, 1]
    return w.matmul(act, tensor(T.FFN_DOWN_SHEXP, layer)) * gate


def moe_shared(h: np.ndarray, w: WeightStore, layer: int, top_k: int, normalize: bool) -> np.ndarray:
    """h [T, D] (normed) -> routed experts + gated shared expert [T, D]."""
    return routed_experts(h, w, layer, top_k, normalize) + shared_expert(h, w, layer)

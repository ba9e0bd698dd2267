"""Qwen3-MoE (Qwen3-30B-A3B): Qwen3 attention (per-head q/k RMSNorm, NEOX RoPE) and a
softmax top-k MoE FFN in every layer.

Experts live in 3-D GGUF tensors [E, out, in]; tokens are grouped by expert so each expert's
slice is dequantized and multiplied once per forward call.
"""

from __future__ import annotations

import numpy as np

from strata.blocks.moe import lookahead, route_softmax_topk, swiglu_experts
from strata.blocks.rope import RopeStyle
from strata.gguf import GGUFFile
from strata.gguf.names import Keys, T, tensor
from strata.models.base import DecoderLM, Structure, register, require
from strata.runtime.weights import WeightStore


@register("qwen3moe")
class Qwen3Moe(DecoderLM):
    structure = Structure(moe=True)
    rope_style = RopeStyle.NEOX
    qk_norm = True

    def __init__(self, gguf: GGUFFile, weights: WeightStore) -> None:
        super().__init__(gguf, weights)
        self.n_expert = int(require(gguf, Keys.EXPERT_COUNT))  # type: ignore[arg-type]
        self.top_k = int(require(gguf, Keys.EXPERT_USED_COUNT))  # type: ignore[arg-type]
        # The converter does not write norm_topk_prob for qwen3moe and llama.cpp always
        # renormalises; Qwen3 configs ship True. A file may still say otherwise explicitly.
        self.norm_topk = bool(gguf.arch_get(Keys.EXPERT_WEIGHTS_NORM, True))
        # per layer: router, then the gate/up/down expert tensors (built once, not per token)
        kinds = (T.FFN_GATE_INP, T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP)
        self.moe_names = [tuple(tensor(k, i) for k in kinds) for i in range(self.params.n_layer)]

    def ffn(self, layer: int, h: np.ndarray) -> np.ndarray:
        w = self.w
        router_n, gate_n, up_n, down_n = self.moe_names[layer]
        router = w.matmul(h, router_n)  # [T, E]
        ids, weights = route_softmax_topk(router, self.top_k, self.norm_topk)  # [T, A] x2
        return swiglu_experts(h, ids, weights, w, gate_n, up_n, down_n)

    def ahead(self, layer: int, x: np.ndarray) -> None:
        lookahead(x, self.w, layer, self.names[layer].ffn_norm, self.params.eps, self.top_k)

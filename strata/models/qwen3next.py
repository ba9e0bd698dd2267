"""Qwen3-Next (Qwen3-Next-80B-A3B): a hybrid decoder. Most layers mix tokens with a Gated DeltaNet
(linear attention with a fixed-size recurrent state); every few layers use gated full attention.
Every layer's FFN is a softmax top-k MoE plus a sigmoid-gated shared expert.

    x += mixer(rmsnorm(x));  x += moe(rmsnorm(x))        mixer = DeltaNet | gated attention

All RMSNorms are zero-centred in HF (x_hat * (1 + w)); the converter stored 1 + w, so they are
plain RMSNorms here. Which layers are recurrent comes from `attention.recurrent_layers`.
"""

from __future__ import annotations

import numpy as np

from strata.blocks.gated_attn import gated_attention
from strata.blocks.linear_attn import DeltaNetParams, DeltaNetState, HeadOrder, deltanet
from strata.blocks.moe import lookahead
from strata.blocks.norms import rms_norm
from strata.blocks.rope import RopeStyle
from strata.blocks.shared_moe import moe_shared
from strata.errors import GGUFError
from strata.gguf import GGUFFile
from strata.gguf.names import Keys, T, tensor
from strata.models.base import DecoderParams, Model, Structure, register, require
from strata.runtime.passes import forward_pass
from strata.runtime.state import LayerState, SequenceState
from strata.runtime.weights import WeightStore


def require_int(g: GGUFFile, suffix: str) -> int:
    """An integer hyperparameter that must be present."""
    v = require(g, suffix)
    if not isinstance(v, (int, np.integer)):
        raise GGUFError(g.path, f"{g.architecture}.{suffix} is {v!r}, expected an integer")
    return int(v)


def recurrent_layers(g: GGUFFile, n_layer: int) -> list[bool]:
    """Per layer: True for DeltaNet, False for attention (the converter's recurrent_layers array)."""
    flags = g.arch_get(Keys.RECURRENT_LAYERS)
    if flags is None:
        raise GGUFError(g.path, f"missing metadata key {g.architecture}.{Keys.RECURRENT_LAYERS}")
    flags = [bool(f) for f in flags][:n_layer]
    if len(flags) != n_layer:
        raise GGUFError(g.path, f"{Keys.RECURRENT_LAYERS} has {len(flags)} entries for {n_layer} layers")
    return flags


@register("qwen3next")
class Qwen3Next(Model):
    structure = Structure(moe=True, hybrid=True)

    def __init__(self, gguf: GGUFFile, weights: WeightStore) -> None:
        self.gguf, self.w = gguf, weights
        self.params = p = DecoderParams.from_gguf(gguf, RopeStyle.NEOX, qk_norm=True)
        self.linear = recurrent_layers(gguf, p.n_layer)
        self.dn = DeltaNetParams.from_gguf(gguf, HeadOrder.GROUPED, fused_ba=True, eps=p.eps)
        self.top_k = require_int(gguf, Keys.EXPERT_USED_COUNT)
        # Not written by the converter; Qwen3-Next ships norm_topk_prob=True and llama.cpp assumes it.
        self.norm_topk = bool(gguf.arch_get(Keys.EXPERT_WEIGHTS_NORM, True))
        out = tensor(T.OUTPUT)
        self.head = out if weights.has(out) else tensor(T.TOKEN_EMBD)

    def new_state(self) -> SequenceState:
        attn = [i for i, lin in enumerate(self.linear) if not lin]
        layers: dict[tuple[str, int], LayerState] = {
            ("deltanet", i): DeltaNetState.empty(self.dn) for i, lin in enumerate(self.linear) if lin
        }
        return SequenceState(self.new_kv(attn), layers=layers)

    def forward(self, tokens: np.ndarray, state: SequenceState, all_logits: bool = True) -> np.ndarray:
        p, w = self.params, self.w
        tokens = np.asarray(tokens, dtype=np.int64)
        x = w.rows(tensor(T.TOKEN_EMBD), tokens)  # [T, D]
        cos_sin = p.rope.tables(np.arange(state.n_past, state.n_past + len(tokens)))
        with forward_pass(w, [state], [len(tokens)]):
            for i in range(p.n_layer):
                lookahead(x, w, i, tensor(T.ATTN_POST_NORM, i), p.eps, self.top_k)  # post-norm: the FFN's
                h = rms_norm(x, w.vector(tensor(T.ATTN_NORM, i)), p.eps)
                if self.linear[i]:
                    x = x + deltanet(h, w, i, self.dn, state.layer("deltanet", i, DeltaNetState))
                else:
                    x = x + gated_attention(h, w, i, p.attn, p.rope, cos_sin, state.kv)
                h = rms_norm(x, w.vector(tensor(T.ATTN_POST_NORM, i)), p.eps)
                x = x + moe_shared(h, w, i, self.top_k, self.norm_topk)
        state.n_past += len(tokens)
        state.tokens.extend(int(t) for t in tokens)
        if not all_logits:
            x = x[-1:]
        x = rms_norm(x, w.vector(tensor(T.OUTPUT_NORM)), p.eps)
        return w.matmul(x, self.head)

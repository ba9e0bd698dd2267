"""Llama (SmolLM2 and friends): RMSNorm, GQA attention with RoPE, SwiGLU MLP.

llama.cpp's converter permutes q/k rows for this architecture, so RoPE rotates adjacent pairs.
"""

from __future__ import annotations

import numpy as np

from strata.blocks.norms import silu
from strata.blocks.rope import RopeStyle
from strata.gguf.names import T, tensor
from strata.models.base import DecoderLM, register


@register("llama")
class Llama(DecoderLM):
    rope_style = RopeStyle.NORM
    qk_norm = False

    def ffn(self, layer: int, h: np.ndarray) -> np.ndarray:
        w = self.w
        gate = w.matmul(h, tensor(T.FFN_GATE, layer))  # [T, F]
        up = w.matmul(h, tensor(T.FFN_UP, layer))  # [T, F]
        return w.matmul(silu(gate) * up, tensor(T.FFN_DOWN, layer))  # [T, D]

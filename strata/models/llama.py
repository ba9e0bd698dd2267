"""Llama (SmolLM2 and friends): RMSNorm, GQA attention with RoPE, SwiGLU MLP.

llama.cpp's converter permutes q/k rows for this architecture, so RoPE rotates adjacent pairs.
"""

from __future__ import annotations

import numpy as np

from strata.blocks.norms import silu
from strata.blocks.rope import RopeStyle
from strata.models.base import DecoderLM, Structure, register


@register("llama")
class Llama(DecoderLM):
    structure = Structure()
    rope_style = RopeStyle.NORM
    qk_norm = False

    def ffn(self, layer: int, h: np.ndarray) -> np.ndarray:
        w, names = self.w, self.names[layer]
        gate_up = w.matmul_cat(h, names.gate_up)  # [T, 2F]: gate then up
        f = gate_up.shape[1] // 2
        return w.matmul(silu(gate_up[:, :f]) * gate_up[:, f:], names.down)  # [T, D]

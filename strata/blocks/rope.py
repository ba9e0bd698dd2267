"""Rotary position embeddings.

GGUF files use two layouts. NORM rotates adjacent pairs (x[2i], x[2i+1]): llama's converter
permutes the q/k rows so this matches HF. NEOX rotates halves (x[i], x[i + n_rot/2]): Qwen
models keep HF's layout. Partial rotary (n_rot < head_dim) leaves the tail dimensions as they are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class RopeStyle(enum.Enum):
    NORM = "norm"
    NEOX = "neox"


@dataclass(frozen=True, slots=True)
class Rope:
    n_rot: int
    base: float
    style: RopeStyle
    scale: float = 1.0  # linear position scaling (rope.scaling.type == linear)

    def tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin shaped [T, n_rot/2] for integer positions [T]."""
        half = np.arange(0, self.n_rot, 2, dtype=np.int64).astype(np.float32) / np.float32(self.n_rot)
        inv_freq = np.float32(1.0) / (np.float32(self.base) ** half)  # [n_rot/2]
        pos = positions.astype(np.float32) / np.float32(self.scale)
        ang = pos[:, None] * inv_freq[None, :]  # [T, n_rot/2]
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def apply(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate x [T, H, D] in place-free fashion; returns a new array."""
        r = self.n_rot
        out = np.empty(x.shape, x.dtype)
        if r < x.shape[-1]:
            out[..., r:] = x[..., r:]
        c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, r/2]
        if self.style is RopeStyle.NEOX:
            a, b, oa, ob = x[..., : r // 2], x[..., r // 2 : r], out[..., : r // 2], out[..., r // 2 : r]
        else:
            a, b, oa, ob = x[..., 0:r:2], x[..., 1:r:2], out[..., 0:r:2], out[..., 1:r:2]
        if x.dtype != np.float32:  # e.g. fp16 in: compute in float32, round once on the way out
            oa[...] = a * c - b * s
            ob[...] = b * c + a * s
            return out
        # written straight into out's halves, rounding exactly as a * c - b * s and b * c + a * s
        np.multiply(a, c, out=oa)
        oa -= b * s
        np.multiply(b, c, out=ob)
        ob += a * s
        return out

"""Interleaved multimodal RoPE (Qwen3.5, Qwen4-Exp).

Each rotary frequency i takes its position from one of three axes (time, height, width). The
interleaved layout cycles t, h, w over the frequencies: i % 3 == 1 is h while i < 3 * sections[1],
i % 3 == 2 is w while i < 3 * sections[2], every other frequency is t. Text tokens carry the same
position on all three axes, which makes this exactly plain (NEOX, partial) RoPE; image tokens differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.blocks.rope import Rope


@dataclass(frozen=True, slots=True)
class MRope:
    rope: Rope  # n_rot, base and NEOX layout shared with plain RoPE
    sections: tuple[int, int, int]  # frequencies per t, h, w axis; they sum to n_rot / 2

    def axis_of_frequency(self) -> np.ndarray:
        """[n_rot/2] axis index (0 = t, 1 = h, 2 = w) for every rotary frequency."""
        axis = np.zeros(self.rope.n_rot // 2, np.int64)
        for dim in (1, 2):
            axis[dim : 3 * self.sections[dim] : 3] = dim
        return axis

    def tables_thw(self, pos_thw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [T, n_rot/2] for per-axis positions pos_thw [3, T]."""
        per_axis = [self.rope.tables(pos_thw[a]) for a in range(3)]  # 3 x ([T, n/2], [T, n/2])
        pick = self.axis_of_frequency()[None, :]  # [1, n/2]
        cos = np.choose(np.broadcast_to(pick, per_axis[0][0].shape), [c for c, _ in per_axis])
        sin = np.choose(np.broadcast_to(pick, per_axis[0][1].shape), [s for _, s in per_axis])
        return cos.astype(np.float32), sin.astype(np.float32)

    def tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Text tokens: the same position on every axis."""
        return self.tables_thw(np.broadcast_to(positions, (3, len(positions))))

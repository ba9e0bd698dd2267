"""Hyper-connections (Qwen4-Exp): the residual is n parallel streams [T, n*D] instead of one.

Before each sublayer a gated mixer reads the streams: a grouped RMSNorm (one norm per stream), a
low-rank bottleneck that produces a sigmoid weight per stream and channel, and the mean over the
weighted streams as the sublayer input. After the sublayer its output is injected back into every
stream with a per-token, per-stream weight 2*sigmoid(.) from the same normed streams. The final
mixer (no injection) turns the streams into the vector the LM head reads, in place of a final norm.

Legend: T = tokens, n = streams (hc_count), D = hidden size, R = low rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.blocks.norms import sigmoid, silu
from strata.runtime.weights import WeightStore


@dataclass(frozen=True, slots=True)
class HCNames:
    """Tensor names of one mixer; `inject` is None for the final mixer before the head."""

    norm: str
    down: str
    up: str
    inject: str | None


def grouped_rms_norm(x: np.ndarray, weight: np.ndarray, groups: int, eps: float) -> np.ndarray:
    """RMSNorm of each of `groups` equal slices of the last axis, then times weight (full width)."""
    shape = x.shape
    parts = x.reshape(*shape[:-1], groups, shape[-1] // groups).astype(np.float32, copy=False)
    normed = parts / np.sqrt(np.mean(parts * parts, axis=-1, keepdims=True) + np.float32(eps))
    return normed.reshape(shape) * weight


def _read(
    stream: np.ndarray, w: WeightStore, names: HCNames, n: int, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """The mixed input [T, D] and the normed streams [T, n*D] it came from."""
    t, nd = stream.shape
    normed = grouped_rms_norm(stream, w.vector(names.norm), n, eps)  # [T, n*D]
    low = silu(w.matmul(normed, names.down) / np.float32(n))  # [T, R]
    mix = sigmoid(w.matmul(low, names.up)).reshape(t, n, nd // n)  # [T, n, D]
    return np.mean(mix * normed.reshape(t, n, nd // n), axis=1), normed  # [T, D]


def hc_mix(
    stream: np.ndarray, w: WeightStore, names: HCNames, n: int, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Before a sublayer: stream [T, n*D] -> its input [T, D] and the injection weights [T, n]."""
    assert names.inject is not None
    mixed, normed = _read(stream, w, names, n, eps)
    inject = np.float32(2.0) * sigmoid(w.matmul(normed, names.inject) / np.float32(n))  # [T, n]
    return mixed, inject


def hc_final(stream: np.ndarray, w: WeightStore, names: HCNames, n: int, eps: float) -> np.ndarray:
    """The final mixer: stream [T, n*D] -> what the LM head reads [T, D]."""
    return _read(stream, w, names, n, eps)[0]


def hc_inject(stream: np.ndarray, out: np.ndarray, inject: np.ndarray) -> np.ndarray:
    """stream [T, n*D] + out [T, D] weighted per stream by inject [T, n]."""
    return stream + (inject[:, :, None] * out[:, None, :]).reshape(inject.shape[0], -1)

"""Normalisation and activation functions shared by every architecture (numpy, float32)."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight."""
    x = x.astype(np.float32, copy=False)
    # np.mean without its Python wrapper: the same float32 pairwise sum, then / n (exact either way)
    var = np.add.reduce(x * x, axis=-1, keepdims=True)  # [..., 1]
    var /= np.float32(x.shape[-1])
    var += np.float32(eps)
    return (x / np.sqrt(var, out=var)) * weight


def silu(x: np.ndarray) -> np.ndarray:
    # exp(-x) overflows to inf for x < -88; x / inf is the right limit (0), so the warning is noise.
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.maximum.reduce(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    e /= np.add.reduce(e, axis=axis, keepdims=True)
    return e

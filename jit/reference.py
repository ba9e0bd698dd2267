"""numpy twins of the JIT kernels: what each one must compute, written the obvious way.

The kernels promise results within float32 rounding of these (they sum in a different order);
tests/test_jit_kernels.py holds them together and reports the worst element.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from strata.blocks.norms import silu
from strata.quants import dequantize


def matmul(raw: np.ndarray, qtype: T | int, x: np.ndarray) -> np.ndarray:
    """x [N, C] . dequantize(raw)^T in float64 (the exact answer the kernels approximate)."""
    w = dequantize(raw, qtype).astype(np.float64)  # [R, C]
    return x.astype(np.float64) @ w.T


def abs_products(raw: np.ndarray, qtype: T | int, x: np.ndarray) -> np.ndarray:
    """|x| . |W|^T: the scale a float32 dot product's rounding error is proportional to."""
    w = np.abs(dequantize(raw, qtype).astype(np.float64))
    return np.abs(x.astype(np.float64)) @ w.T


def expert(
    x: np.ndarray, gate: tuple[np.ndarray, int], up: tuple[np.ndarray, int], down: tuple[np.ndarray, int]
) -> np.ndarray:
    """One SwiGLU expert on x [n, D]: down(silu(gate(x)) * up(x)) -> [n, D], float32 numpy."""
    g = x @ dequantize(*gate).T
    u = x @ dequantize(*up).T
    return (silu(g) * u) @ dequantize(*down).T

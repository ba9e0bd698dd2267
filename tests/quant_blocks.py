"""Random but valid quantized blocks for dequantization tests and benchmarks.

Random bytes are a valid encoding for every ggml block type except in their float scale fields:
a random fp16/bf16 there is often NaN or inf, which then swamps the whole block. So we draw random
bytes and overwrite those fields with finite, sanely sized values (including zeros and subnormals,
which exercise the rounding paths that matter for bit-exactness).
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T

# The MoE kernels' (gate, up, down) weight types the GPU tests build every kernel generation with: the
# K-quant mix of real files and all-Q8_0.
MOE_TYPES = [(int(T.Q4_K), int(T.Q4_K), int(T.Q6_K)), (int(T.Q8_0), int(T.Q8_0), int(T.Q8_0))]

# Byte offsets of fp16 scale fields inside one block (see ggml-common.h block_* structs).
F16_FIELDS: dict[T, tuple[int, ...]] = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ2_XXS: (0,),
    T.IQ2_XS: (0,),
    T.IQ2_S: (0,),
    T.IQ3_XXS: (0,),
    T.IQ3_S: (0,),
    T.IQ1_S: (0,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
    T.TQ1_0: (52,),
    T.TQ2_0: (64,),
}


def sane_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite fp16 values spread over many exponents, with some zeros and subnormals."""
    mag = rng.uniform(0.5, 1.0, n) * np.exp2(rng.integers(-20, 6, n))
    vals = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    special = np.array([0.0, -0.0, 6e-8, -3e-6, 1.0], dtype=np.float16)
    pick = rng.random(n) < 0.05
    vals[pick] = rng.choice(special, int(pick.sum()))
    return vals


def random_blocks(qtype: T, n_rows: int, n_cols: int, seed: int = 0) -> np.ndarray:
    """uint8 [n_rows, row_bytes] of valid random blocks of `qtype`."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    assert n_cols % block == 0
    n_blocks = n_rows * (n_cols // block)
    if qtype == T.F32:
        return rng.standard_normal(n_rows * n_cols).astype(np.float32).view(np.uint8).reshape(n_rows, -1)
    if qtype == T.F16:
        return sane_f16(rng, n_rows * n_cols).view(np.uint8).reshape(n_rows, -1)
    if qtype == T.BF16:
        f = sane_f16(rng, n_rows * n_cols).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_rows, -1)
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, ()):
        blocks[:, off : off + 2] = sane_f16(rng, n_blocks).view(np.uint8).reshape(-1, 2)
    if qtype == T.MXFP4:
        # e8m0 exponent: keep well inside float32 so nothing overflows to inf.
        blocks[:, 0] = rng.integers(90, 160, n_blocks, dtype=np.uint8)
    if qtype == T.IQ1_M:
        # The fp16 super-scale is scattered over the top nibbles of the four uint16 scale words.
        d = sane_f16(rng, n_blocks).view(np.uint16)
        sc = blocks[:, 48:56].copy().view(np.uint16)  # [n_blocks, 4]
        for i, shift in enumerate((0, 4, 8, 12)):  # word i's top nibble holds d bits 4i..4i+3
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((d >> shift) & 0xF) << 12)
        blocks[:, 48:56] = sc.view(np.uint8)
    return blocks.reshape(n_rows, -1)

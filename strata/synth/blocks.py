"""Pools of random but valid ggml blocks whose dequantized values have a chosen std and mean ~0.

Random bytes are a valid encoding of every block type here except its fp16 scale fields (a random
fp16 is often NaN/inf or absurdly large). So a block is random bytes with those fields rewritten:
- types without a min (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K, IQ4_NL, IQ4_XS) get a random-sign d, so
  values are symmetric around zero;
- types with a min get one that centres the block: Q4_1/Q5_1 m = -d * (qmax / 2); Q2_K, Q4_K and
  Q5_K store sub-block scale == sub-block min with dmin = d * (qmax / 2), so y = d*sc*(q - qmax/2).
Then every scale field is multiplied by one factor so the pool's measured std hits the target
(values are linear in the scale fields). A tensor is written as slices of the pool at random
block offsets, so writing costs a memcpy and never a Python loop per block.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

from strata.quants import dequantize

POOL_BYTES = 8 << 20  # per (type, std); tensors are tiled from it in SEGMENT_BYTES slices
CALIBRATION_BLOCKS = 4096

# fp16 d at these byte offsets; the sign is random (no min field to centre).
_SIGNED_D: dict[Q, int] = {
    Q.Q4_0: 0,
    Q.Q5_0: 0,
    Q.Q8_0: 0,
    Q.Q3_K: 108,
    Q.Q6_K: 208,
    Q.IQ4_NL: 0,
    Q.IQ4_XS: 0,
}
# (d offset, min offset, qmax / 2): Q4_1/Q5_1 store m (an offset), the K-quants dmin (a scale).
_WITH_MIN: dict[Q, tuple[int, int, float]] = {
    Q.Q4_1: (0, 2, 7.5),
    Q.Q5_1: (0, 2, 15.5),
    Q.Q2_K: (80, 82, 1.5),
    Q.Q4_K: (0, 2, 7.5),
    Q.Q5_K: (0, 2, 15.5),
}
_FLOATS: dict[Q, np.dtype] = {
    Q.F32: np.dtype(np.float32),
    Q.F16: np.dtype(np.float16),
    Q.BF16: np.dtype(np.uint16),
}
SUPPORTED: frozenset[Q] = frozenset(_SIGNED_D) | frozenset(_WITH_MIN) | frozenset(_FLOATS)


def _put_f16(blocks: np.ndarray, off: int, values: np.ndarray) -> None:
    blocks[:, off : off + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _pack_k4_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12-byte field from 6-bit scales and mins [n, 8] (inverse of get_scale_min_k4)."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)
    return out


def _centre_mins(blocks: np.ndarray, qtype: Q, d: np.ndarray, rng: np.random.Generator) -> None:
    d_off, min_off, half = _WITH_MIN[qtype]
    n = blocks.shape[0]
    _put_f16(blocks, d_off, d)
    if qtype in (Q.Q4_1, Q.Q5_1):
        _put_f16(blocks, min_off, -half * d)
        return
    _put_f16(blocks, min_off, half * d)
    if qtype == Q.Q2_K:  # 16 bytes at 0: low nibble scale, high nibble min
        sc = rng.integers(8, 16, (n, 16), dtype=np.uint8)
        blocks[:, 0:16] = sc | (sc << 4)
    else:  # Q4_K / Q5_K: 8 sub-blocks, 6-bit scale and min packed in 12 bytes at 4
        sc = rng.integers(32, 64, (n, 8), dtype=np.uint8)
        blocks[:, 4:16] = _pack_k4_scales(sc, sc)


def _raw_blocks(qtype: Q, n: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [n, type_size] valid blocks of roughly unit-free scale (calibrated afterwards)."""
    if qtype in _FLOATS:
        x = rng.standard_normal(n, dtype=np.float32)
        if qtype == Q.BF16:
            return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n, -1)
        return x.astype(_FLOATS[qtype]).view(np.uint8).reshape(n, -1)
    size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    d = rng.uniform(0.6, 1.0, n).astype(np.float32)  # per-block scale spread, as real blocks have
    if qtype in _SIGNED_D:
        _put_f16(blocks, _SIGNED_D[qtype], d * rng.choice(np.array([-1.0, 1.0], np.float32), n))
    else:
        _centre_mins(blocks, qtype, d, rng)
    return blocks


def _rescale(blocks: np.ndarray, qtype: Q, factor: float) -> None:
    """Multiply every scale field (and so every dequantized value) by `factor`, in place."""
    if qtype in _FLOATS:
        f = blocks.view(_FLOATS[qtype]) if qtype != Q.BF16 else None
        if f is not None:
            f *= f.dtype.type(factor)
        else:
            x = (blocks.view(np.uint16).astype(np.uint32) << 16).view(np.float32) * np.float32(factor)
            blocks.view(np.uint16)[:] = (x.view(np.uint32) >> 16).astype(np.uint16)
        return
    offsets = (_SIGNED_D[qtype],) if qtype in _SIGNED_D else _WITH_MIN[qtype][:2]
    for off in offsets:
        v = blocks[:, off : off + 2].copy().view(np.float16).astype(np.float32)
        _put_f16(blocks, off, v * np.float32(factor))


def measured(blocks: np.ndarray, qtype: Q) -> tuple[float, float]:
    """(mean, std) of the dequantized values of `blocks` [n, type_size]."""
    y = dequantize(blocks[:CALIBRATION_BLOCKS], qtype)
    return float(y.mean()), float(y.std())


@cache
def pool(qtype: Q, std: float, seed: int = 0) -> np.ndarray:
    """uint8 [n_blocks, type_size] of valid blocks whose values have std `std` and mean ~0.

    Cached per process (a few MiB each); treat it as read-only.
    """
    if qtype not in SUPPORTED:
        raise ValueError(f"no synthetic blocks for {qtype.name}")
    size = GGML_QUANT_SIZES[qtype][1]
    blocks = _raw_blocks(qtype, POOL_BYTES // size, np.random.default_rng([seed, int(qtype)]))
    for _ in range(2):  # the second pass absorbs fp16 rounding of the rescaled fields
        _rescale(blocks, qtype, std / measured(blocks, qtype)[1])
    blocks.setflags(write=False)
    return blocks

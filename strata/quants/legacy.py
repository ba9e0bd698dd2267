"""The 32-element "legacy" formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (ggml-quants.c dequantize_row_q*).

Block layouts (bytes): Q4_0 d|qs[16], Q4_1 d|m|qs[16], Q5_0 d|qh[4]|qs[16], Q5_1 d|m|qh[4]|qs[16],
Q8_0 d|qs[32]. Element j < 16 is the low nibble of qs[j], element j + 16 the high nibble; Q5 adds
bit j of the little-endian uint32 qh as bit 4 of element j.
"""

from __future__ import annotations

import numpy as np

from strata.quants._common import as_int8, compact, f16_at, scaled, split_nibbles


def _q5_codes(blocks: np.ndarray, qh: int) -> np.ndarray:
    """5-bit codes uint8 [n, 32] from the qh bit field at byte `qh` and the 16 nibble bytes after it."""
    q = split_nibbles(blocks, qh + 4, qh + 20).reshape(-1, 32)
    hi = np.unpackbits(compact(blocks, qh, qh + 4).reshape(-1), bitorder="little")  # bit j: elem j
    np.multiply(hi, np.uint8(16), out=hi)  # << 4; numpy's uint8 << has no SIMD loop
    np.bitwise_or(q, hi.reshape(q.shape), out=q)
    return q


def deq_q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    q = as_int8(split_nibbles(blocks, 2, 18), 8)  # [n, 1, 2, 16] in -8..7
    scaled(q, f16_at(blocks, 0), out, 32)  # exact: 11-bit mantissa x 4-bit int


def deq_q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # (d * q) + m as the reference; x - (-m) is x + m exactly in IEEE, zeros' signs included
    scaled(split_nibbles(blocks, 4, 20), f16_at(blocks, 0), out, 32, -f16_at(blocks, 2))


def deq_q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    q = as_int8(_q5_codes(blocks, 2), 16)  # [n, 32] in -16..15
    scaled(q, f16_at(blocks, 0), out, 32)


def deq_q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    scaled(_q5_codes(blocks, 4), f16_at(blocks, 0), out, 32, -f16_at(blocks, 2))  # as Q4_1


def deq_q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    scaled(compact(blocks, 2, 34).view(np.int8), f16_at(blocks, 0), out, 32)

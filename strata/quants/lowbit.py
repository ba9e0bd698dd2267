"""Sub-2-bit formats: IQ1_S, IQ1_M (codebook + shifted delta) and TQ1_0, TQ2_0 (ternary).

IQ1 values are dl * (grid + delta) with grid in {-1, 0, 1} and delta = +-1/8; `iq_tables.iq1_words`
stores 8 * (grid + delta) as exact int8, and we fold the 1/8 into the scale (also exact), so the
products equal the reference's bit for bit.
"""

from __future__ import annotations

import numpy as np

from strata.quants import iq_tables as tables
from strata.quants._common import as_int8, f16_at, fields, scaled

_EIGHTH = np.float32(0.125)


def deq_iq1_s(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | qs[32] (low 8 bits of 11-bit grid rows) | qh[8] uint16 per 32 elements:
    #         bits 3l..3l+2 = row l's top bits, 12..14 = scale, 15 = delta sign
    n = blocks.shape[0]
    qh = blocks[:, 34:50].view(np.uint16)  # [n, 8]
    top = (qh[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7  # [n, 8, 4]
    codes = blocks[:, 2:34].reshape(n, 8, 4) | (top << 8) | ((qh[:, :, None] >> 15) << 11)
    vals = np.take(tables.iq1_words(), codes, mode="clip").view(np.int8)  # [n, 8, 32]
    dl = f16_at(blocks, 0) * (2 * ((qh >> 12) & 7) + 1)  # [n, 8], the reference's expression
    scaled(vals, dl * _EIGHTH, out, 32)


def _iq1m_scale(sc: np.ndarray) -> np.ndarray:
    """IQ1_M's fp16 super-scale is split over the top nibbles of its four uint16 scale words."""
    top = sc >> 12  # [n, 4]
    bits = top[:, 0] | (top[:, 1] << 4) | (top[:, 2] << 8) | (top[:, 3] << 12)
    return bits.astype(np.uint16).view(np.float16).astype(np.float32).reshape(-1, 1)


def deq_iq1_m(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: qs[32] | qh[16] (a nibble per row: 3 top bits + delta sign) | scales 4 x uint16
    #         (3 bits per 16 elements, the fp16 super-scale in the top nibbles)
    n = blocks.shape[0]
    sc = blocks[:, 48:56].view(np.uint16)  # [n, 4]
    qh = blocks[:, 32:48]
    hq = np.stack([qh & 0x0F, qh >> 4], axis=-1).reshape(n, 32).astype(np.uint16)  # per grid row
    codes = blocks[:, :32] | ((hq & 7) << 8) | ((hq >> 3) << 11)  # [n, 32]
    vals = np.take(tables.iq1_words(), codes, mode="clip").view(np.int8)  # [n, 256]
    s3 = (sc[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7  # [n, 4, 4]
    dl = _iq1m_scale(sc) * (2 * s3.reshape(n, 16) + 1)  # [n, 16], the reference's expression
    scaled(vals, dl * _EIGHTH, out, 16)


def deq_tq2_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: qs[64] (2-bit codes, field i of byte 32h + l is element 128h + 32i + l) | d
    n = blocks.shape[0]
    q = as_int8(fields(blocks[:, :64].reshape(n, 2, 32), 2, 4), 1)  # [n, 2, 4, 32] in -1..1
    scaled(q, f16_at(blocks, 64), out, 256)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def deq_tq1_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: qs[48] (5 base-3 digits per byte as a fixed-point fraction) | qh[4] (4 digits) | d.
    # Multiplying by 3^i (mod 256) rotates digit i to the top; (x * 3) >> 8 then reads it off.
    n = blocks.shape[0]
    q = np.empty((n, 256), np.uint8)
    np.multiply(blocks[:, None, :32], _POW3[:, None], out=q[:, :160].reshape(n, 5, 32))
    np.multiply(blocks[:, None, 32:48], _POW3[:, None], out=q[:, 160:240].reshape(n, 5, 16))
    np.multiply(blocks[:, None, 48:52], _POW3[:4, None], out=q[:, 240:].reshape(n, 4, 4))
    digits = ((q.astype(np.uint16) * 3) >> 8).astype(np.uint8)
    scaled(as_int8(digits, 1), f16_at(blocks, 52), out, 256)

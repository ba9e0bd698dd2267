"""K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element super-blocks, ggml-quants.c dequantize_row_q*_K).

Shared element order: a super-block is `h` halves of 128 (for the 2-bit formats) or 4 groups of 64
(for the 4/5-bit ones); inside, field i of byte l is element 32 * i + l of the group. Scales are per
16 (Q2_K, Q3_K, Q6_K) or per 32 (Q4_K, Q5_K) elements.
"""

from __future__ import annotations

import numpy as np

from strata.quants._common import as_int8, compact, f16_at, fields, scaled, split_nibbles

# A byte pattern repeated in every lane of a uint32 word: masks that act on 4 packed bytes at once.
_M03, _M0F, _M30, _M3F = (np.uint32(b * 0x01010101) for b in (0x03, 0x0F, 0x30, 0x3F))


def _d_dmin(blocks: np.ndarray, off: int) -> np.ndarray:
    """The adjacent fp16 pair (d, dmin) at byte `off` as float32 [n, 2, 1]."""
    return blocks[:, off : off + 4].view(np.float16).astype(np.float32)[:, :, None]


def _scale_min_k4(blocks: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K 12-byte scale field (bytes 4-16) -> uint8 [n, 2, 8]: 6-bit (scales, mins).

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for
    mins; bytes 8-11 the low nibbles of scales 4-7 (low half) and mins 4-7 (high half). We work on
    the three 4-byte groups as uint32 words, masking every byte lane (get_scale_min_k4, vectorized).
    """
    w = compact(blocks, 4, 16).view(np.uint32)  # [n, 3] = (scale word, min word, shared low nibbles)
    out = np.empty((w.shape[0], 2, 2), np.uint32)  # [n, scales|mins, entries 0-3|4-7]
    np.bitwise_and(w[:, :2], _M3F, out=out[:, :, 0])
    nib = (w[:, 2:] >> np.array([0, 4], dtype=np.uint32)) & _M0F  # [n, 2]: low nibbles for each
    np.bitwise_or(nib, (w[:, :2] >> 2) & _M30, out=out[:, :, 1])
    return out.view(np.uint8).reshape(-1, 2, 8)


def _scales_q3(packed: np.ndarray) -> np.ndarray:
    """Q3_K 12-byte scale field -> 16 signed scales as float32 [n, 16] (6-bit value minus 32).

    Bytes 0-7: low nibbles of scales 0-7 (low half) and 8-15 (high half); bytes 8-11: 2-bit highs,
    scale 4i + j's highs at bits 2i of byte 8 + j.
    """
    w = packed.view(np.uint32)  # [n, 3]
    low4 = (w[:, None, :2] >> np.array([[0], [4]], dtype=np.uint32)) & _M0F  # [n, 2, 2] words
    high2 = (w[:, 2:] >> np.array([0, 2, 4, 6], dtype=np.uint32)) & _M03  # [n, 4] words
    codes = low4.view(np.uint8).reshape(-1, 16) | (high2.view(np.uint8) * np.uint8(16))  # 0..63
    return as_int8(codes, 32).astype(np.float32)


def deq_q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: scales[16] (low nibble: scale, high: min) | qs[64] | d | dmin
    n = blocks.shape[0]
    sc = compact(blocks, 0, 16)
    codes = np.stack([sc & np.uint8(0x0F), sc >> np.uint8(4)], axis=1)  # [n, 2, 16]
    dlml = _d_dmin(blocks, 80) * codes.astype(np.float32)  # [n, 2, 16] = (d * sc, dmin * m), exact
    q = fields(blocks[:, 16:80].reshape(n, 2, 32), 2, 4)  # [n, 2 halves, 4, 32] in 0..3
    scaled(q, dlml[:, 0], out, 16, dlml[:, 1])


def deq_q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: hmask[32] | qs[64] | scales[12] | d. hmask bit j of byte l is the high bit of element
    # 32 * j + l; a *clear* bit means "subtract 4".
    n = blocks.shape[0]
    dl = f16_at(blocks, 108) * _scales_q3(compact(blocks, 96, 108))  # [n, 16], exact (11 + 6 bits)
    low = fields(blocks[:, 32:96].reshape(n, 2, 32), 2, 4)  # [n, 2, 4, 32]
    high = fields(blocks[:, None, :32], 1, 8)  # [n, 1, 8, 32]: same element order
    np.multiply(high, np.uint8(4), out=high)  # << 2; numpy's uint8 << has no SIMD loop
    np.bitwise_or(low, high.reshape(low.shape), out=low)
    scaled(as_int8(low, 4), dl, out, 16)  # codes -4..3


def deq_q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | dmin | scales[12] | qs[128] (4 groups of 32 bytes: low nibbles, then high nibbles)
    dlml = _d_dmin(blocks, 0) * _scale_min_k4(blocks).astype(np.float32)  # [n, 2, 8], exact
    q = split_nibbles(blocks, 16, 144, groups=4)  # [n, group, nibble, 32]: sub-block 2 * group + nibble
    scaled(q, dlml[:, 0], out, 32, dlml[:, 1])


def deq_q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | dmin | scales[12] | qh[32] | qs[128]; qh bit j of byte l is bit 4 of element 32j + l
    dlml = _d_dmin(blocks, 0) * _scale_min_k4(blocks).astype(np.float32)  # [n, 2, 8], exact
    q = split_nibbles(blocks, 48, 176, groups=4)  # [n, group, nibble, 32]
    high = fields(blocks[:, None, 16:48], 1, 8)  # [n, 1, 8, 32]: same element order
    np.multiply(high, np.uint8(16), out=high)  # << 4
    np.bitwise_or(q, high.reshape(q.shape), out=q)
    scaled(q, dlml[:, 0], out, 32, dlml[:, 1])


def deq_q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: ql[128] | qh[64] | scales[16] int8 | d. Per half h: ql[64h + 32 * (s % 2) + l] holds
    # the low 4 bits of element 128h + 32s + l (nibble s // 2), qh[32h + l] bits 2s..2s+1 its top 2.
    n = blocks.shape[0]
    dsc = f16_at(blocks, 208) * compact(blocks, 192, 208).view(np.int8).astype(np.float32)  # [n, 16]
    low = split_nibbles(blocks, 0, 128, groups=2)  # [n, h, nibble, 64 = 32 * half + l] = [n, h, s, l]
    q = fields(blocks[:, 128:192].reshape(n, 2, 32), 2, 4)  # [n, h, s, 32]: the top 2 bits
    np.multiply(q, np.uint8(16), out=q)  # << 4
    np.bitwise_or(q, low.reshape(q.shape), out=q)
    scaled(as_int8(q, 32), dsc, out, 16)  # dsc rounded first, then * q: the reference's order

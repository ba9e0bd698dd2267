"""Codebook ("i-quant") formats: IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S.

All of them decode to (small signed integer) x (per-group float scale): the integers come from a
gather into the tables in `iq_tables`, signs are applied in int8, and `scaled` does the one float
multiply. Every product is exact in float32 (fp16 scale x <= 6-bit factor x <= 7-bit code), so the
order of the reference's `db * grid * signs` does not change a single bit.
"""

from __future__ import annotations

import numpy as np

from strata.quants import iq_tables as tables
from strata.quants._common import apply_signs, compact, f16_at, scaled


def kv_nibbles(qs: np.ndarray, g: int, kvalues: tuple[int, ...]) -> np.ndarray:
    """Contiguous [n, g * 16] nibble bytes -> int8 [n, g, 32] of kvalues: per group of 16 bytes, the
    16 low nibbles' values then the 16 high nibbles' (ggml order).
    """
    n = qs.shape[0]
    pairs = qs.view(np.uint16)  # [n, g * 8]: bytes (2k, 2k + 1)
    words = np.take(tables.nibble_pair_words(kvalues), pairs, mode="clip")  # [n, g * 8] uint32
    lanes = words.view(np.uint16).reshape(n, g, 8, 2)  # [n, g, pair k, (low, high) nibble values]
    return np.ascontiguousarray(lanes.transpose(0, 1, 3, 2)).view(np.int8).reshape(n, g, 32)


def deq_iq4_nl(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | qs[16]; element j = kv[qs[j] & 15], element j + 16 = kv[qs[j] >> 4]
    q = kv_nibbles(compact(blocks, 2, 18), 1, tables.KVALUES_IQ4NL)  # [n, 1, 32]
    scaled(q, f16_at(blocks, 0), out, 32)


def deq_iq4_xs(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | scales_h (uint16, 2 bits per sub-block) | scales_l[4] (nibbles) | qs[128]
    head = compact(blocks, 2, 8)  # [n, 6]
    sh = head[:, :2].view(np.uint16)  # [n, 1]
    sc_hi = ((sh >> np.arange(0, 16, 2, dtype=np.uint16)) & 3).astype(np.uint8)  # [n, 8]
    ls = (_nibble_scales(head[:, 2:]) | (sc_hi * np.uint8(16))).view(np.int8) - np.int8(32)  # -32..31
    dl = f16_at(blocks, 0) * ls.astype(np.float32)  # [n, 8], exact
    q = kv_nibbles(compact(blocks, 8, 136), 8, tables.KVALUES_IQ4NL)  # [n, 8, 32]
    scaled(q, dl, out, 32)


def _ksign_masks(aux: np.ndarray) -> np.ndarray:
    """Contiguous uint32 [n, m] holding four 7-bit ksigns indices each -> int8 masks [n, m, 32]."""
    idx = np.empty((*aux.shape, 4), np.uint32)
    for i in range(4):  # four flat shifts beat one broadcast op whose rows are only 4 long
        np.right_shift(aux, np.uint32(7 * i), out=idx[..., i])
    np.bitwise_and(idx, np.uint32(127), out=idx)
    words = np.take(tables.sign_masks_ksigns(), idx, mode="clip")  # [n, m, 4] uint64
    return words.view(np.int8).reshape(*aux.shape, 32)


def _half_scales(d: np.ndarray, s: np.ndarray, factor: float) -> np.ndarray:
    """d * (0.5 + s) * factor in float32, the reference's literal order (all steps exact anyway)."""
    return d * (np.float32(0.5) + s.astype(np.float32)) * np.float32(factor)


def _nibble_scales(packed: np.ndarray) -> np.ndarray:
    """[n, k] bytes -> [n, 2k] 4-bit scales, the low nibble of byte i first."""
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)


def deq_iq3_xxs(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | qs[64] (4-value grid rows) | 8 x uint32 (4 x 7-bit ksigns, 4-bit scale on top)
    n = blocks.shape[0]
    aux = compact(blocks, 66, 98).view(np.uint32)  # [n, 8], one per 32-element sub-block
    pairs = compact(blocks, 2, 66).view(np.uint16)  # [n, 32]: two grid rows = one sign group
    grid = np.take(tables.iq3xxs_pair_words(), pairs, mode="clip")  # [n, 32] uint64
    vals = apply_signs(grid.view(np.int8).reshape(n, 8, 32), _ksign_masks(aux))
    scaled(vals, _half_scales(f16_at(blocks, 0), aux >> 28, 0.5), out, 32)


def deq_iq2_xxs(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | 8 x (uint32 of 4 grid-row bytes, uint32 of 4 x 7-bit ksigns + 4-bit scale)
    n = blocks.shape[0]
    words = compact(blocks, 2, 66).view(np.uint64)  # [n, 8]: (grid bytes, aux) uint32 pairs
    rows = (words & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.uint8)  # [n, 32] grid rows
    aux = (words >> np.uint64(32)).astype(np.uint32)  # [n, 8], contiguous
    grid = np.take(tables.grid_words("IQ2_XXS"), rows, mode="clip")  # [n, 32] uint64
    vals = apply_signs(grid.view(np.int8).reshape(n, 8, 32), _ksign_masks(aux))
    scaled(vals, _half_scales(f16_at(blocks, 0), aux >> 28, 0.25), out, 32)


def deq_iq2_xs(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | qs[32] uint16 (9-bit grid row | 7-bit ksigns) | scales[8] (one nibble per 16)
    body = compact(blocks, 2, 74)
    codes = body[:, :64].view(np.uint16)  # [n, 32]
    vals = np.take(tables.iq2xs_words(), codes, mode="clip").view(np.int8)  # [n, 256], signed
    db = _half_scales(f16_at(blocks, 0), _nibble_scales(body[:, 64:]), 0.25)  # [n, 16]
    scaled(vals, db, out, 16)


def deq_iq2_s(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | qs[32] (low 8 bits of a 10-bit grid row) | signs[32] | qh[8] (2 bits per row)
    #         | scales[8] (one nibble per 16 elements)
    n = blocks.shape[0]
    body = compact(blocks, 2, 82)
    qh = (body[:, 64:72, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3  # [n, 8, 4]
    rows = body[:, :32] | (qh.reshape(n, 32).astype(np.uint16) << 8)  # [n, 32]
    grid = np.take(tables.grid_words("IQ2_S"), rows, mode="clip")  # [n, 32] uint64
    masks = np.take(tables.sign_masks_byte(), body[:, 32:64], mode="clip")  # [n, 32] uint64
    vals = apply_signs(grid.view(np.int8), masks.view(np.int8))  # [n, 256]
    db = _half_scales(f16_at(blocks, 0), _nibble_scales(body[:, 72:]), 0.25)  # [n, 16]
    scaled(vals, db, out, 16)


def deq_iq3_s(blocks: np.ndarray, out: np.ndarray) -> None:
    # layout: d | qs[64] (low 8 bits of a 9-bit grid row) | qh[8] (bit 8 of row 8i + j in bit j of
    #         byte i) | signs[32] | scales[4] (one nibble per 32 elements)
    n = blocks.shape[0]
    body = compact(blocks, 2, 110)
    qh = np.unpackbits(body[:, 64:72].reshape(-1), bitorder="little").reshape(n, 64)
    rows = body[:, :64] | (qh.astype(np.uint16) << 8)  # [n, 64]
    grid = np.take(tables.grid_words("IQ3_S"), rows, mode="clip")  # [n, 64] uint32
    masks = np.take(tables.sign_masks_byte(), body[:, 72:104], mode="clip")  # [n, 32] uint64
    vals = apply_signs(grid.view(np.int8), masks.view(np.int8))  # [n, 256]
    sc = _nibble_scales(body[:, 104:])  # [n, 8]
    db = f16_at(blocks, 0) * (1 + 2 * sc)  # as the reference: uint8 1 + 2s, then float32 d * it
    scaled(vals, db, out, 32)

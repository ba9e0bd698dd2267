"""Lookup tables for the codebook ("IQ") formats and MXFP4, built once on first use.

The codebooks themselves (iq2xxs_grid, iq3xxs_grid, ..., ksigns_iq2xs, kvalues_iq4nl) come from
`gguf.quants`, so there is one copy of ggml's constants; we only repack them into gather-friendly
tables: every codebook row becomes one uint32/uint64 word of int8 lanes, so a single np.take fetches
4 or 8 output codes at once (numpy's gather costs ~1 ns per index regardless of item size).
"""

from __future__ import annotations

from functools import cache

import numpy as np
from gguf import quants as gq


def _grid(cls: type) -> np.ndarray:
    """ggml codebook as int8 [n_rows, row_len] (all values fit: |v| <= 62)."""
    cls.init_grid()  # gguf decodes its packed hex lazily
    return cls.grid.reshape(cls.grid_shape).astype(np.int8)


def _rows_as_words(rows: np.ndarray) -> np.ndarray:
    """int8 [n, 4 or 8] -> uint32/uint64 [n]: one machine word per codebook row."""
    return np.ascontiguousarray(rows).view(np.uint32 if rows.shape[1] == 4 else np.uint64).reshape(-1)


@cache
def grid_words(name: str) -> np.ndarray:
    """Codebook of IQ2_XXS / IQ2_XS / IQ2_S (8 lanes, uint64) or IQ3_XXS / IQ3_S (4 lanes, uint32)."""
    return _rows_as_words(_grid(getattr(gq, name)))


@cache
def iq3xxs_pair_words() -> np.ndarray:
    """IQ3_XXS: two grid-row bytes read as one uint16 -> both 4-value rows in one uint64 (512 KiB).

    Half the gathers of a per-row lookup, and each result lines up with one 8-sign ksigns group.
    """
    rows = grid_words("IQ3_XXS").astype(np.uint64)  # [256]
    v = np.arange(1 << 16, dtype=np.uint32)
    return rows[v & 0xFF] | (rows[v >> 8] << np.uint64(32))


def _bit_masks(bits: np.ndarray) -> np.ndarray:
    """uint8 [n] of 8 sign bits -> uint64 [n], byte j = 0xFF where bit j is set (an int8 -1 mask)."""
    lanes = np.unpackbits(bits.reshape(-1, 1), axis=1, bitorder="little")  # [n, 8] of 0/1
    return _rows_as_words((lanes * np.uint8(0xFF)).view(np.int8))


@cache
def sign_masks_byte() -> np.ndarray:
    """Sign byte -> 8 int8 masks (IQ2_S, IQ3_S store the 8 sign bits of 8 values directly)."""
    return _bit_masks(np.arange(256, dtype=np.uint8))


@cache
def sign_masks_ksigns() -> np.ndarray:
    """7-bit sign index -> 8 int8 masks via ggml's ksigns_iq2xs (the 8th sign restores even parity)."""
    return _bit_masks(np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8))


@cache
def iq2xs_words() -> np.ndarray:
    """IQ2_XS uint16 code -> 8 signed int8 values: grid row (low 9 bits) with ksigns (top 7 bits).

    512 KiB, so each 16-bit code costs one gather instead of a grid gather plus a sign gather.
    """
    code = np.arange(1 << 16, dtype=np.uint32)
    rows = _grid(gq.IQ2_XS)[code & 511]  # [65536, 8]
    masks = sign_masks_ksigns()[code >> 9].view(np.int8).reshape(-1, 8)
    return _rows_as_words((rows ^ masks) - masks)


@cache
def iq1_words() -> np.ndarray:
    """IQ1_S/IQ1_M code (11-bit grid index | delta sign << 11) -> 8 int8 lanes of 8 * (grid +- 1/8).

    Eight times the reference's float `grid + delta` is an exact small integer (8g + 1 or 8g - 1),
    so callers multiply by (scale * 0.125), which is exact too, and get identical products.
    """
    code = np.arange(1 << 12, dtype=np.uint32)
    grid = _grid(gq.IQ1_S)[code & 2047].astype(np.int16)  # [4096, 8] in -1..1
    delta = np.where(code >> 11, -1, 1).astype(np.int16)[:, None]
    return _rows_as_words((grid * 8 + delta).astype(np.int8))


@cache
def nibble_pair_words(kvalues: tuple[int, ...]) -> np.ndarray:
    """uint16 of two bytes (b0, b1) -> uint32 of int8 (kv[b0 & 15], kv[b1 & 15], kv[b0 >> 4], kv[b1 >> 4]).

    The non-linear 4-bit formats (IQ4_NL, IQ4_XS, MXFP4) look codes up in a 16-entry table; doing two
    bytes (four codes) per gather, and ordering the lanes low-nibbles-first, leaves only a uint16
    transpose to reach ggml's element order.
    """
    kv = np.array(kvalues, dtype=np.int8)
    v = np.arange(1 << 16, dtype=np.uint32)
    b0, b1 = v & 0xFF, v >> 8
    lanes = np.stack([kv[b0 & 15], kv[b1 & 15], kv[b0 >> 4], kv[b1 >> 4]], axis=1)  # [65536, 4]
    return _rows_as_words(lanes)


@cache
def e8m0_half() -> np.ndarray:
    """MXFP4 scale byte -> float32 2^(e - 128) (half, as the kvalues are doubled); gguf's own formula."""
    return gq.MXFP4.e8m0_to_fp32_half(np.arange(256, dtype=np.uint8)).astype(np.float32)


KVALUES_IQ4NL: tuple[int, ...] = tuple(gq.IQ4_NL.kvalues)
KVALUES_MXFP4: tuple[int, ...] = tuple(gq.MXFP4.kvalues)

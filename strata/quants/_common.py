"""Helpers shared by the per-family kernels.

Every kernel has the signature `kernel(blocks, out) -> None` where `blocks` is a C-contiguous uint8
array [n_blocks, type_size] and `out` a C-contiguous float32 array [n_blocks, block_size] that the
kernel fills completely. The driver in `__init__` hands kernels cache-sized chunks.

Speed model (numpy): a ufunc pays ~1 us per call plus ~7-10 ns per *inner-loop row*, so an op on a
strided [n, 16] view costs as much as several passes over a flat array. Hence the recurring moves:
`compact` pulls a byte range of every block out with one copy of opaque `void` items (one inner
loop instead of n rows), bit twiddling runs on flat uint8/uint32/uint64 words, `interleave` puts
pieces back in element order with `void` copies again, and `scaled` expands per-group scales with
np.repeat so that even the final multiply is a flat pass. Gathers (`np.take`) use mode="clip":
every index is in range by construction, and clip skips the bounds-error bookkeeping of "raise".

Bit-exactness notes that apply to every family:
- fp16 -> fp32 is exact, and we convert with numpy exactly as the reference does.
- Almost every product below (fp16 scale x small integer x small integer) fits in float32's 24-bit
  mantissa, so it is exact whatever the order; where a rounding step exists (an add or subtract of
  a min/offset, or Q6_K's wider products) we follow the reference's operation order literally.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Kernel = Callable[[np.ndarray, np.ndarray], None]


def _void(width: int) -> np.dtype:
    return np.dtype((np.void, width))


def compact(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes [start, stop) of every block as a contiguous uint8 [n, stop - start] (one copy)."""
    width = stop - start
    items = blocks[:, start:stop].view(_void(width))  # [n, 1]: the byte range as one opaque item
    return np.ascontiguousarray(items).view(np.uint8).reshape(-1, width)


def interleave(parts: Sequence[np.ndarray], groups: int = 1) -> np.ndarray:
    """Contiguous uint8 [n, groups * k] parts -> uint8 [n, groups, len(parts), k].

    Part p's k-byte run of group g lands at [:, g, p]: the "low nibbles, then high nibbles" (or
    "field 0, field 1, ...") order of ggml blocks, assembled with whole-run `void` copies.
    """
    n, width = parts[0].shape
    k = width // groups
    out = np.empty((n, groups, len(parts), k), np.uint8)
    slots = out.view(_void(k))[..., 0]  # [n, groups, len(parts)] of k-byte items
    for p, part in enumerate(parts):
        slots[:, :, p] = part.view(_void(k)).reshape(n, groups)
    return out


def f16_at(blocks: np.ndarray, off: int) -> np.ndarray:
    """The fp16 field at byte `off` of every block, as float32 [n_blocks, 1]."""
    return blocks[:, off : off + 2].view(np.float16).astype(np.float32)


def split_nibbles(blocks: np.ndarray, start: int, stop: int, groups: int = 1) -> np.ndarray:
    """Nibbles of bytes [start, stop) of each block -> uint8 [n, groups, 2, k]: per group of k bytes,
    all low nibbles, then all high ones (ggml's 4-bit layout: byte j holds elements j and j + k).
    """
    src = compact(blocks, start, stop)  # [n, groups * k]
    return interleave([src & np.uint8(0x0F), src >> np.uint8(4)], groups)


def fields(src: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Bit fields of bytes: uint8 [n, g, k] (k % 8 == 0) -> [n, g, count, k], field i =
    (src >> bits * i) & mask.

    K-quants pack 2-bit (Q2_K/Q3_K/Q6_K) or 1-bit (Q3_K/Q5_K highs) fields this way: field i of byte
    l belongs to element 32 * i + l of its group. We shift whole uint64 words (8 byte lanes, masked
    per lane) field-major, so each pass is one long loop, then move the k-byte runs into element
    order as `void` items: 1.5x faster than one broadcast op over [n, g, count, k / 8] words.
    """
    n, g, k = src.shape
    words = np.ascontiguousarray(src.reshape(n, g * k).view(_void(g * k))).view(np.uint64)
    shifts = np.arange(0, bits * count, bits, dtype=np.uint64).reshape(count, 1, 1)
    per_field = np.right_shift(words[None], shifts)  # [count, n, g * k / 8]
    np.bitwise_and(per_field, np.uint64(((1 << bits) - 1) * 0x0101010101010101), out=per_field)
    out = np.empty((n, g, count, k), np.uint8)
    runs = per_field.view(_void(k)).reshape(count, n, g)  # one k-byte run per (field, block, group)
    out.view(_void(k))[..., 0] = runs.transpose(1, 2, 0)
    return out


def as_int8(q: np.ndarray, offset: int) -> np.ndarray:
    """uint8 codes minus `offset`, reinterpreted as int8 (wrap-around is the two's complement)."""
    np.subtract(q, np.uint8(offset), out=q)
    return q.view(np.int8)


def scaled(
    q: np.ndarray, scale: np.ndarray, out: np.ndarray, group: int, offset: np.ndarray | None = None
) -> None:
    """out = scale * q (- offset), one scale/offset per `group` elements; the reference's op order.

    q is a contiguous integer array in element order, scale/offset [n, n_groups] float32. All three
    passes are flat: q is cast into `out`, and the per-group values are expanded with np.repeat
    (a memcpy-speed fast path) rather than broadcast, since a broadcast ufunc pays its per-row cost
    every 16 or 32 elements; ~20% faster. Same products, so the same bits.
    """
    o = out.reshape(-1)
    np.copyto(o, q.reshape(-1), casting="unsafe")
    np.multiply(o, np.repeat(scale.reshape(-1), group), out=o)
    if offset is not None:
        np.subtract(o, np.repeat(offset.reshape(-1), group), out=o)


def apply_signs(vals: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Negate int8 `vals` where `masks` is -1 (in place); masks is 0 or -1 per element."""
    np.bitwise_xor(vals, masks, out=vals)
    np.subtract(vals, masks, out=vals)
    return vals

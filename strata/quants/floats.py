"""Unquantized element types: F32, F16, BF16 (block size 1)."""

from __future__ import annotations

from functools import cache

import numpy as np


@cache
def _f16_table() -> np.ndarray:
    """All 65536 fp16 bit patterns as float32, converted by numpy itself (so NaN payloads and
    subnormals come out exactly as the reference's `astype`). 256 KiB, L2-resident."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def deq_f32(blocks: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out.reshape(-1), blocks.reshape(-1).view(np.float32))


def deq_f16(blocks: np.ndarray, out: np.ndarray) -> None:
    # A gather from the table runs at one speed for every input; numpy's own fp16 cast drops to
    # a slow path on subnormals (common in small weights) and is ~1.5x slower even without them.
    np.take(_f16_table(), blocks.reshape(-1).view(np.uint16), out=out.reshape(-1), mode="clip")


def deq_bf16(blocks: np.ndarray, out: np.ndarray) -> None:
    # bf16 is the top half of an fp32: widen to uint32 and shift into place (two flat SIMD passes;
    # writing the halves through strided uint16 views was 4x slower). Same bits as the reference's
    # int16 -> int32 << 16.
    words = out.reshape(-1).view(np.uint32)
    np.copyto(words, blocks.reshape(-1).view(np.uint16), casting="unsafe")
    np.left_shift(words, np.uint32(16), out=words)

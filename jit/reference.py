"""numpy twins of the JIT kernels: what each one must compute, written the obvious way.

The kernels promise results within float32 rounding of these (they sum in a different order);
tests/test_jit_kernels.py holds them together and reports the worst element.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from strata.blocks.norms import silu
from strata.jit.qdot_ir import Q8_BLOCK, Q8_BYTES
from strata.quants import dequantize
from strata.quants.iq_tables import KVALUES_IQ4NL
from strata.quants.kquants import _scale_min_k4


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


# ---- the int8-input products (qdot_ir.py): the kernels' own operations, so the twins agree to the bit ----


def quantize_q8(x: np.ndarray) -> np.ndarray:
    """x [N, C] (C a multiple of 256) -> q8 rows [N, C / 256 * Q8_BYTES] uint8: per block f32 d = amax / 127,
    i16 sums of each 16 codes, i8 codes rint(x * (127 / amax))."""
    n, c = x.shape
    xb = x.astype(np.float32).reshape(n, c // Q8_BLOCK, Q8_BLOCK)
    amax = np.abs(xb).max(axis=2)
    with np.errstate(divide="ignore"):
        inv = np.where(amax == 0, np.float32(0), np.float32(127) / amax).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int8)
    out = np.zeros((n, c // Q8_BLOCK, Q8_BYTES), np.uint8)
    out[..., 0:4] = (amax / np.float32(127)).astype(np.float32)[..., None].view(np.uint8)
    out[..., 4:36] = q.reshape(n, -1, 16, 16).sum(axis=3, dtype=np.int16).view(np.uint8)
    out[..., 36:] = q.view(np.uint8)
    return out.reshape(n, -1)


def _q8_parts(xq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q8 rows -> d [N, B] f32, sums [N, B, 16] i64, codes [N, B, 256] i64."""
    b = xq.reshape(xq.shape[0], -1, Q8_BYTES)
    d = np.ascontiguousarray(b[..., 0:4]).view(np.float32)[..., 0]
    sums = np.ascontiguousarray(b[..., 4:36]).view(np.int16).astype(np.int64)
    return d, sums, b[..., 36:].view(np.int8).astype(np.int64)


def _f16(b: np.ndarray, off: int) -> np.ndarray:
    return np.ascontiguousarray(b[..., off : off + 2]).view(np.float16)[..., 0].astype(np.float32)


def _k_codes(b: np.ndarray, qtype: T) -> np.ndarray:
    """The unsigned codes of K-quant blocks [..., size] -> [..., 256] i64, in element order."""
    if qtype in (T.Q4_K, T.Q5_K):
        qs = b[..., 16:144] if qtype == T.Q4_K else b[..., 48:176]
        g = qs.reshape(*qs.shape[:-1], 4, 32).astype(np.int64)
        codes = np.stack([g & 15, g >> 4], axis=-2).reshape(*qs.shape[:-1], 256)
        if qtype == T.Q5_K:
            qh = b[..., 16:48].astype(np.int64)  # bit j of qh[l]: element 32j + l
            codes = codes | (((qh[..., None, :] >> np.arange(8)[:, None]) & 1) << 4).reshape(codes.shape)
        return codes
    ql, qh = b[..., 0:128].astype(np.int64), b[..., 128:192].astype(np.int64)
    parts = []
    for h in range(2):
        for s in range(4):
            low = ql[..., 64 * h + 32 * (s % 2) : 64 * h + 32 * (s % 2) + 32]
            low = (low >> 4) if s // 2 else (low & 15)
            parts.append(low | (((qh[..., 32 * h : 32 * h + 32] >> (2 * s)) & 3) << 4))
    return np.concatenate(parts, axis=-1)


def _iq4xs_parts(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ4_XS blocks [..., 136] -> code-book values [..., 256] and sub-block scales ls - 32 [..., 8], i64."""
    sh = np.ascontiguousarray(b[..., 2:4]).view(np.uint16)[..., 0].astype(np.int64)
    sl = b[..., 4:8].astype(np.int64)
    j = np.arange(8)
    ls = ((sl[..., j // 2] >> (4 * (j % 2))) & 15) | (((sh[..., None] >> (2 * j)) & 3) << 4)
    qs = b[..., 8:136].reshape(*b.shape[:-1], 8, 16).astype(np.int64)
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(*b.shape[:-1], 256)
    return np.asarray(KVALUES_IQ4NL, np.int64)[codes], ls - 32


def qdot(raw: np.ndarray, qtype: T | int, xq: np.ndarray) -> np.ndarray:
    """q8 rows xq [N, .] times the matrix raw [R, row_bytes] (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0): y [N, R]
    float32, with the integer sums and the float32 steps of qdot_ir.py in its order."""
    qt = T(qtype)
    dx, sx, cx = _q8_parts(xq)  # [N, B], [N, B, 16], [N, B, 256]
    if qt == T.Q8_0:  # eight blocks of 32 a q8 block, each its own float step
        blocks = raw.reshape(raw.shape[0], -1, 8, 34)  # [R, B, 8, 34]
        d, q = _f16(blocks, 0), blocks[..., 2:].view(np.int8).astype(np.int64)
        isum = np.einsum("rbkl,nbkl->nrbk", q, cx.reshape(*cx.shape[:2], 8, 32))
        acc = np.zeros((xq.shape[0], raw.shape[0]), np.float32)
        for b in range(blocks.shape[1]):
            for k in range(8):
                acc = acc + (d[None, :, b, k] * dx[:, b, None]) * isum[:, :, b, k].astype(np.float32)
        return acc
    size = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210, T.IQ4_XS: 136}[qt]
    blocks = raw.reshape(raw.shape[0], -1, size)  # [R, B, size]
    codes = _iq4xs_parts(blocks)[0] if qt == T.IQ4_XS else _k_codes(blocks, qt)  # [R, B, 256]
    prods = np.einsum(
        "rbjl,nbjl->nrbj", codes.reshape(*codes.shape[:2], -1, 16), cx.reshape(*cx.shape[:2], -1, 16)
    )
    msum = dmin = None
    if qt == T.Q6_K:
        sc = blocks[..., 192:208].view(np.int8).astype(np.int64)  # [R, B, 16]
        isum = (sc[None] * (prods - 32 * sx[:, None])).sum(axis=3)
        d = _f16(blocks, 208)
    elif qt == T.IQ4_XS:
        isum = (np.repeat(_iq4xs_parts(blocks)[1], 2, axis=-1)[None] * prods).sum(axis=3)
        d = _f16(blocks, 0)
    else:
        sm = _scale_min_k4(blocks.reshape(-1, size)).astype(np.int64).reshape(*blocks.shape[:2], 2, 8)
        sc, mn = sm[..., 0, :], sm[..., 1, :]  # [R, B, 8]: the dequantizer's own unpacking
        isum = (np.repeat(sc, 2, axis=-1)[None] * prods).sum(axis=3)
        msum = (np.repeat(mn, 2, axis=-1)[None] * sx[:, None]).sum(axis=3)
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    acc = np.zeros((xq.shape[0], raw.shape[0]), np.float32)
    for b in range(blocks.shape[1]):
        acc = acc + (d[None, :, b] * dx[:, b, None]) * isum[:, :, b].astype(np.float32)
        if msum is not None:
            acc = acc - (dmin[None, :, b] * dx[:, b, None]) * msum[:, :, b].astype(np.float32)
    return acc

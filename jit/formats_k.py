"""Block decoders for the 256-element K-quants (Q4_K, Q5_K, Q6_K) and the IQ4 code-book types.

Same contract as formats.py: sub-block j of a block as <32 x float>, bit-identical to the numpy
dequantizers in strata/quants/kquants.py and iquants.py. Per-block scales are decoded once in
`prepare` as scalar IR (a few integer ops each); LLVM keeps them in registers across sub-blocks.
"""

from __future__ import annotations

from gguf.constants import GGMLQuantizationType as T
from llvmlite import ir

from strata.jit.formats import IOTA16, Ctx, fmt
from strata.jit.irutil import F32, I8, I16, I32, concat, cvec, load, nibbles, splat
from strata.quants.iq_tables import KVALUES_IQ4NL


def _byte(c: Ctx, blk: ir.Value, off: int) -> ir.Value:
    return c.b.zext(load(c.b, blk, off, I8), I32)


def _i32(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def _scale_min_k4(c: Ctx, blk: ir.Value) -> tuple[ir.Value, list[ir.Value], list[ir.Value]]:
    """Q4_K/Q5_K: d * scale_j and dmin * min_j for the 8 sub-blocks (get_scale_min_k4), float32.

    Bytes 4-7 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 8-11 the same
    for mins; bytes 12-15 the low nibbles of scales 4-7 (low half) and mins 4-7 (high half).
    """
    b = c.b
    d, dmin = c.half(blk, 0), c.half(blk, 2)
    q = [_byte(c, blk, 4 + i) for i in range(12)]
    dl, ml = [], []
    for j in range(8):
        if j < 4:
            sc, m = b.and_(q[j], _i32(63)), b.and_(q[j + 4], _i32(63))
        else:
            top_s = b.shl(b.lshr(q[j - 4], _i32(6)), _i32(4))
            top_m = b.shl(b.lshr(q[j], _i32(6)), _i32(4))
            sc = b.or_(b.and_(q[j + 4], _i32(15)), top_s)
            m = b.or_(b.lshr(q[j + 4], _i32(4)), top_m)
        dl.append(b.fmul(d, b.uitofp(sc, F32)))  # exact: 11-bit mantissa x 6-bit integer
        ml.append(b.fmul(dmin, b.uitofp(m, F32)))
    return d, dl, ml


def _k4_codes(c: Ctx, blk: ir.Value, qs: int, j: int) -> ir.Value:
    """4-bit codes of sub-block j: group j // 2 of 32 bytes at qs, low nibbles then high ones."""
    v = c.bytes(blk, qs + 32 * (j // 2), 32)
    return c.b.lshr(v, cvec(I8, [4] * 32)) if j % 2 else c.b.and_(v, cvec(I8, [15] * 32))


def _k4_prep(c: Ctx, blk: ir.Value) -> tuple[list[ir.Value], list[ir.Value]]:
    _, dl, ml = _scale_min_k4(c, blk)
    return dl, ml


@fmt(T.Q4_K, 256, 144, _k4_prep)
def _q4_k(c: Ctx, blk: ir.Value, s: tuple[list[ir.Value], list[ir.Value]], j: int) -> ir.Value:
    # layout: d | dmin | scales[12] | qs[128]; out = q * dl - ml, the reference's order
    return c.map16(_k4_codes(c, blk, 16, j), IOTA16, s[0][j], s[1][j], -1)


@fmt(T.Q5_K, 256, 176, _k4_prep)
def _q5_k(c: Ctx, blk: ir.Value, s: tuple[list[ir.Value], list[ir.Value]], j: int) -> ir.Value:
    # layout: d | dmin | scales[12] | qh[32] | qs[128]; bit j of qh[l] is bit 4 of element 32j + l
    b = c.b
    high = b.shl(
        b.and_(b.lshr(c.bytes(blk, 16, 32), cvec(I8, [j] * 32)), cvec(I8, [1] * 32)), cvec(I8, [4] * 32)
    )
    q = b.or_(_k4_codes(c, blk, 48, j), high)
    return c.offset(c.scale(c.u8f(q), s[0][j]), s[1][j], -1)


def _q6_prep(c: Ctx, blk: ir.Value) -> list[ir.Value]:
    b, d = c.b, c.half(blk, 208)  # d * scale, rounded to float32 first: the reference's order
    return [b.fmul(d, b.sitofp(load(b, blk, 192 + i, I8), F32)) for i in range(16)]


@fmt(T.Q6_K, 256, 210, _q6_prep)
def _q6_k(c: Ctx, blk: ir.Value, dsc: list[ir.Value], j: int) -> ir.Value:
    # layout: ql[128] | qh[64] | scales[16] int8 | d. Sub-block j = (half h, quarter s): element
    # 128h + 32s + l has low 4 bits in ql[64h + 32(s % 2) + l] (nibble s // 2) and top 2 bits at
    # bits 2s of qh[32h + l]; its scale is scales[8h + 2s + l // 16].
    b = c.b
    h, s = divmod(j, 4)
    low = c.bytes(blk, 64 * h + 32 * (s % 2), 32)
    low = b.lshr(low, cvec(I8, [4] * 32)) if s // 2 else b.and_(low, cvec(I8, [15] * 32))
    top = b.and_(b.lshr(c.bytes(blk, 128 + 32 * h, 32), cvec(I8, [2 * s] * 32)), cvec(I8, [3] * 32))
    q = c.i8f(b.or_(low, b.shl(top, cvec(I8, [4] * 32))), 32)  # -32..31
    scales = concat(b, splat(b, dsc[8 * h + 2 * s], 16), splat(b, dsc[8 * h + 2 * s + 1], 16))
    return b.fmul(q, scales)


def _kv(c: Ctx, blk: ir.Value, off: int, d: ir.Value) -> ir.Value:
    """16 nibble bytes at off -> KVALUES_IQ4NL[code] * d (low nibbles, then high ones)."""
    return c.map16(nibbles(c.b, c.bytes(blk, off, 16)), KVALUES_IQ4NL, d)


@fmt(T.IQ4_NL, 32, 18, lambda c, blk: c.half(blk, 0))
def _iq4_nl(c: Ctx, blk: ir.Value, d: ir.Value, j: int) -> ir.Value:
    return _kv(c, blk, 2, d)


def _iq4_xs_prep(c: Ctx, blk: ir.Value) -> list[ir.Value]:
    """d * (ls_j - 32) per sub-block: ls_j = low nibble j of scales_l | 2 bits j of scales_h << 4."""
    b, d = c.b, c.half(blk, 0)
    sh = b.zext(load(b, blk, 2, I16), I32)
    out = []
    for j in range(8):
        lo = b.and_(b.lshr(_byte(c, blk, 4 + j // 2), _i32(4 * (j % 2))), _i32(15))
        hi = b.shl(b.and_(b.lshr(sh, _i32(2 * j)), _i32(3)), _i32(4))
        out.append(b.fmul(d, b.sitofp(b.sub(b.or_(lo, hi), _i32(32)), F32)))  # exact
    return out


@fmt(T.IQ4_XS, 256, 136, _iq4_xs_prep)
def _iq4_xs(c: Ctx, blk: ir.Value, dl: list[ir.Value], j: int) -> ir.Value:
    # layout: d | scales_h (uint16) | scales_l[4] | qs[128]; sub-block j's codes are bytes 16j..16j+15
    return _kv(c, blk, 8 + 16 * j, dl[j])

"""Block decoders for the kernel generator: one ggml quant type each, emitted as LLVM IR.

A decoder turns the bytes of one block (already in cache: the kernel reads each quantized byte
once) into <32 x float> sub-blocks in registers, so dequantization is fused into the matmul and no
f32 copy of the weights ever exists. Layouts and operation order follow strata/quants, the numpy
references: every decoded weight is bit-identical to `strata.quants.dequantize` (the products are
exact in float32, and where a rounding add exists we keep the reference's order).

This module holds the framework, the float types and the 32-element "legacy" formats; K-quants and
IQ4 live in formats_k.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gguf.constants import GGMLQuantizationType as T
from llvmlite import ir

from strata.jit.irutil import (
    F16,
    F32,
    I8,
    I16,
    I32,
    bits_of,
    cvec,
    fma,
    half,
    intrinsic,
    load,
    nibbles,
    splat,
    vec,
)

V32F = vec(F32, 32)


@dataclass(slots=True)
class Ctx:
    """What a decoder needs while emitting: the builder and the host abilities it may rely on."""

    b: ir.IRBuilder
    f16c: bool  # vcvtph2ps: fp16 scales convert in one instruction
    shuffle: str  # byte table lookup: "avx2" (32 lanes), "ssse3" (16 lanes) or "" (generic)
    permute: bool = False  # AVX-512 vpermps: a 16-entry float table lives in one register

    def half(self, blk: ir.Value, off: int) -> ir.Value:
        return half(self.b, blk, off, self.f16c)

    def bytes(self, blk: ir.Value, off: int, n: int) -> ir.Value:
        return load(self.b, blk, off, vec(I8, n))

    def u8f(self, q: ir.Value) -> ir.Value:
        return self.b.uitofp(q, vec(F32, q.type.count))

    def i8f(self, q: ir.Value, offset: int) -> ir.Value:
        """uint8 codes minus offset, as float (the subtraction is exact in int8)."""
        n = q.type.count
        return self.b.sitofp(self.b.sub(q, cvec(I8, [offset] * n)), vec(F32, n))

    def scale(self, q: ir.Value, d: ir.Value) -> ir.Value:
        return self.b.fmul(q, d if isinstance(d.type, ir.VectorType) else splat(self.b, d, q.type.count))

    def offset(self, v: ir.Value, m: ir.Value, sign: int) -> ir.Value:
        s = splat(self.b, m, v.type.count)
        return self.b.fadd(v, s) if sign > 0 else self.b.fsub(v, s)

    def map16(
        self, codes: ir.Value, base: tuple[int, ...], d: ir.Value, m: ir.Value | None = None, sign: int = 1
    ) -> ir.Value:
        """<32 x i8> codes 0..15 -> <32 x float> of base[code] * d (+ sign * m).

        With vpermps the 16 possible weights of a (sub-)block are computed once into a register
        and each code just selects one: 2 permutes instead of 2 converts, 2 multiplies and 2 adds
        per 32 weights. Same bits either way: base * d is exact (small integer times an fp16 or
        a product of one and a 6-bit integer), and the one rounding of fma(base, d, +-m) is the
        reference's rounding of (base * d) +- m.
        """
        b = self.b
        if self.permute:
            dv = splat(b, d, 16)
            tab = (
                b.fmul(cvec(F32, base), dv)
                if m is None
                else fma(b, cvec(F32, base), dv, splat(b, m if sign > 0 else b.fneg(m), 16))
            )
            idx = b.zext(codes, vec(I32, 32))
            parts = [
                intrinsic(b, "llvm.x86.avx512.permvar.sf.512", vec(F32, 16), [tab, _lanes(b, idx, k)])
                for k in (0, 16)
            ]
            return b.shuffle_vector(parts[0], parts[1], cvec(I32, range(32)))
        if base == tuple(range(16)):
            q = self.u8f(codes)
        elif base == tuple(range(-8, 8)):
            q = self.i8f(codes, 8)
        else:
            q = b.sitofp(self.lookup(codes, base), V32F)
        v = self.scale(q, d)
        return v if m is None else self.offset(v, m, sign)

    def lookup(self, idx: ir.Value, table: tuple[int, ...]) -> ir.Value:
        """<32 x i8> of values 0..15 -> <32 x i8> of table[v] (IQ4 code books)."""
        b = self.b
        if self.shuffle == "avx2":  # vpshufb looks up within each 128-bit lane: repeat the table
            return intrinsic(b, "llvm.x86.avx2.pshuf.b", idx.type, [cvec(I8, table * 2), idx])
        if self.shuffle == "ssse3":
            t16 = cvec(I8, table)
            halves = [
                intrinsic(b, "llvm.x86.ssse3.pshuf.b.128", vec(I8, 16), [t16, part])
                for part in (_lanes(b, idx, 0), _lanes(b, idx, 16))
            ]
            return b.shuffle_vector(halves[0], halves[1], cvec(I32, range(32)))
        out = ir.Constant(idx.type, None)  # portable and slow: one extract/insert per element
        for i in range(idx.type.count):
            v = b.extract_element(cvec(I8, table), b.extract_element(idx, ir.Constant(I32, i)))
            out = b.insert_element(out, v, ir.Constant(I32, i))
        return out


def _lanes(b: ir.IRBuilder, v: ir.Value, start: int) -> ir.Value:
    return b.shuffle_vector(v, ir.Constant(v.type, None), cvec(I32, range(start, start + 16)))


Prepare = Callable[[Ctx, ir.Value], Any]  # (ctx, block pointer) -> per-block values (scales)
Sub = Callable[[Ctx, ir.Value, Any, int], ir.Value]  # (ctx, block, prepared, j) -> <32 x float>


@dataclass(frozen=True, slots=True)
class Format:
    qtype: T
    block: int  # elements per block
    size: int  # bytes per block
    prepare: Prepare
    sub: Sub  # sub-block j (elements 32j .. 32j + 31 of the block)

    @property
    def subs(self) -> int:
        return self.block // 32


FORMATS: dict[T, Format] = {}


def fmt(qtype: T, block: int, size: int, prepare: Prepare) -> Callable[[Sub], Sub]:
    def deco(sub: Sub) -> Sub:
        FORMATS[qtype] = Format(qtype, block, size, prepare, sub)
        return sub

    return deco


def _d(c: Ctx, blk: ir.Value) -> ir.Value:
    return c.half(blk, 0)


def _dm(c: Ctx, blk: ir.Value) -> tuple[ir.Value, ir.Value]:
    return c.half(blk, 0), c.half(blk, 2)


def _none(c: Ctx, blk: ir.Value) -> None:
    return None


@fmt(T.F32, 32, 128, _none)
def _f32(c: Ctx, blk: ir.Value, _: None, j: int) -> ir.Value:
    return load(c.b, blk, 0, V32F)


@fmt(T.BF16, 32, 64, _none)
def _bf16(c: Ctx, blk: ir.Value, _: None, j: int) -> ir.Value:
    b = c.b  # bf16 is the top half of a float32: widen and shift, exact
    w = b.zext(load(b, blk, 0, vec(I16, 32)), vec(I32, 32))
    return b.bitcast(b.shl(w, cvec(I32, [16] * 32)), V32F)


def _f16(c: Ctx, blk: ir.Value, _: None, j: int) -> ir.Value:
    return c.b.fpext(load(c.b, blk, 0, vec(F16, 32)), V32F)


FORMAT_F16 = Format(T.F16, 32, 64, _none, _f16)  # registered by the compiler only on F16C hosts


@fmt(T.Q8_0, 32, 34, _d)
def _q8_0(c: Ctx, blk: ir.Value, d: ir.Value, j: int) -> ir.Value:
    return c.scale(c.b.sitofp(c.bytes(blk, 2, 32), V32F), d)


IOTA16 = tuple(range(16))


@fmt(T.Q4_0, 32, 18, _d)
def _q4_0(c: Ctx, blk: ir.Value, d: ir.Value, j: int) -> ir.Value:
    return c.map16(nibbles(c.b, c.bytes(blk, 2, 16)), tuple(range(-8, 8)), d)  # codes -8..7


@fmt(T.Q4_1, 32, 20, _dm)
def _q4_1(c: Ctx, blk: ir.Value, dm: tuple[ir.Value, ir.Value], j: int) -> ir.Value:
    return c.map16(nibbles(c.b, c.bytes(blk, 4, 16)), IOTA16, dm[0], dm[1], +1)  # (d*q) + m


def _q5_codes(c: Ctx, blk: ir.Value, qh: int) -> ir.Value:
    """5-bit codes <32 x i8>: bit j of the uint32 at qh is bit 4 of element j."""
    b = c.b
    high = b.shl(bits_of(b, load(b, blk, qh, I32), 32), cvec(I8, [4] * 32))
    return b.or_(nibbles(b, c.bytes(blk, qh + 4, 16)), high)


@fmt(T.Q5_0, 32, 22, _d)
def _q5_0(c: Ctx, blk: ir.Value, d: ir.Value, j: int) -> ir.Value:
    return c.scale(c.i8f(_q5_codes(c, blk, 2), 16), d)  # codes -16..15


@fmt(T.Q5_1, 32, 24, _dm)
def _q5_1(c: Ctx, blk: ir.Value, dm: tuple[ir.Value, ir.Value], j: int) -> ir.Value:
    return c.offset(c.scale(c.u8f(_q5_codes(c, blk, 4)), dm[0]), dm[1], +1)

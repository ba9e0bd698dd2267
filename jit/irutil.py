"""Small llvmlite.ir helpers the kernel generators share: types, loops, loads, vector idioms.

Vectors are written at their logical width (a 32-element sub-block is one <32 x float>); LLVM's
type legalisation splits them into the host's registers (2 zmm on AVX-512, 4 ymm on AVX2), so the
generators stay width-agnostic and the SIMD width comes from the target machine alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from llvmlite import ir

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32 = ir.HalfType(), ir.FloatType()
VOID = ir.VoidType()
P8, PF32, PI32 = I8.as_pointer(), F32.as_pointer(), I32.as_pointer()


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def c64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def cvec(t: ir.Type, values: Sequence[int | float]) -> ir.Constant:
    return ir.Constant(vec(t, len(values)), [ir.Constant(t, v) for v in values])


def splat(b: ir.IRBuilder, value: ir.Value, n: int) -> ir.Value:
    """value broadcast to n lanes (insertelement + zero shuffle, which LLVM emits as a broadcast)."""
    one = b.insert_element(ir.Constant(vec(value.type, 1), None), value, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(vec(value.type, 1), None), ir.Constant(vec(I32, n), [0] * n))


def concat(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    n = lo.type.count
    return b.shuffle_vector(lo, hi, cvec(I32, range(2 * n)))


def lanes(b: ir.IRBuilder, v: ir.Value, start: int, n: int) -> ir.Value:
    """Lanes [start, start + n) of v."""
    return b.shuffle_vector(v, ir.Constant(v.type, None), cvec(I32, range(start, start + n)))


def at(b: ir.IRBuilder, ptr: ir.Value, off: int | ir.Value) -> ir.Value:
    """i8* ptr + off (bytes)."""
    return b.gep(ptr, [off if isinstance(off, ir.Value) else c64(off)])


def load(b: ir.IRBuilder, ptr: ir.Value, off: int | ir.Value, t: ir.Type) -> ir.Value:
    """An unaligned load of type t at byte offset off of i8* ptr (block fields are packed)."""
    return b.load(b.bitcast(at(b, ptr, off), t.as_pointer()), align=1)


def half(b: ir.IRBuilder, ptr: ir.Value, off: int, f16c: bool) -> ir.Value:
    """The fp16 at byte off of ptr, as float (exact, subnormals included)."""
    bits = load(b, ptr, off, I16)
    if f16c:  # one vcvtph2ps
        return b.fpext(b.bitcast(bits, F16), F32)
    # Without F16C LLVM would call a compiler-rt helper that MCJIT cannot link: do it by hand.
    # Normal: rebias the exponent (+112) and shift into place; subnormal: mantissa * 2^-24, exact.
    w = b.zext(bits, I32)
    sign = b.shl(b.and_(w, ir.Constant(I32, 0x8000)), ir.Constant(I32, 16))
    exp = b.and_(w, ir.Constant(I32, 0x7C00))
    mant = b.and_(w, ir.Constant(I32, 0x03FF))
    normal = b.add(b.shl(b.or_(exp, mant), ir.Constant(I32, 13)), ir.Constant(I32, 112 << 23))
    infnan = b.or_(b.shl(mant, ir.Constant(I32, 13)), ir.Constant(I32, 0x7F800000))
    sub = b.bitcast(b.fmul(b.uitofp(mant, F32), ir.Constant(F32, 2.0**-24)), I32)
    is_sub = b.icmp_unsigned("==", exp, ir.Constant(I32, 0))
    is_top = b.icmp_unsigned("==", exp, ir.Constant(I32, 0x7C00))
    mag = b.select(is_sub, sub, b.select(is_top, infnan, normal))
    return b.bitcast(b.or_(sign, mag), F32)


def nibbles(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """<n x i8> -> <2n x i8>: all low nibbles, then all high ones (ggml's 4-bit element order)."""
    n = v.type.count
    lo = b.and_(v, cvec(I8, [15] * n))
    hi = b.lshr(v, cvec(I8, [4] * n))
    return concat(b, lo, hi)


def bits_of(b: ir.IRBuilder, word: ir.Value, n: int) -> ir.Value:
    """An n-bit integer -> <n x i8> of its bits (lane j = bit j), via <n x i1>."""
    return b.zext(b.bitcast(word, vec(I1, n)), vec(I8, n))


def intrinsic(b: ir.IRBuilder, name: str, ret: ir.Type, args: Sequence[ir.Value]) -> ir.Value:
    mod = b.module
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret, [a.type for a in args]), name)
    return b.call(fn, list(args))


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    t = x.type
    return intrinsic(b, f"llvm.fma.v{t.count}f32", t, [x, y, acc])


def hsum(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Sum of a float vector's lanes by halving (a fixed order, so results are reproducible)."""
    while v.type.count > 1:
        n = v.type.count // 2
        v = b.fadd(lanes(b, v, 0, n), lanes(b, v, n, n))
    return b.extract_element(v, ir.Constant(I32, 0))


@contextmanager
def loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int) -> Iterator[ir.Value]:
    """Run the body for i = start, start + step, ... while i + step <= stop (i is an i64 phi).

    After the `with`, the builder sits past the loop and i still names the phi, whose value there
    is where the loop stopped: the start of a tail loop over what is left."""
    fn = b.function
    head, body, done = (
        fn.append_basic_block("head"),
        fn.append_basic_block("body"),
        fn.append_basic_block("done"),
    )
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(start, entry)
    b.cbranch(b.icmp_signed("<=", b.add(i, c64(step)), stop), body, done)
    b.position_at_end(body)
    yield i
    i.add_incoming(b.add(i, c64(step)), b.block)
    b.branch(head)
    b.position_at_end(done)

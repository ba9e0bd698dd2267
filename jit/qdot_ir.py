"""IR for products on int8 inputs: y[n_tok, rows] = xq[n_tok, cols] . W^T with the weights' own integer
codes times int8 inputs, as llama.cpp's CPU kernels and the GPU's dp4a products (gpu/kernels/mmvq.py) do.

Why: decoding each weight to a float (matmul_ir.py) costs more instructions than reading it; on the GPU
host's 15 threads the CPU share ran bound by its kernels, not by memory (perf/README, 2026-12-04). Here
32 codes times 32 int8 inputs are one multiply-add of bytes into 16-bit pairs (pmaddubsw) and one into
32-bit sums that applies the sub-block's integer scale (pmaddwd): no float until a block's end.

The inputs are quantized per 256 values (a "q8 block", `q8_quantize`): d = amax / 127, q = rint(x / d)
as x * (127 / amax), and the sums of each 16 codes. Row layout, Q8_BYTES a block:
    f32 d | i16 sums[16] | i8 q[256]
A super-block of 256 weights then contributes, in float32 and this order (the numpy twin's,
jit/reference.py):
    Q4_K, Q5_K: acc += (d_w * d_x) * float(sum_j sc_j (q_j . x_j))
                acc -= (dmin_w * d_x) * float(sum_j m_j s_j)
    Q6_K: acc += (d_w * d_x) * float(sum_k sc_k (q_k . x_k - 32 s_k))
    IQ4_XS: acc += (d_w * d_x) * float(sum_j (ls_j - 32) (kv[q_j] . x_j))
    Q8_0: for each of its 8 blocks of 32 in turn, acc += (d_k * d_x) * float(q_k . x_k)
(j over the 8 sub-blocks of 32, k over the 16 groups of 16; s the input's code sums; kv the IQ4_NL code
book). The integer sums are exact, so any row split, tile or token count gives the same bits (batch == solo).

Types: Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0 (`TYPES`, rows of whole 256-blocks; the others keep matmul_ir's float
kernels). Exported as qdot_<type>, with matmul_ir's arguments so a task table can hold either kernel:
    void qdot(i8* w, i64 row_bytes, i8* xq, i64 ldx_bytes, i64 n_tok, float* y, i64 ldy, i64 r0, i64 r1)
and q8_quantize(float* x, i64 cols, i64 n_tok, i64 ldx, i8* out, i64 ld_out_bytes).
"""

from __future__ import annotations

from gguf.constants import GGMLQuantizationType as T
from llvmlite import ir

from strata.jit.host import Host
from strata.jit.irutil import (
    F32,
    I8,
    I16,
    I32,
    I64,
    P8,
    PF32,
    VOID,
    c64,
    cvec,
    half,
    intrinsic,
    lanes,
    load,
    loop,
    nibbles,
    splat,
    vec,
)
from strata.jit.matmul_ir import QMM_ARGS, ctx_for
from strata.quants.iq_tables import KVALUES_IQ4NL

Q8_BLOCK, Q8_BYTES = 256, 4 + 32 + 256
_SUMS, _CODES = 4, 36  # byte offsets in a q8 block
QUANT_ARGS = (PF32, I64, I64, I64, P8, I64)
QUANTIZE = "q8_quantize"
LAYOUT = "q8k2"  # part of the disk-cache key: bump when the layout or the order of operations changes


def _i32(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


class _Ops:
    """The integer multiply-adds: x86 instructions where the host has them, else plain IR that computes the
    same integers (no sum here can saturate: codes 0..63 or |values| <= 128, |inputs| <= 127)."""

    def __init__(self, b: ir.IRBuilder, host: Host) -> None:
        self.b, self.avx2 = b, host.x86 and host.has("avx2")

    def maddubs(self, u: ir.Value, s: ir.Value) -> ir.Value:
        """<32 x i8> unsigned codes, <32 x i8> signed inputs -> <16 x i16> sums of adjacent products."""
        b = self.b
        if self.avx2:
            return intrinsic(b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), [u, s])
        return _pair_sums(b, b.mul(b.zext(u, vec(I16, 32)), b.sext(s, vec(I16, 32))))

    def maddbs(self, w: ir.Value, x: ir.Value) -> ir.Value:
        """<32 x i8> signed weights, <32 x i8> signed inputs -> <16 x i16> sums of adjacent products: |w|
        times x with w's sign (pmaddubsw takes its first operand unsigned; |-128| reads as 128)."""
        b = self.b
        if self.avx2:
            mag = intrinsic(b, "llvm.abs.v32i8", w.type, [w, ir.Constant(ir.IntType(1), 0)])
            return self.maddubs(mag, intrinsic(b, "llvm.x86.avx2.psign.b", x.type, [x, w]))
        return _pair_sums(b, b.mul(b.sext(w, vec(I16, 32)), b.sext(x, vec(I16, 32))))

    def maddwd(self, a: ir.Value, c: ir.Value) -> ir.Value:
        """<16 x i16> x <16 x i16> -> <8 x i32> sums of adjacent products."""
        b = self.b
        if self.avx2:
            return intrinsic(b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), [a, c])
        return _pair_sums(b, b.mul(b.sext(a, vec(I32, 16)), b.sext(c, vec(I32, 16))))


def _pair_sums(b: ir.IRBuilder, p: ir.Value) -> ir.Value:
    """<2n x i> -> <n x i>: lane k = p[2k] + p[2k + 1]."""
    n = p.type.count
    return b.add(
        b.shuffle_vector(p, p, cvec(I32, range(0, n, 2))), b.shuffle_vector(p, p, cvec(I32, range(1, n, 2)))
    )


def _hsum_i(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    while v.type.count > 1:
        n = v.type.count // 2
        v = b.add(lanes(b, v, 0, n), lanes(b, v, n, n))
    return b.extract_element(v, _i32(0))


def _scaled_sum(b: ir.IRBuilder, ops: _Ops, pair_sums: list[ir.Value], scales: list[ir.Value]) -> ir.Value:
    """The sub-blocks' <16 x i16> pair sums times their <16 x i16> scale lanes, summed as one i32."""
    acc = None
    for p, sc in zip(pair_sums, scales):
        s = ops.maddwd(p, sc)
        acc = s if acc is None else b.add(acc, s)
    return _hsum_i(b, acc)


def _pairs(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """<8 x i16> -> <16 x i16>, each lane twice: a sub-block's min for both of its 16-code sums."""
    return b.shuffle_vector(v, v, cvec(I32, [i // 2 for i in range(16)]))


def _bcast(b: ir.IRBuilder, v: ir.Value, i: int, n: int) -> ir.Value:
    return b.shuffle_vector(v, v, cvec(I32, [i] * n))


class _Q4K:
    """Q4_K super-block (d | dmin | scales[12] | qs[128]): 8 sub-blocks of 32 codes 0..15, each with a
    6-bit scale and min (get_scale_min_k4's packing, unpacked as 32-bit words)."""

    size, qs = 144, 16

    @classmethod
    def codes(cls, b: ir.IRBuilder, w: ir.Value, j: int) -> ir.Value:
        c = load(b, w, cls.qs + 32 * (j // 2), vec(I8, 32))
        return b.lshr(c, cvec(I8, [4] * 32)) if j % 2 else b.and_(c, cvec(I8, [15] * 32))

    @classmethod
    def prepare(cls, b: ir.IRBuilder, host: Host, w: ir.Value) -> tuple[ir.Value, ...]:
        u = [load(b, w, 4 + 4 * i, I32) for i in range(3)]
        k1, k2, k3 = _i32(0x3F3F3F3F), _i32(0x0F0F0F0F), _i32(0x03030303)
        sc_hi = b.or_(b.and_(u[2], k2), b.shl(b.and_(b.lshr(u[0], _i32(6)), k3), _i32(4)))
        mn_hi = b.or_(b.and_(b.lshr(u[2], _i32(4)), k2), b.shl(b.and_(b.lshr(u[1], _i32(6)), k3), _i32(4)))
        words = [b.and_(u[0], k1), sc_hi, b.and_(u[1], k1), mn_hi]  # scales 0-3, 4-7, mins 0-3, 4-7
        v = ir.Constant(vec(I32, 4), None)
        for i, word in enumerate(words):
            v = b.insert_element(v, word, _i32(i))
        sm = b.zext(b.bitcast(v, vec(I8, 16)), vec(I16, 16))
        f16c = host.has("f16c")
        return half(b, w, 0, f16c), half(b, w, 2, f16c), sm, [cls.codes(b, w, j) for j in range(8)]

    @staticmethod
    def dot(b: ir.IRBuilder, ops: _Ops, prep: tuple[ir.Value, ...], x: ir.Value, acc: ir.Value) -> ir.Value:
        d, dmin, sm, codes = prep
        dx = b.load(b.bitcast(x, PF32), align=1)
        pair_sums = [ops.maddubs(codes[j], load(b, x, _CODES + 32 * j, vec(I8, 32))) for j in range(8)]
        isum = _scaled_sum(b, ops, pair_sums, [_bcast(b, sm, j, 16) for j in range(8)])
        mins = _pairs(b, lanes(b, sm, 8, 8))
        msum = ops.maddwd(load(b, x, _SUMS, vec(I16, 16)), mins)
        acc = b.fadd(acc, b.fmul(b.fmul(d, dx), b.sitofp(isum, F32)))
        return b.fsub(acc, b.fmul(b.fmul(dmin, dx), b.sitofp(_hsum_i(b, msum), F32)))


class _Q5K(_Q4K):
    """Q5_K super-block (d | dmin | scales[12] | qh[32] | qs[128]): Q4_K's with a fifth bit, bit j of
    qh[l] for element 32j + l: codes 0..31."""

    size, qs = 176, 48

    @classmethod
    def codes(cls, b: ir.IRBuilder, w: ir.Value, j: int) -> ir.Value:
        high = b.and_(b.lshr(load(b, w, 16, vec(I8, 32)), cvec(I8, [j] * 32)), cvec(I8, [1] * 32))
        return b.or_(super().codes(b, w, j), b.shl(high, cvec(I8, [4] * 32)))


class _Q6K:
    """Q6_K super-block (ql[128] | qh[64] | scales[16] int8 | d): 16 groups of 16 codes 0..63 (the value
    is the code - 32), one int8 scale a group; element order as formats_k's decoder."""

    size = 210

    @staticmethod
    def prepare(b: ir.IRBuilder, host: Host, w: ir.Value) -> tuple[ir.Value, ...]:
        scales = b.sext(load(b, w, 192, vec(I8, 16)), vec(I16, 16))
        codes = []
        for j in range(8):
            h, s = divmod(j, 4)
            low = load(b, w, 64 * h + 32 * (s % 2), vec(I8, 32))
            low = b.lshr(low, cvec(I8, [4] * 32)) if s // 2 else b.and_(low, cvec(I8, [15] * 32))
            top = load(b, w, 128 + 32 * h, vec(I8, 32))
            top = b.and_(b.lshr(top, cvec(I8, [2 * s] * 32)), cvec(I8, [3] * 32))
            codes.append(b.or_(low, b.shl(top, cvec(I8, [4] * 32))))
        return half(b, w, 208, host.has("f16c")), scales, codes

    @staticmethod
    def dot(b: ir.IRBuilder, ops: _Ops, prep: tuple[ir.Value, ...], x: ir.Value, acc: ir.Value) -> ir.Value:
        d, scales, codes = prep
        dx = b.load(b.bitcast(x, PF32), align=1)
        pair_sums = [ops.maddubs(codes[j], load(b, x, _CODES + 32 * j, vec(I8, 32))) for j in range(8)]
        # sub-block j's 16 pair sums: 8 of group 2j, then 8 of group 2j + 1
        picks = [cvec(I32, [2 * j] * 8 + [2 * j + 1] * 8) for j in range(8)]
        isum = _scaled_sum(b, ops, pair_sums, [b.shuffle_vector(scales, scales, m) for m in picks])
        bias = ops.maddwd(load(b, x, _SUMS, vec(I16, 16)), b.shl(scales, cvec(I16, [5] * 16)))  # 32 s_k sc_k
        return b.fadd(acc, b.fmul(b.fmul(d, dx), b.sitofp(b.sub(isum, _hsum_i(b, bias)), F32)))


class _IQ4XS:
    """IQ4_XS super-block (d | scales_h u16 | scales_l[4] | qs[128]): 8 sub-blocks of 32 4-bit indices into
    the IQ4_NL code book (-127..113), low nibbles first; sub-block j's scale is its 6-bit ls_j - 32."""

    size = 136

    @staticmethod
    def prepare(b: ir.IRBuilder, host: Host, w: ir.Value) -> tuple[ir.Value, ...]:
        sh = b.zext(load(b, w, 2, I16), I32)
        scales = ir.Constant(vec(I16, 8), None)
        for j in range(8):
            lo = b.and_(b.lshr(b.zext(load(b, w, 4 + j // 2, I8), I32), _i32(4 * (j % 2))), _i32(15))
            hi = b.shl(b.and_(b.lshr(sh, _i32(2 * j)), _i32(3)), _i32(4))
            scales = b.insert_element(scales, b.trunc(b.sub(b.or_(lo, hi), _i32(32)), I16), _i32(j))
        c = ctx_for(b, host)
        codes = [c.lookup(nibbles(b, load(b, w, 8 + 16 * j, vec(I8, 16))), KVALUES_IQ4NL) for j in range(8)]
        return half(b, w, 0, host.has("f16c")), scales, codes

    @staticmethod
    def dot(b: ir.IRBuilder, ops: _Ops, prep: tuple[ir.Value, ...], x: ir.Value, acc: ir.Value) -> ir.Value:
        d, scales, values = prep
        dx = b.load(b.bitcast(x, PF32), align=1)
        pair_sums = [ops.maddbs(values[j], load(b, x, _CODES + 32 * j, vec(I8, 32))) for j in range(8)]
        isum = _scaled_sum(b, ops, pair_sums, [_bcast(b, scales, j, 16) for j in range(8)])
        return b.fadd(acc, b.fmul(b.fmul(d, dx), b.sitofp(isum, F32)))


class _Q80:
    """Eight Q8_0 blocks (d | qs[32] int8, 34 bytes each) against one q8 block: a float step per 32 values,
    each block with its own scale."""

    size = 8 * 34

    @staticmethod
    def prepare(b: ir.IRBuilder, host: Host, w: ir.Value) -> tuple[ir.Value, ...]:
        f16c = host.has("f16c")
        return tuple((half(b, w, 34 * k, f16c), load(b, w, 34 * k + 2, vec(I8, 32))) for k in range(8))

    @staticmethod
    def dot(b: ir.IRBuilder, ops: _Ops, prep: tuple[ir.Value, ...], x: ir.Value, acc: ir.Value) -> ir.Value:
        dx = b.load(b.bitcast(x, PF32), align=1)
        ones = cvec(I16, [1] * 16)
        for k, (d, q) in enumerate(prep):
            isum = _hsum_i(b, ops.maddwd(ops.maddbs(q, load(b, x, _CODES + 32 * k, vec(I8, 32))), ones))
            acc = b.fadd(acc, b.fmul(b.fmul(d, dx), b.sitofp(isum, F32)))
        return acc


_BLOCKS: dict[T, type[_Q4K] | type[_Q6K] | type[_IQ4XS] | type[_Q80]] = {
    T.Q8_0: _Q80,
    T.Q4_K: _Q4K,
    T.Q5_K: _Q5K,
    T.Q6_K: _Q6K,
    T.IQ4_XS: _IQ4XS,
}


def _tile(mod: ir.Module, qtype: T, host: Host, rt: int, tt: int) -> ir.Function:
    """void tile(i8* w_row, i64 row_bytes, i8* x_tok, i64 ldx, float* y_tok_row, i64 ldy, i64 nb)."""
    block = _BLOCKS[qtype]
    fn = ir.Function(mod, ir.FunctionType(VOID, [P8, I64, P8, I64, PF32, I64, I64]), f"tile{rt}x{tt}")
    fn.linkage = "internal"
    w, row_bytes, x, ldx, y, ldy, nb = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ops = _Ops(b, host)
    accs = [[b.alloca(F32) for _ in range(tt)] for _ in range(rt)]
    for row in accs:
        for a in row:
            b.store(ir.Constant(F32, 0.0), a)
    with loop(b, c64(0), nb, 1) as blk:
        for i in range(rt):
            prep = block.prepare(
                b, host, b.gep(w, [b.add(b.mul(row_bytes, c64(i)), b.mul(blk, c64(block.size)))])
            )
            for t in range(tt):
                xb = b.gep(x, [b.add(b.mul(ldx, c64(t)), b.mul(blk, c64(Q8_BYTES)))])
                b.store(block.dot(b, ops, prep, xb, b.load(accs[i][t])), accs[i][t])
    for i in range(rt):
        for t in range(tt):
            b.store(b.load(accs[i][t]), b.gep(y, [b.add(b.mul(ldy, c64(t)), c64(i))]))
    b.ret_void()
    return fn


TYPES = frozenset(_BLOCKS)


def build(qtype: T, host: Host, rows: int = 2, toks: int = 4) -> ir.Module:
    """The module for one quant type: its tiles (full and ragged tails) and the exported qdot_<type>."""
    size = _BLOCKS[qtype].size
    mod = ir.Module(name=f"qdot_{qtype.name.lower()}")
    mod.triple = host.triple
    tiles = {(rt, tt): _tile(mod, qtype, host, rt, tt) for rt in {rows, 1} for tt in {toks, 1}}
    fn = ir.Function(mod, ir.FunctionType(VOID, QMM_ARGS), mod.name)
    w, row_bytes, x, ldx, n_tok, y, ldy, r0, r1 = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x8 = b.bitcast(x, P8)
    nb = b.udiv(row_bytes, c64(size))

    def rows_of(start: ir.Value, rt: int) -> ir.Value:
        with loop(b, start, r1, rt) as r:
            w_r = b.gep(w, [b.mul(r, row_bytes)])
            with loop(b, c64(0), n_tok, toks) as t:
                _call(b, tiles[rt, toks], w_r, row_bytes, x8, ldx, y, ldy, r, t, nb)
            with loop(b, t, n_tok, 1) as t1:
                _call(b, tiles[rt, 1], w_r, row_bytes, x8, ldx, y, ldy, r, t1, nb)
        return r

    rows_of(rows_of(r0, rows), 1)
    b.ret_void()
    return mod


def _call(b: ir.IRBuilder, tile: ir.Function, w_r, row_bytes, x, ldx, y, ldy, r, t, nb) -> None:
    b.call(
        tile, [w_r, row_bytes, b.gep(x, [b.mul(t, ldx)]), ldx, b.gep(y, [b.add(b.mul(t, ldy), r)]), ldy, nb]
    )


def quantize_fn(mod: ir.Module, linkage: str = "") -> ir.Function:
    """q8_quantize: each token's row of cols floats (cols a multiple of 256) as q8 blocks; `linkage`
    "internal" for a copy inside another module (the CPU share's request)."""
    fn = ir.Function(mod, ir.FunctionType(VOID, QUANT_ARGS), QUANTIZE)
    if linkage:
        fn.linkage = linkage
    x, cols, n_tok, ldx, out, ld_out = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vf = vec(F32, 32)
    with loop(b, c64(0), n_tok, 1) as t, loop(b, c64(0), b.udiv(cols, c64(Q8_BLOCK)), 1) as blk:
        src = b.gep(x, [b.add(b.mul(t, ldx), b.mul(blk, c64(Q8_BLOCK)))])
        dst = b.gep(out, [b.add(b.mul(t, ld_out), b.mul(blk, c64(Q8_BYTES)))])
        xs = [b.load(b.bitcast(b.gep(src, [c64(32 * j)]), vf.as_pointer()), align=4) for j in range(8)]
        m = None
        for v in xs:
            a = intrinsic(b, "llvm.fabs.v32f32", vf, [v])
            m = a if m is None else intrinsic(b, "llvm.maxnum.v32f32", vf, [m, a])
        while m.type.count > 1:
            n = m.type.count // 2
            m = intrinsic(b, f"llvm.maxnum.v{n}f32", vec(F32, n), [lanes(b, m, 0, n), lanes(b, m, n, n)])
        amax = b.extract_element(m, _i32(0))
        zero = b.fcmp_ordered("==", amax, ir.Constant(F32, 0.0))
        inv = b.select(zero, ir.Constant(F32, 0.0), b.fdiv(ir.Constant(F32, 127.0), amax))
        b.store(b.fdiv(amax, ir.Constant(F32, 127.0)), b.bitcast(dst, PF32), align=1)
        inv_v = splat(b, inv, 32)
        for j, v in enumerate(xs):
            q = b.fptosi(intrinsic(b, "llvm.rint.v32f32", vf, [b.fmul(v, inv_v)]), vec(I8, 32))
            b.store(q, b.bitcast(b.gep(dst, [c64(_CODES + 32 * j)]), vec(I8, 32).as_pointer()), align=1)
            w = b.sext(q, vec(I16, 32))
            for h in (0, 1):
                s = _hsum_i(b, lanes(b, w, 16 * h, 16))
                b.store(s, b.bitcast(b.gep(dst, [c64(_SUMS + 4 * j + 2 * h)]), I16.as_pointer()), align=1)
    b.ret_void()
    return fn


def build_quantize(host: Host) -> ir.Module:
    mod = ir.Module(name=QUANTIZE)
    mod.triple = host.triple
    quantize_fn(mod)
    return mod

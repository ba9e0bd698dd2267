"""IR for one fused SwiGLU expert over the tokens routed to it: gather, gate and up projections,
silu(gate) * up, down projection, router weight, scatter, all in one call without the GIL.

Legend: n = tokens routed to this expert, D = hidden size, F = expert FFN size.

    void expert(float* x, i64 D, i32* tok, float* tw, i32* slot, i64 n,
                i8* gate_fn, i8* gate_w, i64 gate_rb, i8* up_fn, i8* up_w, i64 up_rb,
                i8* down_fn, i8* down_w, i64 down_rb, i64 F, float* scratch, float* out)

The three projections call the per-quant-type `qmm` kernels through the function pointers given
(gate, up and down may use different quant types). scratch holds n * (2D + 2F) floats. Row i's
result, times tw[i], lands in out[slot[i]]: slots are (token, k) pairs, each owned by exactly one
expert, so experts running on different threads never write the same row.
"""

from __future__ import annotations

from llvmlite import ir

from strata.jit.host import Host
from strata.jit.irutil import F32, I32, I64, P8, PF32, PI32, VOID, c64, cvec, fma, intrinsic, loop, vec
from strata.jit.matmul_ir import QMM_ARGS

EXPERT_ARGS = (PF32, I64, PI32, PF32, PI32, I64, P8, P8, I64, P8, P8, I64, P8, P8, I64, I64, PF32, PF32)

# Cephes expf: exp(x) = 2^k * exp(r), r = x - k ln2 in [-ln2/2, ln2/2], exp(r) by a degree-6
# polynomial; ~1 ulp, like numpy's float32 exp. ln2 is split so k * LN2_HI is exact.
_LOG2E, _LN2_HI, _LN2_LO = 1.44269504088896341, 0.693359375, -2.12194440e-4
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# exp(x) for x >= 88.7 is inf in float32; for x <= -87.3 it would need a subnormal 2^k. Clamping
# keeps 2^k a normal float: silu's x / (1 + exp(-x)) is then ~x / 2.4e38 instead of x / inf, a
# difference below 1e-36.
_HI, _LO = 88.3762626647949, -87.3365447504019


def _cf(n: int, v: float) -> ir.Constant:
    return cvec(F32, [v] * n)


def vexp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """exp of a <n x float>, elementwise (the same bits for any n: no cross-lane work)."""
    n = x.type.count
    vf = x.type
    x = intrinsic(
        b,
        f"llvm.minnum.v{n}f32",
        vf,
        [intrinsic(b, f"llvm.maxnum.v{n}f32", vf, [x, _cf(n, _LO)]), _cf(n, _HI)],
    )
    k = intrinsic(b, f"llvm.floor.v{n}f32", vf, [fma(b, x, _cf(n, _LOG2E), _cf(n, 0.5))])
    r = b.fsub(x, b.fmul(k, _cf(n, _LN2_HI)))
    r = b.fsub(r, b.fmul(k, _cf(n, _LN2_LO)))
    p = _cf(n, _POLY[0])
    for c in _POLY[1:]:
        p = fma(b, p, r, _cf(n, c))
    e = b.fadd(b.fadd(b.fmul(b.fmul(p, r), r), r), _cf(n, 1.0))
    ki = b.fptosi(k, vec(I32, n))
    two_k = b.bitcast(b.shl(b.add(ki, cvec(I32, [127] * n)), cvec(I32, [23] * n)), vf)
    return b.fmul(e, two_k)


def swiglu(b: ir.IRBuilder, g: ir.Value, u: ir.Value, total: ir.Value, width: int) -> None:
    """g[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < total: the numpy silu's formula, in place."""

    def body(i: ir.Value, n: int) -> None:
        pg = b.bitcast(b.gep(g, [i]), vec(F32, n).as_pointer())
        pu = b.bitcast(b.gep(u, [i]), vec(F32, n).as_pointer())
        gv = b.load(pg, align=4)
        act = b.fdiv(gv, b.fadd(_cf(n, 1.0), vexp(b, b.fsub(_cf(n, 0.0), gv))))
        b.store(b.fmul(act, b.load(pu, align=4)), pg, align=4)

    with loop(b, c64(0), total, width) as i:
        body(i, width)
    with loop(b, i, total, 1) as j:  # tail: one lane at a time, the same ops per element
        body(j, 1)


def build(host: Host) -> ir.Module:
    mod = ir.Module(name="expert")
    mod.triple = host.triple
    fn = ir.Function(mod, ir.FunctionType(VOID, EXPERT_ARGS), "expert")
    (
        x,
        d,
        tok,
        tw,
        slot,
        n,
        gate_fn,
        gate_w,
        gate_rb,
        up_fn,
        up_w,
        up_rb,
        down_fn,
        down_w,
        down_rb,
        f,
        scratch,
        out,
    ) = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    qmm_t = ir.FunctionType(VOID, QMM_ARGS).as_pointer()
    xs = scratch  # [n, D]
    g = b.gep(xs, [b.mul(n, d)])  # [n, F]
    u = b.gep(g, [b.mul(n, f)])  # [n, F]
    y = b.gep(u, [b.mul(n, f)])  # [n, D]
    with loop(b, c64(0), n, 1) as i:  # gather the routed tokens' rows
        src = b.gep(x, [b.mul(b.sext(b.load(b.gep(tok, [i])), I64), d)])
        dst = b.gep(xs, [b.mul(i, d)])
        with loop(b, c64(0), d, 1) as j:
            b.store(b.load(b.gep(src, [j])), b.gep(dst, [j]))
    for kfn, w, rb, dst in ((gate_fn, gate_w, gate_rb, g), (up_fn, up_w, up_rb, u)):
        b.call(b.bitcast(kfn, qmm_t), [w, rb, xs, d, n, dst, f, c64(0), f])
    swiglu(b, g, u, b.mul(n, f), host.lanes)
    b.call(b.bitcast(down_fn, qmm_t), [down_w, down_rb, g, f, n, y, d, c64(0), d])
    with loop(b, c64(0), n, 1) as i:  # weight by the router and scatter to the (token, k) slots
        dst = b.gep(out, [b.mul(b.sext(b.load(b.gep(slot, [i])), I64), d)])
        src = b.gep(y, [b.mul(i, d)])
        wt = b.load(b.gep(tw, [i]))
        with loop(b, c64(0), d, 1) as j:
            b.store(b.fmul(b.load(b.gep(src, [j])), wt), b.gep(dst, [j]))
    b.ret_void()
    return mod

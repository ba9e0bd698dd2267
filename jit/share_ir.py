"""IR for the CPU share's one-row request (jit/share.py): a decode row's CPU experts, from the routed ids to
their weighted sum, in one call without the GIL and without a numpy call between the steps.

    i64 share_row(i64* ctl, i64 run, i64* table, i64* tpl_gu, i64 m_gu, i64* tpl_dn, i64 m_dn,
                  i32* ids, float* wts, i64 A, float* g, i64 F, i64 ldg, float* y, i64 D, float* out)

ids [A] holds the row's routed experts, -1 where the GPU computes the pair; wts [A] their weights. For the
i-th CPU expert e (in routing order) its gate and up tasks are the layer's template moved to it, tpl_gu
[4, m_gu] as (base, per expert id, per pair, per row) with coefficients (1, e, i, 1): the numpy path's
product, written here into `table` and run as one round through tasks.py's `task_run` (at address `run`,
on the task group's control block `ctl`). Then g [i, 0:F] = silu(g [i, 0:F]) * g [i, F:2F] in place (rows
ldg floats apart; the numpy silu's formula), the down tasks (tpl_dn [4, m_dn], reading g) as a second round
into y [i, D], and out [D] = sum over i of wts_i * y [i] (rows added in order, as numpy's sum over axis 0).
Returns the number of CPU experts.

On the H200 host the numpy steps between the two rounds (selection, task products, silu, the weighted sum)
took ~53 us a request with 15 task threads, nearly as long as the rounds' own reads of one expert
(perf/bench_share.py --shape 80b); every decode layer that hands the CPU a share waits on it.
"""

from __future__ import annotations

from llvmlite import ir

from strata.jit.expert_ir import swiglu
from strata.jit.host import Host
from strata.jit.irutil import F32, I32, I64, PF32, PI32, c64, loop, splat, vec

_PI64 = I64.as_pointer()
ARGS = (_PI64, I64, _PI64, _PI64, I64, _PI64, I64, PI32, PF32, I64, PF32, I64, I64, PF32, I64, PF32)
NAME = "share_row"
LAYOUT = "row1"  # part of the disk-cache key: bump when the function changes


def _tasks(b: ir.IRBuilder, table: ir.Value, tpl: ir.Value, m: ir.Value, es: ir.Value, u: ir.Value) -> None:
    """table [i * m + c] = tpl[c] + es[i] * tpl[m + c] + i * tpl[2m + c] + tpl[3m + c] for i < u, c < m."""
    with loop(b, c64(0), u, 1) as i:
        e = b.load(b.gep(es, [i]))
        row = b.gep(table, [b.mul(i, m)])
        with loop(b, c64(0), m, 1) as c:
            t = [b.load(b.gep(tpl, [b.add(b.mul(m, c64(k)), c)])) for k in range(4)]
            v = b.add(b.add(t[0], b.mul(e, t[1])), b.add(b.mul(i, t[2]), t[3]))
            b.store(v, b.gep(row, [c]))


def build(host: Host) -> ir.Module:
    mod = ir.Module(name=NAME)
    mod.triple = host.triple
    fn = ir.Function(mod, ir.FunctionType(I64, ARGS), NAME)
    ctl, run, table, tpl_gu, m_gu, tpl_dn, m_dn, ids, wts, a, g, f, ldg, y, d, out = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    run_t = ir.FunctionType(ir.VoidType(), (_PI64, _PI64, I64)).as_pointer()
    run_fn = b.inttoptr(run, run_t)
    es = b.alloca(I64, size=a)  # the CPU experts and their weights, in routing order
    ws = b.alloca(F32, size=a)
    count = b.alloca(I64)
    b.store(c64(0), count)
    with loop(b, c64(0), a, 1) as k:
        e = b.load(b.gep(ids, [k]))
        mine = b.icmp_signed(">=", e, ir.Constant(I32, 0))
        with b.if_then(mine):
            u = b.load(count)
            b.store(b.sext(e, I64), b.gep(es, [u]))
            b.store(b.load(b.gep(wts, [k])), b.gep(ws, [u]))
            b.store(b.add(u, c64(1)), count)
    u = b.load(count)
    width = host.lanes
    vf = vec(F32, width)
    acc_v, acc_s = b.alloca(vf), b.alloca(F32)  # the weighted sum's accumulators, whole vectors and the tail
    with b.if_else(b.icmp_signed("==", u, c64(0))) as (none, some):
        with none, loop(b, c64(0), d, 1) as j:
            b.store(ir.Constant(F32, 0.0), b.gep(out, [j]))
        with some:
            _tasks(b, table, tpl_gu, m_gu, es, u)
            b.call(run_fn, [ctl, table, b.sdiv(b.mul(u, m_gu), c64(10))])
            with loop(b, c64(0), u, 1) as i:
                gi = b.gep(g, [b.mul(i, ldg)])
                swiglu(b, gi, b.gep(gi, [f]), f, width)
            _tasks(b, table, tpl_dn, m_dn, es, u)
            b.call(run_fn, [ctl, table, b.sdiv(b.mul(u, m_dn), c64(10))])

            def weigh(j: ir.Value, n: int) -> None:  # out[j : j + n] = sum_i ws_i * y[i, j : j + n]
                t, acc = (vf, acc_v) if n == width else (F32, acc_s)
                b.store(ir.Constant(t, None) if n == width else ir.Constant(F32, 0.0), acc)
                with loop(b, c64(0), u, 1) as i:
                    w = b.load(b.gep(ws, [i]))
                    p = b.gep(y, [b.add(b.mul(i, d), j)])
                    if n == width:
                        v = b.load(b.bitcast(p, vf.as_pointer()), align=4)
                        b.store(b.fadd(b.load(acc), b.fmul(v, splat(b, w, n))), acc)
                    else:
                        b.store(b.fadd(b.load(acc), b.fmul(b.load(p), w)), acc)
                dst = b.gep(out, [j])
                b.store(b.load(acc), b.bitcast(dst, t.as_pointer()) if n == width else dst, align=4)

            with loop(b, c64(0), d, width) as j:
                weigh(j, width)
            with loop(b, j, d, 1) as j1:
                weigh(j1, 1)
    b.ret(u)
    return mod

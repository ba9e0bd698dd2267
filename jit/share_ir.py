"""IR for the CPU share's request (jit/share.py): the CPU's pairs of a decode pass, from the routed ids to
their weighted sums, in one call without the GIL and without a numpy call between the steps.

    i64 share_request(i64* ctl, i64 run, i64* table, i64* tpl_gu, i64 m_gu, i64* tpl_dn, i64 m_dn,
                      i32* ids, float* wts, i64 n, i64 A, float* h, float* x, float* g, i64 F, i64 ldg,
                      float* y, i64 D, float* out)

ids [n, A] holds the rows' routed experts, -1 where the GPU computes the pair; wts [n, A] their weights,
h [n, D] the rows. The CPU's pairs are put in order of expert (stable: row order within one), so an
expert's rows are read with its weights once, and each pair's row copied into x [p, D]. The j-th expert e,
its pairs starting at pair s, c of them, gets the layer's gate and up tasks moved to it: tpl_gu [4, m_gu]
as (base, per expert id, per pair, per row) with coefficients (1, e, s, c), the numpy path's product,
written into `table` and run as one round through tasks.py's `task_run` (at address `run`, on the task
group's control block `ctl`). Then g [p, 0:F] = silu(g [p, 0:F]) * g [p, F:2F] in place (rows ldg floats
apart; the numpy silu's formula), the down tasks (tpl_dn [4, m_dn], reading g) as a second round into
y [p, D], and out [t] = the sum over row t's pairs, in pair order, of w * y [p] (as numpy's add.at).
Returns the number of CPU pairs.

On the H200 host the numpy steps between the two rounds (selection, grouping, task products, silu, the
weighted sums) took ~53 us of a one-expert request with 15 task threads, nearly as long as the rounds' own
reads of the expert (perf/bench_share.py --shape 80b); every decode layer that hands the CPU a share waits
on it.
"""

from __future__ import annotations

from llvmlite import ir

from strata.jit.expert_ir import swiglu
from strata.jit.host import Host
from strata.jit.irutil import F32, I32, I64, PF32, PI32, c64, loop, splat, vec

_PI64 = I64.as_pointer()
ARGS = (
    *(_PI64, I64, _PI64, _PI64, I64, _PI64, I64),
    *(PI32, PF32, I64, I64, PF32, PF32, PF32, I64, I64, PF32, I64, PF32),
)
NAME = "share_request"
LAYOUT = "rows1"  # part of the disk-cache key: bump when the function changes


def _tasks(
    b: ir.IRBuilder, table: ir.Value, tpl: ir.Value, m: ir.Value, groups: tuple[ir.Value, ...]
) -> ir.Value:
    """table [j * m + k] = tpl[k] + e_j tpl[m + k] + s_j tpl[2m + k] + c_j tpl[3m + k] for the groups
    (ge, gs, gc, count) and k < m; returns the task count."""
    ge, gs, gc, count = groups
    n_groups = b.load(count)
    with loop(b, c64(0), n_groups, 1) as j:
        coef = [b.load(b.gep(a, [j])) for a in (ge, gs, gc)]
        row = b.gep(table, [b.mul(j, m)])
        with loop(b, c64(0), m, 1) as k:
            t = [b.load(b.gep(tpl, [b.add(b.mul(m, c64(q)), k)])) for q in range(4)]
            v = b.add(t[0], b.mul(coef[0], t[1]))
            v = b.add(v, b.add(b.mul(coef[1], t[2]), b.mul(coef[2], t[3])))
            b.store(v, b.gep(row, [k]))
    return b.sdiv(b.mul(n_groups, m), c64(10))


def _copy(
    b: ir.IRBuilder, dst: ir.Value, src: ir.Value, d: ir.Value, width: int, scale: ir.Value | None
) -> None:
    """dst [0, d) = src [0, d) (scale given: dst += scale * src), whole vectors then a tail."""
    vf = vec(F32, width)

    def body(j: ir.Value, n: int) -> None:
        s, t = b.gep(src, [j]), b.gep(dst, [j])
        if n > 1:
            s, t = b.bitcast(s, vf.as_pointer()), b.bitcast(t, vf.as_pointer())
        v = b.load(s, align=4)
        if scale is not None:
            v = b.fadd(b.load(t, align=4), b.fmul(v, splat(b, scale, n) if n > 1 else scale))
        b.store(v, t, align=4)

    with loop(b, c64(0), d, width) as j:
        body(j, width)
    with loop(b, j, d, 1) as j1:
        body(j1, 1)


def build(host: Host) -> ir.Module:
    mod = ir.Module(name=NAME)
    mod.triple = host.triple
    fn = ir.Function(mod, ir.FunctionType(I64, ARGS), NAME)
    ctl, run, table, tpl_gu, m_gu, tpl_dn, m_dn, ids, wts, n, a, h, x, g, f, ldg, y, d, out = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    run_fn = b.inttoptr(run, ir.FunctionType(ir.VoidType(), (_PI64, _PI64, I64)).as_pointer())
    most = b.mul(n, a)
    pe, pt, ps = (
        b.alloca(I64, size=most),
        b.alloca(I64, size=most),
        b.alloca(I64, size=most),
    )  # expert, row, slot
    ge, gs, gc = b.alloca(I64, size=most), b.alloca(I64, size=most), b.alloca(I64, size=most)
    count, groups, at = b.alloca(I64), b.alloca(I64), b.alloca(I64)
    b.store(c64(0), count)
    with loop(b, c64(0), most, 1) as q:  # the CPU's pairs, each placed by insertion (stable) by expert
        e = b.load(b.gep(ids, [q]))
        with b.if_then(b.icmp_signed(">=", e, ir.Constant(I32, 0))):
            e64, p = b.sext(e, I64), b.load(count)
            b.store(p, at)
            head, body, done = (fn.append_basic_block(s) for s in ("shift_head", "shift", "shift_done"))
            b.branch(head)
            b.position_at_end(head)
            i = b.load(at)
            prev = b.sub(i, c64(1))
            more = b.icmp_signed(">", i, c64(0))
            later = b.select(more, b.load(b.gep(pe, [b.select(more, prev, c64(0))])), c64(-1))
            b.cbranch(b.and_(more, b.icmp_signed(">", later, e64)), body, done)
            b.position_at_end(body)
            for arr in (pe, pt, ps):
                b.store(b.load(b.gep(arr, [prev])), b.gep(arr, [i]))
            b.store(prev, at)
            b.branch(head)
            b.position_at_end(done)
            i = b.load(at)
            b.store(e64, b.gep(pe, [i]))
            b.store(b.sdiv(q, a), b.gep(pt, [i]))
            b.store(q, b.gep(ps, [i]))
            b.store(b.add(p, c64(1)), count)
    pairs = b.load(count)
    width = host.lanes
    with loop(b, c64(0), b.mul(n, d), 1) as j:
        b.store(ir.Constant(F32, 0.0), b.gep(out, [j]))
    with b.if_then(b.icmp_signed(">", pairs, c64(0))):
        b.store(c64(0), groups)
        with loop(b, c64(0), pairs, 1) as p:  # each pair's row into x; a group a run of one expert
            _copy(b, b.gep(x, [b.mul(p, d)]), b.gep(h, [b.mul(b.load(b.gep(pt, [p])), d)]), d, width, None)
            e = b.load(b.gep(pe, [p]))
            first = b.icmp_signed("==", p, c64(0))
            new = b.or_(
                first, b.icmp_signed("!=", e, b.load(b.gep(pe, [b.select(first, p, b.sub(p, c64(1)))])))
            )
            with b.if_then(new):
                k = b.load(groups)
                b.store(e, b.gep(ge, [k]))
                b.store(p, b.gep(gs, [k]))
                b.store(c64(0), b.gep(gc, [k]))
                b.store(b.add(k, c64(1)), groups)
            last = b.gep(gc, [b.sub(b.load(groups), c64(1))])
            b.store(b.add(b.load(last), c64(1)), last)
        grouped = (ge, gs, gc, groups)
        b.call(run_fn, [ctl, table, _tasks(b, table, tpl_gu, m_gu, grouped)])
        with loop(b, c64(0), pairs, 1) as p:
            gp = b.gep(g, [b.mul(p, ldg)])
            swiglu(b, gp, b.gep(gp, [f]), f, width)
        b.call(run_fn, [ctl, table, _tasks(b, table, tpl_dn, m_dn, grouped)])
        with loop(b, c64(0), pairs, 1) as p:  # out [t] += w * y [p], in pair order
            t = b.load(b.gep(pt, [p]))
            w = b.load(b.gep(wts, [b.load(b.gep(ps, [p]))]))
            _copy(b, b.gep(out, [b.mul(t, d)]), b.gep(y, [b.mul(p, d)]), d, width, w)
    b.ret(pairs)
    return mod

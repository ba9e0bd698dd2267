"""IR for the CPU share's request (jit/share.py): the CPU's pairs of a decode pass, from the routed ids to
their weighted sums, in one call without the GIL and without a numpy call between the steps.

    i64 share_request(i64* ctl, i64 run, i64* table, i64* tpl_gu, i64 m_gu, i64* tpl_dn, i64 m_dn,
                      i32* ids, float* wts, i64 n, i64 A, float* h, float* x, float* g, i64 F, i64 ldg,
                      float* y, i64 D, float* out, i64* calls, i8* xq, i64 ldxq, i8* gq, i64 ldgq)

ids [n, A] holds the rows' routed experts, -1 where the GPU computes the pair; wts [n, A] their weights,
h [n, D] the rows. The CPU's pairs are put in order of expert (stable: row order within one), so an
expert's rows are read with its weights once, and each pair's row copied into x [p, D]. The j-th expert e,
its pairs starting at pair s, c of them, gets the layer's gate and up tasks moved to it: tpl_gu [4, m_gu]
as (base, per expert id, per pair, per row) with coefficients (1, e, s, c), the numpy path's product,
written into `table` and run as one round through tasks.py's `task_run` (at address `run`, on the task
group's control block `ctl`). Then g [p, 0:F] = silu(g [p, 0:F]) * g [p, F:2F] in place (rows ldg floats
apart; the numpy silu's formula), the down tasks (tpl_dn [4, m_dn], reading g) as a second round into
y [p, D], and out [t] = the sum over row t's pairs, in pair order, of w * y [p] (as numpy's add.at);
calls [t] += row t's pairs. Returns the number of CPU pairs. Where the layer's products take int8 inputs
(qdot_ir.py), x is quantized into the q8 rows xq [p, ldxq bytes] before the first round and g [p, 0:F] into
gq [p, ldgq bytes] before the second; ldxq or ldgq 0: that round's products read the floats.

On the H200 host the numpy steps between the two rounds (selection, grouping, task products, silu, the
weighted sums) took ~53 us of a one-expert request with 15 task threads, nearly as long as the rounds' own
reads of the expert (perf/bench_share.py --shape 80b); every decode layer that hands the CPU a share waits
on it.
"""

from __future__ import annotations

from llvmlite import ir

from strata.jit.expert_ir import swiglu
from strata.jit.host import Host
from strata.jit.irutil import F32, I32, I64, P8, PF32, PI32, c64, loop, splat, vec
from strata.jit.qdot_ir import quantize_fn

_PI64 = I64.as_pointer()
ARGS = (
    *(_PI64, I64, _PI64, _PI64, I64, _PI64, I64),
    *(PI32, PF32, I64, I64, PF32, PF32, PF32, I64, I64, PF32, I64, PF32, _PI64),
    *(P8, I64, P8, I64),
)
NAME, SERVE, SILU = "share_request", "share_serve", "share_silu"
LAYOUT = "serve4"  # part of the disk-cache key: bump when the functions change
# share_serve(i64* mb, i64 last, i64 budget_us, i64 wait, i64 usleep, i64* args, i64 request, i64* stats,
#             i64 clock): the mailbox's control words, the last ticket answered, the wait's budget and
#             tasks.py's wait_change with libc's usleep, each layer's share_request arguments [L, len(ARGS)]
#             (the row count's slot filled per request), share_request, the counters [STATS] and libc's
#             clock_gettime
SERVE_ARGS = (_PI64, I64, I64, I64, I64, _PI64, I64, _PI64, I64)
STAT_REQUESTS, STAT_NS, STAT_YIELD = (
    0,
    1,
    2,
)  # requests answered, ns spent on them; nonzero: leave each to Python
STATS = 3
N_SLOT = 9  # share_request's row count among ARGS


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
    _request(mod, host, _silu_rows(mod, host))
    _serve(mod)
    return mod


def _silu_rows(mod: ir.Module, host: Host) -> ir.Function:
    """share_silu(float* g, i64 rows, i64 F, i64 ldg): g [r, 0:F] = silu(g [r, 0:F]) * g [r, F:2F], the
    request's step between its rounds, exported for the numpy steps (the low-RAM arena's), so both ways
    quantize the same g for down."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), (PF32, I64, I64, I64)), SILU)
    g, rows, f, ldg = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    with loop(b, c64(0), rows, 1) as p:
        gp = b.gep(g, [b.mul(p, ldg)])
        swiglu(b, gp, b.gep(gp, [f]), f, host.lanes)
    b.ret_void()
    return fn


def _serve(mod: ir.Module) -> None:
    """The server's loop: wait for a new ticket (tasks.py's wait_change, without the GIL), run the layer's
    request straight from and into the mailbox, store the ticket as done (release: the answer first), count;
    return the last ticket answered when a wait's budget runs out, or the new ticket unanswered when
    stats[STAT_YIELD] asks Python to answer it (a stand-in for the arithmetic, tests)."""
    from strata.jit.share import MB_DONE, MB_LAYER, MB_REQ, MB_ROWS

    fn = ir.Function(mod, ir.FunctionType(I64, SERVE_ARGS), SERVE)
    mb, last0, budget, wait, usleep, args, request, stats, clock = fn.args
    blk = {k: fn.append_basic_block(k) for k in ("entry", "loop", "got", "serve", "out")}
    b = ir.IRBuilder(blk["entry"])
    wait_fn = b.inttoptr(wait, ir.FunctionType(I64, (_PI64, I64, I64, I64)).as_pointer())
    req_fn = b.inttoptr(request, ir.FunctionType(I64, ARGS).as_pointer())
    ts_t = ir.LiteralStructType([I64, I64])
    clock_fn = b.inttoptr(clock, ir.FunctionType(I32, (I32, ts_t.as_pointer())).as_pointer())
    ts = b.alloca(ts_t)

    def now() -> ir.Value:
        b.call(clock_fn, [ir.Constant(I32, 1), ts])  # CLOCK_MONOTONIC
        sec = b.load(b.gep(ts, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
        nsec = b.load(b.gep(ts, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
        return b.add(b.mul(sec, c64(1_000_000_000)), nsec)

    b.branch(blk["loop"])
    b.position_at_end(blk["loop"])
    last = b.phi(I64)
    last.add_incoming(last0, blk["entry"])
    t = b.call(wait_fn, [b.gep(mb, [c64(MB_REQ)]), last, budget, usleep])
    b.cbranch(b.icmp_signed("==", t, last), blk["out"], blk["got"])
    b.position_at_end(blk["got"])
    yield_ = b.icmp_signed("!=", b.load_atomic(b.gep(stats, [c64(STAT_YIELD)]), "monotonic", 8), c64(0))
    b.cbranch(yield_, blk["out"], blk["serve"])
    b.position_at_end(blk["serve"])
    t0 = now()
    li = b.load_atomic(b.gep(mb, [c64(MB_LAYER)]), "monotonic", 8)
    n = b.load_atomic(b.gep(mb, [c64(MB_ROWS)]), "monotonic", 8)
    row = b.gep(args, [b.mul(li, c64(len(ARGS)))])
    vals = []
    for k, ty in enumerate(ARGS):
        v = n if k == N_SLOT else b.load(b.gep(row, [c64(k)]))
        vals.append(b.inttoptr(v, ty) if ty.is_pointer else v)
    b.call(req_fn, vals)
    b.store_atomic(t, b.gep(mb, [c64(MB_DONE)]), "release", 8)
    for k, v in ((STAT_REQUESTS, c64(1)), (STAT_NS, b.sub(now(), t0))):
        p = b.gep(stats, [c64(k)])
        b.store(b.add(b.load(p), v), p)
    last.add_incoming(t, blk["serve"])
    b.branch(blk["loop"])
    b.position_at_end(blk["out"])
    out = b.phi(I64)
    out.add_incoming(last, blk["loop"])
    out.add_incoming(t, blk["got"])
    b.ret(out)


def _request(mod: ir.Module, host: Host, silu: ir.Function) -> None:
    fn = ir.Function(mod, ir.FunctionType(I64, ARGS), NAME)
    ctl, run, table, tpl_gu, m_gu, tpl_dn, m_dn, ids, wts, n, a, h, x, g, f, ldg, y, d, out, calls = fn.args[
        :20
    ]
    xq, ldxq, gq, ldgq = fn.args[20:]
    quantize = quantize_fn(mod, "internal")
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
        with b.if_then(b.icmp_signed(">", ldxq, c64(0))):
            b.call(quantize, [x, d, pairs, d, xq, ldxq])
        b.call(run_fn, [ctl, table, _tasks(b, table, tpl_gu, m_gu, grouped)])
        b.call(silu, [g, pairs, f, ldg])
        with b.if_then(b.icmp_signed(">", ldgq, c64(0))):
            b.call(quantize, [g, f, pairs, ldg, gq, ldgq])
        b.call(run_fn, [ctl, table, _tasks(b, table, tpl_dn, m_dn, grouped)])
        with loop(b, c64(0), pairs, 1) as p:  # out [t] += w * y [p], in pair order
            t = b.load(b.gep(pt, [p]))
            c = b.gep(calls, [t])
            b.store(b.add(b.load(c), c64(1)), c)
            w = b.load(b.gep(wts, [b.load(b.gep(ps, [p]))]))
            _copy(b, b.gep(out, [b.mul(t, d)]), b.gep(y, [b.mul(p, d)]), d, width, w)
    b.ret(pairs)

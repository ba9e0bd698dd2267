"""The decoder layer's FFN as kernel launches (strata/gpu/layers.py has the layer and its mixer): routed
experts (gemv-fused routing for decode rows; the int8 decode kernels per (row, expert) pair for passes up to
`Ops.moe_gemv_rows` rows, experts grouped by token for longer ones),
the tiers' lookups and the CPU's share, a dense FFN, and Qwen3-Next's gated shared expert.

Legend as layers.py: N = rows, D = hidden, E = experts, A = active experts, F = expert width, P = N * A.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strata.gpu.kernels import moe
from strata.gpu.ops import GEMV_ROWS, Ops
from strata.gpu.runtime import ptr, side_branch
from strata.gpu.tiers import COLLECT_TIMEOUT_NS
from strata.gpu.weights import same_kind

if TYPE_CHECKING:
    from strata.gpu.layers import Activations, Dims, LayerWeights, SharedExpert


def run_ffn(ops: Ops, w: LayerWeights, dm: Dims, act: Activations, n: int) -> None:
    """x[:n] += ffn(its input): norm(x), or act.h for a layer without ffn_norm (as run_mixer).

    Decode rows of a MoE layer with a shared expert run the shared expert's products on a side branch
    (runtime.side_branch) beside the routed experts: both read only the normed input, and the routed kernels
    leave most SMs idle (a few blocks per expert; misses wait on PCIe). The shared expert's add into x still
    comes after the routed one, so x sums in the same order as on one stream."""
    small = n <= GEMV_ROWS
    side = side_branch() if small and dm.n_expert and w.shared is not None else None
    if dm.n_expert:
        _route(ops, w, dm, act, n)
        if side is not None:
            assert w.shared is not None
            with side.fork():
                _shared_products(ops, w.shared, dm, act, n, small)
        _experts(ops, w, dm, act, n)
    else:
        _dense(ops, w, dm, act, n)
    if w.shared is not None:
        if side is None:
            _shared_products(ops, w.shared, dm, act, n, small)
        else:
            side.join()
        ops.gated_add(act.x, act.sy, act.sg, n, dm.d)
    if small and w.tier is not None and w.tier.share is not None:  # the CPU's share, computed meanwhile
        ops.cpu_collect(act.x, n, dm.d, w.tier.share, COLLECT_TIMEOUT_NS)


def _shared_products(ops: Ops, s: SharedExpert, dm: Dims, act: Activations, n: int, small: bool) -> None:
    """The shared expert's sy = down(silu(gate . h) * (up . h)) and sg = h . gate_inp, which run_ffn adds into
    x as x += sigmoid(sg) * sy; h = the FFN's normed input, which the routed step left in act.h."""
    f, h = dm.shared_ff, act.h
    groups = [s.gate_up] if same_kind(s.gate_up) else [[m] for m in s.gate_up]
    for j, ms in enumerate(groups):
        out = ptr(act.sgu, 4 * f * j)
        if small:
            ops.matvec(ms, h, n, out, ldy=2 * f)
        else:
            ops.matmul(ms, h, n, out, ldc=2 * f)
    if small:
        ops.matvec([s.down], act.sgu, n, act.sy, silu_mul=True)
    else:
        ops.matmul(s.down, act.sgu, n, act.sy, silu_mul=True)
    ops.matvec([s.gate_inp], h, n, act.sg)


def _per_pair(ops: Ops, n: int) -> bool:
    """Whether a pass of n rows runs its experts per (row, expert) pair (ops.py's MOE_GEMV_ROWS says why)."""
    return n <= ops.moe_gemv_rows


def _q8(ops: Ops, w: LayerWeights, dm: Dims, n: int) -> bool:
    """Rows whose experts run per pair on the int8-input kernels: the router then quantizes h too."""
    return _per_pair(ops, n) and ops.takes_q8(w.gate, w.up, w.down) and dm.ffn % 32 == 0


def _route(ops: Ops, w: LayerWeights, dm: Dims, act: Activations, n: int) -> None:
    """The router: h = the normed input (or act.h as it stands), ids and wts the chosen experts; the int8
    codes of h too where the experts run per pair on int8 inputs; the tiers' counts, and for decode rows
    the riders' admission and the CPU hand-off."""
    x, h, a, e = act.x, act.h, dm.top_k, dm.n_expert
    assert w.router is not None
    # the router stays a gemv at any n: fp32 logits, so expert choice matches the CPU path
    q8 = _q8(ops, w, dm, n)
    fused = w.ffn_norm is not None and ops.split and n <= GEMV_ROWS  # router_topk quantizes h itself
    if w.ffn_norm is None:  # act.h is the input as it stands (hyper-connections): no norm to fuse
        if n > GEMV_ROWS and w.router.qtype == 0:
            ops.router_logits(h, n, w.router, act.router)
        else:
            ops.matvec([w.router], h, n, act.router)
        ops.topk(act.router, n, e, a, dm.norm_topk, act.ids, act.wts)
    elif fused:  # routing in the router's own launch
        ops.router_topk(
            w.router,
            x,
            n,
            act.router,
            w.ffn_norm,
            dm.eps,
            h,
            a,
            dm.norm_topk,
            act.ids,
            act.wts,
            act.counter,
            act.hq if q8 else None,
            act.hds if q8 else None,
        )
    elif n > GEMV_ROWS and w.router.qtype == 0:  # prefill: norm once, then the router as one fp32 GEMM
        ops.rmsnorm(x, w.ffn_norm, dm.eps, n, dm.d, h)
        ops.router_logits(h, n, w.router, act.router)
        ops.topk(act.router, n, e, a, dm.norm_topk, act.ids, act.wts)
    else:
        ops.matvec([w.router], x, n, act.router, norm=w.ffn_norm, eps=dm.eps, h_out=h)
        ops.topk(act.router, n, e, a, dm.norm_topk, act.ids, act.wts)
    if q8 and not fused:
        ops.q8_rows(h, n, dm.d, act.hq, act.hds)
    pairs = n * a
    ahead = w.tier.lookahead if n <= GEMV_ROWS and w.tier is not None else None
    if (
        w.tier is not None
    ):  # (with the lookahead, its launch raises the branch's stop: the link is the experts')
        ops.tier_count(
            act.ids,
            pairs,
            a,
            w.tier.where,
            w.tier.expert_bytes,
            w.tier.counts,
            w.tier.route,
            None if ahead is None else ahead.stop,
        )
        if n <= GEMV_ROWS and w.tier.share is not None:  # before the GPU's experts, so the CPU overlaps them
            ops.cpu_publish(h, act.ids, act.wts, n, a, dm.d, w.tier)
        if n <= GEMV_ROWS and w.tier.ride is not None:  # riders it routes land before the experts read them
            ops.admit(act.ids, pairs, w.tier)


def _experts(ops: Ops, w: LayerWeights, dm: Dims, act: Activations, n: int) -> None:
    """x[:n] += the routed experts' weighted sum for the routing _route left in act."""
    x, h, a, e = act.x, act.h, dm.top_k, dm.n_expert
    pairs = n * a
    if _per_pair(ops, n):
        ahead = w.tier.lookahead if n <= GEMV_ROWS and w.tier is not None else None
        if _q8(ops, w, dm, n):
            ops.moe_q8(w.gate, w.up, w.down, act.ids, act.wts, a, act.hq, act.hds, n, act.aq, act.ads, x)
        else:
            ops.moe_gate_up(w.gate, w.up, act.ids, a, h, pairs, act.gu)
            ops.moe_down(w.down, act.ids, act.wts, a, act.gu, n, x)
        if ahead is not None:
            assert w.tier is not None
            ahead.restore(w.tier.layer, act.ids, pairs)
        return
    ops.moe_group(
        act.ids,
        pairs,
        a,
        e,
        act.counts,
        act.offsets,
        act.cursor,
        act.tiles,
        act.n_tiles,
        act.rows,
        act.tok_of_row,
    )
    grid = moe.max_tiles(pairs, e)
    f = dm.ffn
    for m, col in ((w.gate, 0), (w.up, f)):  # gate and up side by side in each row of gu [P, 2F]
        ops.matmul(
            m,
            h,
            pairs,
            ptr(act.gu, 4 * col),
            ldc=2 * f,
            a_index=act.tok_of_row,
            tiles=act.tiles,
            n_tiles=act.n_tiles,
            grid_rows=grid,
        )
    ops.matmul(
        w.down, act.gu, pairs, act.y, silu_mul=True, tiles=act.tiles, n_tiles=act.n_tiles, grid_rows=grid
    )
    ops.moe_combine(act.y, act.rows, act.wts, a, dm.d, n, x)


def _dense(ops: Ops, w: LayerWeights, dm: Dims, act: Activations, n: int) -> None:
    x, h, f = act.x, act.h, dm.ffn
    if n <= GEMV_ROWS:
        if same_kind([w.gate, w.up]) and ops.takes_q8(
            w.gate, w.up
        ):  # gate|up: one product, norm in its staging
            ops.matvec([w.gate, w.up], x, n, act.gu, norm=w.ffn_norm, eps=dm.eps)
        else:
            ops.matvec([w.gate], x, n, act.gu, ldy=2 * f, norm=w.ffn_norm, eps=dm.eps, h_out=h)
            ops.matvec([w.up], h, n, ptr(act.gu, 4 * f), ldy=2 * f)
        ops.matvec([w.down], act.gu, n, x, accumulate=True, silu_mul=True)
        return
    ops.rmsnorm(x, w.ffn_norm, dm.eps, n, dm.d, h)
    ops.matmul(w.gate, h, n, act.gu, ldc=2 * f)
    ops.matmul(w.up, h, n, ptr(act.gu, 4 * f), ldc=2 * f)
    ops.matmul(w.down, act.gu, n, x, accumulate=True, silu_mul=True)

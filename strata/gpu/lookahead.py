"""The device side of lookahead prefetch (strata.tiers.lookahead says why and what): staging slots, the side
branch a decode layer forks at its start, the stop its router raises, and the join and restore after its
experts.

Inside a captured decode graph the fork and join are edges: the branch (the predicted router, then the
`prefetch` copy, kernels/tiers.py) runs beside the mixer's kernels, copying predicted misses best first until
the main stream's router is done and raises `stop` (in tier_count's launch). So the experts never wait for the
branch, and the copies fill whatever time the mixer leaves (a DeltaNet layer's more than an attention layer's
at short context). The mixer's launch that adds into x waits for the branch's router to have read x (an edge,
no copy). One set of K staging slots serves every layer: layer l + 1 forks after layer l's restore.
"""

from __future__ import annotations

from typing import Any

from strata.gpu.runtime import DEVICE_TO_DEVICE, Kernels, cupy_module, i32, i64, launch, ptr
from strata.tiers.layout import ExpertLayout
from strata.tiers.lookahead import STATS

# blocks of the copy: each keeps 16 KB of pinned reads in flight; 24 of them (~400 KB) cover the link's
# bandwidth-latency product (50 GB/s x a few us) without taking many of the SMs the mixer runs on
BLOCKS = 24


class Lookahead:
    def __init__(
        self, kernels: Kernels, layout: ExpertLayout, table: Any, where: Any, k: int, rows: int
    ) -> None:
        """table [L, P, E] int64 (the decode table) and where [L, E] int32: GpuTiers' device arrays."""
        cp = cupy_module()
        self.kernels, self.layout, self.table, self.where, self.k = kernels, layout, table, where, k
        e, a = layout.n_expert, layout.top_k
        self.stage = [cp.empty(k * s, cp.uint8) for s in layout.strides]  # part-major, as the slots
        self.picked = cp.full(k, -1, cp.int32)
        self.saved = cp.zeros(3 * k, cp.int64)
        self.landed = cp.zeros(
            3 * k, cp.int32
        )  # per part of a pick: blocks done with their slice (restore zeroes)
        self.stop = cp.zeros(1, cp.int32)  # raised by the layer's router, lowered by its restore
        # parts landed, used, bytes used, bytes wasted, bytes copied, ns the branch ran: read and zeroed per
        # pass
        self.stats = cp.zeros(STATS, cp.uint64)
        self.logits = cp.empty((rows, e), cp.float32)
        self.ids = cp.empty(rows * a, cp.int32)
        self.wts = cp.empty(rows * a, cp.float32)
        self.counter = cp.zeros(1, cp.int32)
        # each MoE layer's predicted experts [L, rows, A], best first (-1: that layer did not predict), for
        # --record-routes: read and reset per pass by GpuTiers
        self.pred = cp.full((len(layout.layers), rows, a), -1, cp.int32)
        self.recording = False  # set before the graphs are captured: each fork then copies its picks to pred
        self.side = cp.cuda.Stream(non_blocking=True)
        self.forked = cp.cuda.Event(disable_timing=True)
        self.routed = cp.cuda.Event(disable_timing=True)
        self.ended = cp.cuda.Event(disable_timing=True)
        self._part_bytes = [[p.nbytes for p in lay.parts] for lay in layout.layers]

    @staticmethod
    def nbytes_for(layout: ExpertLayout, k: int, rows: int) -> int:
        """VRAM it holds: K staging slots and the branch's buffers."""
        e, a, n_l = layout.n_expert, layout.top_k, len(layout.layers)
        return k * layout.slot_bytes + 4 * rows * (e + 2 * a + n_l * a) + 44 * k + 64

    def fork(
        self, ops: Any, li: int, router: Any, norm: Any, eps: float, x: Any, n: int, norm_topk: bool
    ) -> None:
        """At decode layer li's start (on the current stream): on the side branch, route x[:n] with the
        layer's router (after norm; None: x is a router input as it stands, hyper-connections' mixed input)
        and copy predicted misses ahead until the layer's tier_count raises `stop`; the mixer must call
        `read_done` before it writes x."""
        cp = cupy_module()
        main = cp.cuda.get_current_stream()
        lay = self.layout
        e, a = lay.n_expert, lay.top_k
        self.forked.record(main)
        self.side.wait_event(self.forked)
        with self.side:
            if norm is None:  # the fused router launch takes a norm: the product, then the top-k
                ops.matvec([router], x, n, self.logits)
                ops.topk(self.logits, n, e, a, norm_topk, self.ids, self.wts)
            else:
                ops.router_topk(
                    router, x, n, self.logits, norm, eps, None, a, norm_topk, self.ids, self.wts, self.counter
                )
            self.routed.record(self.side)
            if self.recording:  # a copy node, no kernel to load inside a capture
                dst = self.pred.data.ptr + 4 * li * self.pred.shape[1] * a
                src, side = self.ids.data.ptr, self.side.ptr
                cp.cuda.runtime.memcpyAsync(dst, src, 4 * n * a, DEVICE_TO_DEVICE, side)
            launch(
                self.kernels["prefetch"],
                (BLOCKS,),
                256,
                (
                    self.ids,
                    i32(n),
                    i32(a),
                    ptr(self.where, 4 * li * e),
                    ptr(self.table, 8 * li * 3 * e),
                    i32(e),
                    i32(self.k),
                    *(ptr(s) for s in self.stage),
                    *(i64(s) for s in lay.strides),
                    *(i64(b) for b in self._part_bytes[li]),
                    self.picked,
                    self.saved,
                    self.landed,
                    self.stop,
                    self.stats,
                ),
            )
            self.ended.record(self.side)

    def read_done(self) -> None:
        """Before the mixer adds into x (current stream): the branch's router has read it."""
        cupy_module().cuda.get_current_stream().wait_event(self.routed)

    def restore(self, li: int, ids: Any, pairs: int) -> None:
        """After the layer's experts (current stream): join the branch, point the table's entries back at the
        arena, and count the landed picks against the routed ids [pairs]."""
        cp = cupy_module()
        cp.cuda.get_current_stream().wait_event(self.ended)
        e = self.layout.n_expert
        launch(
            self.kernels["prefetch_restore"],
            (1,),
            128,
            (
                ptr(self.table, 8 * li * 3 * e),
                i32(e),
                i32(self.k),
                self.picked,
                self.saved,
                self.landed,
                self.stop,
                ids,
                i32(pairs),
                *(i64(b) for b in self._part_bytes[li]),
                self.stats,
            ),
        )


def fork_for(
    ops: Any, tier: Any, router: Any, norm: Any, eps: float, x: Any, n: int, norm_topk: bool, decode: bool
) -> Lookahead | None:
    """A layer's lookahead forked on its router input x[:n] (norm as Lookahead.fork takes it), for decode
    rows of a layer that has one (tier: its gpu.tiers.TierHook, or None); the branch, whose read_done must
    come before x is written, or None."""
    ahead = tier.lookahead if decode and tier is not None else None
    if ahead is not None:
        ahead.fork(ops, tier.layer, router, norm, eps, x, n, norm_topk)
    return ahead

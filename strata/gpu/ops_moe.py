"""Ops' launchers for the mixture of experts (kernels/moe.py, the int8-input kernels of kernels/mmvq.py) and
the expert tiers' decode kernels (kernels/tiers.py: hit counting, riders' admission, the CPU share's mailbox),
apart so ops.py stays one screen per kind of kernel. `Ops` inherits them; its __init__ compiles `self.moe`,
`self.mmvq`, `self.tiers`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.gpu.kernels import gemv, mmvq, moe
from strata.gpu.kernels import tiers as kt
from strata.gpu.runtime import NULL, dev_ptr, i32, i64, launch, ptr
from strata.gpu.weights import DevMatrix


class MoeOps:
    moe: Any
    mmvq: Any
    tiers: Any
    split: bool
    q8: bool

    # ---- mixture of experts ----
    def topk(self, logits: Any, n: int, e: int, a: int, norm: bool, ids: Any, w: Any) -> None:
        launch(
            self.moe["moe_topk"],
            (-(-n // 4),),
            128,
            (logits, i32(n), i32(e), i32(a), i32(int(norm)), ids, w),
            smem=4 * e * 4,
        )

    def moe_gate_up(self, g: DevMatrix, u: DevMatrix, ids: Any, a: int, h: Any, pairs: int, act: Any) -> None:
        f, d = g.rows, g.cols
        args = (g.table, u.table, i64(g.row_bytes), i64(u.row_bytes), ids, i32(a), h, i32(d), i32(f), act)
        if self.split:
            s = gemv.split_for(f * pairs, d)
            launch(
                self.moe[moe.gate_up_split_name(g.qtype, u.qtype)],
                (-(-f * s // 8), pairs),
                256,
                args + (i32(s),),
            )
            return
        launch(self.moe[moe.gate_up_name(g.qtype, u.qtype)], (-(-f // 8), pairs), 256, args, smem=d * 4)

    def moe_down(self, dw: DevMatrix, ids: Any, wts: Any, a: int, act: Any, n: int, x: Any) -> None:
        d, f = dw.rows, dw.cols
        args = (dw.table, i64(dw.row_bytes), ids, wts, i32(a), act, i32(d), i32(f), x)
        if self.split:
            s = 1
            while s < min(8, a) and d * n * s * 2 <= gemv.WARPS_IN_FLIGHT:  # warps share a row's experts
                s *= 2
            launch(self.moe[moe.down_split_name(dw.qtype)], (-(-d * s // 8), n), 256, args + (i32(s),))
            return
        launch(self.moe[moe.down_name(dw.qtype)], (-(-d // 8), n), 256, args, smem=a * f * 4)

    def moe_q8(
        self,
        g: DevMatrix,
        u: DevMatrix,
        dw: DevMatrix,
        ids: Any,
        wts: Any,
        a: int,
        hq: Any,
        hds: Any,
        n: int,
        aq: Any,
        ads: Any,
        x: Any,
    ) -> None:
        """The decode expert FFN on int8 inputs: x[:n] += sum_a w * down(silu(gate . h) * (up . h)), with h
        quantized by router_topk (hq, hds) and the activations by the gate|up launch (aq, ads)."""
        f, d = g.rows, g.cols
        assert f % mmvq.ROWS_PER_GATE_UP_BLOCK == 0
        launch(
            self.mmvq[mmvq.gate_up_q8_name(g.qtype, u.qtype)],
            (f // mmvq.ROWS_PER_GATE_UP_BLOCK, n * a),
            256,
            (
                g.table,
                u.table,
                i64(g.row_bytes),
                i64(u.row_bytes),
                ids,
                i32(a),
                hq,
                hds,
                i32(d),
                i32(f),
                aq,
                ads,
            ),
        )
        launch(
            self.mmvq[mmvq.down_q8_name(dw.qtype)],
            (-(-dw.rows // gemv.WARPS), n),
            256,
            (dw.table, i64(dw.row_bytes), ids, wts, i32(a), aq, ads, i32(dw.rows), i32(f), x),
        )

    def q8_rows(self, x: Any, n: int, k: int, hq: Any, hds: Any) -> None:
        """hq [n, k] int8 codes and hds [n, k / 16] (d, d * sum) pairs of x [n, k], as mmvq.quantize_q8."""
        launch(self.mmvq["q8_rows"], (n,), 256, (dev_ptr(x), i32(k), i32(k), hq, hds))

    def tier_count(
        self,
        ids: Any,
        pairs: int,
        a: int,
        where: Any,
        expert_bytes: int,
        counts: Any,
        route: Any,
        stop: Any = None,
    ) -> None:
        """counts[row] += (lookups, hits, miss bytes) of one MoE layer's routed ids (a per row); route = ids;
        *stop = 1 when given (the lookahead's)."""
        launch(
            self.tiers["tier_count"],
            (-(-pairs // 128),),
            128,
            (
                ids,
                i32(pairs),
                i32(a),
                where,
                i64(expert_bytes),
                counts,
                route,
                NULL if stop is None else stop,
            ),
        )

    def admit(self, ids: Any, pairs: int, t: Any) -> None:
        """Copy the riders this decode layer routes into their slots as they are read, and point the table at
        them (t: gpu.tiers.TierHook with a ride)."""
        r = t.ride
        launch(
            self.tiers["admit"],
            (kt.ADMIT_BLOCKS,),
            256,
            (
                ids,
                i32(pairs),
                t.where,
                r.table,
                r.pend,
                i32(r.n_expert),
                *(i64(b) for b in r.part_bytes),
                r.arrive,
            ),
        )

    def cpu_publish(self, h: Any, ids: Any, wts: Any, n: int, a: int, d: int, t: Any) -> None:
        """Hand decode rows [n] of MoE layer t.layer to the CPU share: its split of the layer's misses, the
        mailbox (t: gpu.tiers.TierHook with a share)."""
        s, ahead = t.share, t.lookahead
        launch(
            self.tiers["cpu_publish"],
            (1,),
            256,
            (
                h,
                ids,
                wts,
                i32(n),
                i32(a),
                i32(d),
                i32(t.layer),
                np.uint64(s.ctl),
                np.uint64(s.h),
                np.uint64(s.ids),
                np.uint64(s.wts),
                s.ticket,
                t.where,
                s.table,
                i32(s.n_expert),
                *(np.uint64(z) for z in s.zero),
                ptr(s.take, 4 * n * s.take.shape[1]),
                NULL if ahead is None else ahead.picked,
                i32(0 if ahead is None else ahead.k),
                s.saved,
                s.took,
                t.counts,
                i64(t.expert_bytes),
                s.asked,
            ),
        )

    def cpu_collect(self, x: Any, n: int, d: int, s: Any, timeout_ns: int) -> None:
        """x[:n] += the CPU share's answer for the request cpu_publish made last, if it made one; the taken
        experts' table entries back (s: gpu.tiers.ShareHook)."""
        launch(
            self.tiers["cpu_collect"],
            (n,),
            256,
            (
                x,
                i32(d),
                np.uint64(s.ctl),
                np.uint64(s.out),
                s.ticket,
                s.err,
                i64(timeout_ns),
                s.asked,
                s.table,
                i32(s.n_expert),
                s.saved,
                s.took,
            ),
        )

    def moe_group(
        self,
        ids: Any,
        pairs: int,
        a: int,
        e: int,
        counts: Any,
        offsets: Any,
        cursor: Any,
        tiles: Any,
        n_tiles: Any,
        rows_of_pair: Any,
        tok_of_row: Any,
    ) -> None:
        """Sort (token, slot) pairs by expert: row offsets, 64-row tiles, and each pair's row."""
        counts.fill(0)
        launch(self.moe["moe_count"], (-(-pairs // 256),), 256, (ids, i32(pairs), counts))
        launch(
            self.moe["moe_plan"],
            (1,),
            min(1024, max(32, e)),
            (counts, i32(e), offsets, cursor, tiles, n_tiles),
            smem=8 * (e + 1),
        )
        launch(
            self.moe["moe_scatter"],
            (-(-pairs // 256),),
            256,
            (ids, i32(pairs), i32(a), offsets, cursor, rows_of_pair, tok_of_row),
        )

    def moe_combine(self, y: Any, rows_of_pair: Any, wts: Any, a: int, d: int, n: int, x: Any) -> None:
        launch(self.moe["moe_combine"], (n,), 256, (y, rows_of_pair, wts, i32(a), i32(d), x))

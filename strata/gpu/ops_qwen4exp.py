"""Ops' launchers for the qwen4exp kernels (kernels/hyper.py: hyper-connections and PLE; kernels/qsa.py: QSA
sparse attention), apart so ops.py stays one screen per kind of kernel. `Ops` inherits them; its __init__
compiles `self.hyper` and `self.qsa` (and `self.attn`, whose merge the split QSA attention reuses).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.gpu.kernels import attention, cells, hyper, qsa
from strata.gpu.kernels import qsa_select as qsel
from strata.gpu.runtime import NULL, dev_ptr, f32, i32, i64, launch
from strata.gpu.weights import DevMatrix


class Qwen4ExpOps:
    hyper: Any
    qsa: Any
    attn: Any

    # ---- hyper-connections and PLE (qwen4exp) ----
    def hc_norm(self, x: Any, w: Any, eps: float, n: int, s: int, d: int, out: Any) -> None:
        """out[:n] = x[:n] with each of its s streams [d] RMS-normed on its own, times w [s*d] (out apart from
        x)."""
        launch(
            self.hyper["hc_norm"],
            (n, s),
            256,
            (dev_ptr(x), dev_ptr(w), f32(eps), i32(s), i32(d), dev_ptr(out)),
        )

    def silu_scale(self, x: Any, n: int, cols: int, scale: float) -> None:
        """x[:n, :cols] = silu(x * scale), in place (contiguous rows of cols)."""
        launch(self.hyper["silu_scale"], (-(-n * cols // 256),), 256, (dev_ptr(x), i64(n * cols), f32(scale)))

    def hc_read(
        self, mix: Any, normed: Any, n: int, s: int, d: int, h: Any, inj: Any = None, zero: Any = None
    ) -> None:
        """h[:n] [d] = mean over the s streams of sigmoid(mix) * normed ([n, s*d] both); if given, inj [n, s]
        logits -> 2 sigmoid(logit / s) in place, and zero [n, d] cleared."""
        assert s <= 256, s  # the row's first block turns the inject logits, a thread each
        launch(
            self.hyper["hc_read"],
            (n, -(-d // 256)),
            256,
            (
                dev_ptr(mix),
                dev_ptr(normed),
                i32(s),
                i32(d),
                dev_ptr(h),
                NULL if inj is None else dev_ptr(inj),
                NULL if zero is None else dev_ptr(zero),
            ),
        )

    def hc_mix_in(
        self,
        x: Any,
        w: Any,
        eps: float,
        n: int,
        s: int,
        d: int,
        down: DevMatrix,
        inject: DevMatrix | None,
        low: Any,
        inj: Any,
        den: Any,
    ) -> None:
        """A decode mixer's first half (kernels/hyper.py): low [n, R] = silu(normed @ down.T / s), inj [n,
        s] = 2 sigmoid(normed @ inject.T / s) (inject given), den [n, s] the streams' RMS; normed is x's
        grouped RMSNorm times w, never stored."""
        assert s <= 8 and (s * d) % 8 == 0, (s, d)
        qi = inject.qtype if inject is not None else down.qtype
        launch(
            self.hyper[hyper.mix_in_name(down.qtype, qi)],
            (n, down.rows + (s if inject is not None else 0)),
            256,
            (
                dev_ptr(x),
                dev_ptr(w),
                f32(eps),
                i32(s),
                i32(d),
                down.data,
                i64(down.row_bytes),
                i32(down.rows),
                NULL if inject is None else inject.data,
                i64(0 if inject is None else inject.row_bytes),
                f32(1.0 / s),
                dev_ptr(low),
                NULL if inj is None else dev_ptr(inj),
                dev_ptr(den),
            ),
        )

    def hc_mix_out(
        self,
        x: Any,
        w: Any,
        den: Any,
        n: int,
        s: int,
        d: int,
        up: DevMatrix,
        low: Any,
        h: Any,
        zero: Any = None,
    ) -> None:
        """A decode mixer's second half: h [n, d] = mean over the s streams of sigmoid(low @ up.T) * normed;
        zero [n, d] (given) cleared."""
        assert up.cols % 8 == 0 and up.cols <= 512, up.cols
        launch(
            self.hyper[hyper.mix_out_name(up.qtype)],
            (n, -(-d // 8)),
            256,
            (
                dev_ptr(x),
                dev_ptr(w),
                dev_ptr(den),
                i32(s),
                i32(d),
                up.data,
                i64(up.row_bytes),
                i32(up.cols),
                dev_ptr(low),
                dev_ptr(h),
                NULL if zero is None else dev_ptr(zero),
            ),
        )

    def hc_inject(self, streams: Any, y: Any, inj: Any, n: int, s: int, d: int) -> None:
        """streams[:n, k*d + c] += inj[:n, k] * y[:n, c] for each of the s streams, in place."""
        launch(
            self.hyper["hc_inject"],
            (n, -(-d // 256)),
            256,
            (dev_ptr(streams), dev_ptr(y), dev_ptr(inj), i32(s), i32(d)),
        )

    def ple_gate(self, key: Any, query: Any, value: Any, n: int, s: int, d: int, out: Any) -> None:
        """out[:n] [s*d] = sigmoid(signed sqrt of <key, query> / sqrt(d) per stream) * value [n, d]."""
        launch(
            self.hyper["ple_gate"],
            (n, s),
            256,
            (dev_ptr(key), dev_ptr(query), dev_ptr(value), i32(s), i32(d), dev_ptr(out)),
        )

    def ple_conv(
        self,
        width: int,
        dilation: int,
        x: Any,
        c: int,
        t: int,
        segments: int,
        tab: Any,
        tab_stride: int,
        tab_col: int,
        weight: Any,
        gated: Any,
        streams: Any,
        state_off: int = 0,
    ) -> None:
        """streams += gated + silu(dilated causal conv of x) over `segments` runs of t rows (rows of c), each
        continuing the window at tab[run's first row, tab_col] (+ state_off floats) and advancing it."""
        ct = hyper.conv_chunk(width, dilation)
        launch(
            self.hyper[hyper.conv_name(width)],
            (-(-c // 128), -(-t // ct), segments),
            128,
            (
                dev_ptr(x),
                i32(c),
                i32(t),
                i32(dilation),
                i32(ct),
                dev_ptr(tab),
                i32(tab_stride),
                i32(tab_col),
                i64(state_off),
                dev_ptr(weight),
                dev_ptr(gated),
                dev_ptr(streams),
            ),
        )

    # ---- QSA sparse attention (qwen4exp) ----
    def qsa_keys(
        self,
        raw: Any,
        n: int,
        tab: Any,
        tab_stride: int,
        j: int,
        stride: int,
        ratio: int,
        d: int,
        k_norm: Any,
        eps: float,
        inv_freq: Any,
        n_rot: int,
        neox: bool,
        pos_scale: float,
    ) -> None:
        """QSA layer j's record (kernels/qsa.py, `stride` floats a layer at the table's QSA_COL address): the
        compressed key of every block a row of raw [n, d] completes, then each row's raw key into its ring
        slot. A sequence's rows are contiguous, at consecutive positions."""
        state = (dev_ptr(tab), i32(tab_stride), i32(j), i32(stride), i32(ratio))
        launch(
            self.qsa[qsa.compress_name(d)],
            (n,),
            32,
            (dev_ptr(raw), *state, k_norm, f32(eps), inv_freq, i32(n_rot), i32(int(neox)), f32(pos_scale)),
        )
        launch(self.qsa["qsa_ring"], (n,), 32, (dev_ptr(raw), i32(d), *state))

    def qsa_query(
        self,
        q: Any,
        n: int,
        hi: int,
        d: int,
        q_norm: Any,
        eps: float,
        inv_freq: Any,
        n_rot: int,
        neox: bool,
        pos_scale: float,
        tab: Any,
        tab_stride: int,
    ) -> None:
        """The indexer queries q [n, hi * d] RMSNormed by q_norm and rotated at their rows' positions, in
        place."""
        launch(
            self.qsa[qsa.query_name(d)],
            (n, hi),
            32,
            (
                dev_ptr(q),
                i32(hi),
                q_norm,
                f32(eps),
                inv_freq,
                i32(n_rot),
                i32(int(neox)),
                f32(pos_scale),
                dev_ptr(tab),
                i32(tab_stride),
            ),
        )

    @staticmethod
    def qsa_scratch(rows: int, max_blocks: int) -> tuple[int, int]:
        """qsa_select's scratch shape (float32): one score row of max_blocks for each of `rows` queries scored
        at once; a pass with more rows is selected `rows` at a time."""
        return rows, max_blocks

    def qsa_select(
        self,
        q: Any,
        n: int,
        tab: Any,
        tab_stride: int,
        j: int,
        stride: int,
        hi: int,
        d: int,
        ratio: int,
        top_blocks: int,
        sel: Any,
        nsel: Any,
        scratch: Any,
        blocks_seen: int | None = None,
    ) -> int:
        """Each row's min(complete, top_blocks) best blocks of QSA layer j for its query q [n, hi * d]
        (qsa_query's): sel [n, top_blocks] int32 ascending (-1 past nsel), nsel [n] int32. scratch: a cupy
        float32 array shaped qsa_scratch(rows, max_blocks). blocks_seen: no row has more complete blocks (a
        prefill pass's bound, None where the host does not know it): its score rows are then that long, as
        many as the scratch holds at once, scored by qsa_score_tiled when they fill its row tiles. Returns
        the score rows' stride: the scratch holds the last rows' scores afterwards, a row each."""
        rows_, max_blocks = scratch.shape
        ld, per, tiled = max_blocks, rows_, False
        if blocks_seen is not None and n >= qsel.SCORE_TILE_ROWS and qsel.tiles_dim(d):
            ld = min(max_blocks, -(-max(blocks_seen, 1) // 4) * 4)
            fit = scratch.size // ld  # rows of scores at once; a row tile's multiple unless all of them
            per = n if n <= fit else fit // qsel.SCORE_TILE_ROWS * qsel.SCORE_TILE_ROWS
            tiled = per >= qsel.SCORE_TILE_ROWS
            if not tiled:
                ld, per = max_blocks, rows_
        for r0 in range(0, n, per):
            m = min(per, n - r0)
            head = (dev_ptr(q), i32(hi), dev_ptr(tab), i32(tab_stride), i32(r0))
            tail = (i32(j), i32(stride), i32(ratio), f32(np.sqrt(d)), scratch, i32(ld))
            if tiled:
                grid = (-(-ld // qsel.SCORE_TILE_KEYS), -(-m // qsel.SCORE_TILE_ROWS))
                launch(self.qsa[qsel.tiled_score_name(d)], grid, 256, (*head, i32(m), *tail))
            else:
                tiles = -(-max_blocks // qsel.SCORE_KT)
                grid = (min(tiles, -(-qsel.SCORE_BLOCKS // m)), m)
                launch(self.qsa[qsel.score_name(d)], grid, 256, (*head, *tail), smem=qsel.score_smem(hi, d))
            launch(
                self.qsa["qsa_pick"],
                (m,),
                qsel.PICK_THREADS,
                (
                    scratch,
                    i32(ld),
                    dev_ptr(tab),
                    i32(tab_stride),
                    i32(r0),
                    i32(ratio),
                    i32(top_blocks),
                    dev_ptr(sel),
                    dev_ptr(nsel),
                ),
            )
        return ld

    def qsa_attend(
        self,
        q: Any,
        tab: Any,
        tab_stride: int,
        layer: int,
        n: int,
        n_head: int,
        n_kv: int,
        hd: int,
        scale: float,
        sel: Any,
        nsel: Any,
        top_blocks: int,
        ratio: int,
        out: Any,
        kv8: bool,
        part: Any = None,
    ) -> None:
        """GQA attention of q [n, n_head * hd] (qkv_post's, its keys already cached) over each row's selected
        blocks and its incomplete block, into out [n, n_head * hd]; prefill and decode rows alike. kv8 and
        part as attn_decode's q8 and part (part: [n, n_head, attention.SPLITS, hd + 2] fp32, decode rows)."""
        splits = 1 if part is None else attention.SPLITS
        launch(
            self.qsa[qsa.attend_name(hd, kv8)],
            (n_head, n, splits),
            128,
            (
                dev_ptr(q),
                dev_ptr(tab),
                i32(tab_stride),
                i32(layer),
                i32(n_head),
                i32(n_kv),
                f32(scale),
                dev_ptr(sel),
                dev_ptr(nsel),
                i32(top_blocks),
                i32(ratio),
                dev_ptr(out),
                NULL if part is None else dev_ptr(part),
                i32(splits),
            ),
        )
        if part is not None:
            launch(
                self.attn[cells.merge_name(hd)],
                (n_head, n),
                max(32, hd),
                (dev_ptr(part), i32(splits), i32(n_head), dev_ptr(out)),
            )

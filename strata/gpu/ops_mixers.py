"""Ops' launchers for the sequence mixers: Gated DeltaNet (kernels/deltanet.py) and attention against the KV
cache (kernels/attention.py: decode, the fused decode, flash prefill), apart so ops.py stays one screen per
kind of kernel. `Ops` inherits them; its __init__ compiles `self.dn` and `self.attn`.
"""

from __future__ import annotations

from typing import Any

from strata.gpu.kernels import attention, cells, deltanet, flash
from strata.gpu.runtime import NULL, dev_ptr, f32, i32, i64, launch


class MixerOps:
    dn: Any
    attn: Any
    split: bool

    # ---- Gated DeltaNet (kernels/deltanet.py) ----
    def dn_conv(
        self,
        width: int,
        mix: Any,
        ld: int,
        c: int,
        t: int,
        segments: int,
        tab: Any,
        tab_stride: int,
        state_off: int,
        weight: Any,
        out: Any,
        ldo: int,
    ) -> None:
        """silu(causal conv) of `segments` runs of t rows (each continuing its own state) into out."""
        launch(
            self.dn[deltanet.conv_name(width)],
            (-(-c // 128), -(-t // deltanet.CONV_T), segments),
            128,
            (
                dev_ptr(mix),
                i32(ld),
                i32(c),
                i32(t),
                dev_ptr(tab),
                i32(tab_stride),
                i64(state_off),
                weight,
                dev_ptr(out),
                i32(ldo),
            ),
        )

    def dn_recur(
        self,
        kd: int,
        y: Any,
        ldy: int,
        ba: Any,
        ldba: int,
        t: int,
        segments: int,
        tab: Any,
        tab_stride: int,
        state_off: int,
        n_k: int,
        n_v: int,
        v: int,
        tiled: bool,
        fused_r: int,
        a: Any,
        dt_bias: Any,
        out: Any,
        ldo: int,
    ) -> None:
        """The gated delta rule over `segments` runs of t rows, each on its own recurrent state."""
        launch(
            self.dn[deltanet.recur_name(kd)],
            (n_v, -(-v // 8), segments),
            32,
            (
                dev_ptr(y),
                i32(ldy),
                dev_ptr(ba),
                i32(ldba),
                i32(t),
                dev_ptr(tab),
                i32(tab_stride),
                i64(state_off),
                i32(n_k),
                i32(n_v),
                i32(v),
                i32(int(tiled)),
                i32(fused_r),
                a,
                dt_bias,
                dev_ptr(out),
                i32(ldo),
            ),
        )

    def dn_gated_norm(
        self, o: Any, ldo: int, z: Any, ldz: int, w: Any, n_v: int, v: int, eps: float, n: int
    ) -> None:
        """o[:n] = rmsnorm(o) * w * silu(z) per value head, in place."""
        launch(
            self.dn["dn_gated_norm"],
            (n_v, n),
            32,
            (dev_ptr(o), i32(ldo), dev_ptr(z), i32(ldz), w, i32(v), f32(eps)),
        )

    # ---- attention ----
    def attn_decode(
        self,
        q: Any,
        tab: Any,
        tab_stride: int,
        layer: int,
        n: int,
        h: int,
        kv: int,
        hd: int,
        scale: float,
        out: Any,
        q8: bool = False,
        part: Any = None,
    ) -> None:
        """q8: the table's caches hold int8 cells, their scales in columns 7 and 8. part: scratch for
        attention.SPLITS partials a (row, head) ([n, h, SPLITS, hd + 2] fp32), which splits the keys across
        blocks; None: one block a (row, head)."""
        args = (
            dev_ptr(q),
            dev_ptr(tab),
            i32(tab_stride),
            i32(layer),
            i32(h),
            i32(kv),
            f32(scale),
            dev_ptr(out),
        )
        gb = attention.group_heads(h, kv)
        self._decode(attention.decode_name(hd, q8, gb), q8, gb, args, part, n, h, hd, out)

    def _decode(
        self,
        name: str,
        q8: bool,
        gb: int,
        args: tuple[Any, ...],
        part: Any,
        n: int,
        h: int,
        hd: int,
        out: Any,
    ) -> None:
        """One decode attention kernel over (group of gb query heads, row, split) blocks, its arguments
        followed by the partials buffer and the split count; with more than one split, attn_merge then writes
        out."""
        splits = 1 if part is None else attention.SPLITS
        part = part if splits > 1 else None
        launch(
            self.attn[name],
            (h // gb, n, splits),
            32 * attention.decode_warps(hd),
            (*args, NULL if part is None else dev_ptr(part), i32(splits)),
            smem=attention.decode_smem(hd, q8, gb),
        )
        if part is not None:
            launch(
                self.attn[cells.merge_name(hd)],
                (h, n),
                max(32, hd),
                (dev_ptr(part), i32(attention.SPLITS), i32(h), dev_ptr(out)),
            )

    def attn_decode_qkv(
        self,
        qkv: Any,
        tab: Any,
        tab_stride: int,
        layer: int,
        n: int,
        h: int,
        kv: int,
        hd: int,
        q_norm: Any,
        k_norm: Any,
        eps: float,
        inv_freq: Any,
        n_rot: int,
        neox: bool,
        pos_scale: float,
        scale: float,
        out: Any,
        q8: bool = False,
        part: Any = None,
    ) -> None:
        """qkv_post then attn_decode in one launch, for rows that are all single decode tokens (q8, part: as
        attn_decode)."""
        args = (
            dev_ptr(qkv),
            dev_ptr(tab),
            i32(tab_stride),
            i32(layer),
            i32(h),
            i32(kv),
            NULL if q_norm is None else q_norm,
            NULL if k_norm is None else k_norm,
            f32(eps),
            inv_freq,
            i32(n_rot),
            i32(int(neox)),
            f32(pos_scale),
            f32(scale),
            dev_ptr(out),
        )
        gb = attention.group_heads(h, kv)
        self._decode(attention.decode_qkv_name(hd, q8, gb), q8, gb, args, part, n, h, hd, out)

    def flash(
        self,
        q: Any,
        k_layer: Any,
        v_layer: Any,
        head_stride: int,
        t: int,
        n_past: int,
        h: int,
        kv: int,
        hd: int,
        scale: float,
        out: Any,
        scales: tuple[Any, Any, int] | None = None,
        cold: tuple[int, int, int, int, int, int] | None = None,
        warps: int = 0,
    ) -> None:
        """scales: int8 cells' (k scales, v scales of the layer, floats a kv head); None: fp16 cells. cold
        (--kv-resident): the cells before the window, (k, v, cells a kv head, k scales, v scales, base).
        warps: the block's (0: flash.flash_warps' choice)."""
        ks, vs, sc_stride = (NULL, NULL, 0) if scales is None else scales
        hk, hv, h_stride, hks, hvs, base = (NULL, NULL, 0, NULL, NULL, 0) if cold is None else cold
        w = warps or flash.flash_warps(t, n_past)
        launch(
            self.flash_attn[flash.flash_name(hd, scales is not None, w)],
            (-(-t // (16 * w)), h),
            32 * w,
            (
                dev_ptr(q),
                dev_ptr(k_layer),
                dev_ptr(v_layer),
                i64(head_stride),
                dev_ptr(ks),
                dev_ptr(vs),
                i64(sc_stride),
                i32(t),
                i32(n_past),
                i32(h),
                i32(kv),
                f32(scale * 1.4426950408889634),
                dev_ptr(out),
                dev_ptr(hk),
                dev_ptr(hv),
                i64(h_stride),
                dev_ptr(hks),
                dev_ptr(hvs),
                i32(base),
            ),
            smem=flash.flash_smem(hd, scales is not None, w),
        )

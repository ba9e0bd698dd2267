"""The Gated DeltaNet sublayer on the GPU (Qwen3-Next's recurrent layers), and its per-sequence state.

One sublayer is: input projections into the `mix` row (kernels/deltanet.py gives its layout), the
causal conv into `dn_y`, the gated delta rule into `dn_o`, the gated RMSNorm (in place) and the output
projection accumulated into x.
Decode rows (all single tokens, the graph case) take one launch per kernel for every row; prefill
takes one conv and one recurrence launch per sequence segment, each running its tokens in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.blocks.linear_attn import DeltaNetParams, HeadOrder
from strata.errors import ConfigError
from strata.gguf.names import T, tensor
from strata.gpu.kernels import deltanet as dk
from strata.gpu.pinned import to_pinned
from strata.gpu.runtime import cupy_module, ptr
from strata.gpu.weights import DevMatrix, GpuWeights
from strata.tiers.budget import Ledger

RECURRENT = ("gpu_deltanet", 0)  # SequenceState.layers key of a hybrid model's RecurrentState


@dataclass(frozen=True, slots=True)
class DNDims:
    n_k: int  # key heads
    n_v: int  # value heads
    k: int  # key head dim
    v: int  # value head dim
    width: int  # conv kernel
    tiled: bool  # value head h reads key head h % n_k (else h // r)
    fused_r: int  # r = n_v / n_k when b/a is one per-key-head tensor, else 0
    eps: float

    @classmethod
    def of(cls, p: DeltaNetParams) -> DNDims:
        if p.k_dim not in dk.KEY_DIMS:
            raise ConfigError(
                "device",
                "cuda",
                f"DeltaNet key head dim {p.k_dim} has no GPU kernel "
                f"(have {', '.join(map(str, dk.KEY_DIMS))}); use device=cpu",
            )
        if p.conv_kernel not in dk.CONV_WIDTHS:
            raise ConfigError(
                "device",
                "cuda",
                f"DeltaNet conv kernel {p.conv_kernel} has no GPU kernel "
                f"(have {', '.join(map(str, dk.CONV_WIDTHS))}); use device=cpu",
            )
        return cls(
            p.n_k_heads,
            p.n_v_heads,
            p.k_dim,
            p.v_dim,
            p.conv_kernel,
            p.order is HeadOrder.TILED,
            p.n_v_heads // p.n_k_heads if p.fused_ba else 0,
            p.eps,
        )

    @property
    def conv_channels(self) -> int:
        return 2 * self.n_k * self.k + self.n_v * self.v

    @property
    def inner(self) -> int:  # value heads * value dim: z and the recurrence output
        return self.n_v * self.v

    @property
    def mix_cols(self) -> int:  # q|k|v, z, b/a
        return self.conv_channels + self.inner + 2 * self.n_v

    def state_floats(self) -> tuple[int, int]:
        """Floats per layer of the conv window and of the recurrent matrices."""
        return (self.width - 1) * self.conv_channels, self.n_v * self.k * self.v


@dataclass(slots=True)
class DeltaNetWeights:
    proj: list[DevMatrix]  # attn_qkv, attn_gate (z), then ssm_ba or ssm_beta + ssm_alpha: the mix columns
    conv: Any  # [C * W] float32
    a: Any  # ssm_a = -exp(A_log), [H]
    dt_bias: Any  # [H]
    norm: Any  # ssm_norm [V]
    out: DevMatrix  # ssm_out [D, H*V]

    @classmethod
    def load(cls, w: GpuWeights, i: int, fused_ba: bool) -> DeltaNetWeights:
        ba = [T.SSM_BETA_ALPHA] if fused_ba else [T.SSM_BETA, T.SSM_ALPHA]
        return cls(
            [w.matrix(tensor(k, i)) for k in [T.ATTN_QKV, T.ATTN_GATE, *ba]],
            w.vector(tensor(T.SSM_CONV1D, i)),
            w.vector(tensor(T.SSM_A, i, "")),
            w.vector(tensor(T.SSM_DT, i, "bias")),
            w.vector(tensor(T.SSM_NORM, i)),
            w.matrix(tensor(T.SSM_OUT, i)),
        )


class RecurrentState:
    """One sequence's DeltaNet state in VRAM: conv windows [L, W-1, C] and matrices [L, H, K, V], float32,
    zero at the start. The row table carries their addresses (columns 5 and 6)."""

    def __init__(self, ledger: Ledger, dims: DNDims, n_layer: int) -> None:
        cp = cupy_module()
        self.ledger, self.dims, self.n_layer = ledger, dims, n_layer
        nc, ns = dims.state_floats()
        self._bytes = 4 * n_layer * (nc + ns)
        ledger.take(self._bytes, "DeltaNet state for a sequence")
        self.conv = cp.zeros(n_layer * nc, cp.float32)
        self.ssm = cp.zeros(n_layer * ns, cp.float32)
        # made on the current stream, used on the model's non-blocking one: finish here
        cp.cuda.get_current_stream().synchronize()

    def table_cols(self) -> list[int]:
        return [self.conv.data.ptr, self.ssm.data.ptr]

    def device_buffers(self) -> list[Any]:
        """What a pass advances (a graph's warm-up run puts them back)."""
        return [self.conv, self.ssm]

    def copy(self) -> RecurrentState:
        out = RecurrentState(self.ledger, self.dims, self.n_layer)
        out.conv[...] = self.conv
        out.ssm[...] = self.ssm
        cupy_module().cuda.get_current_stream().synchronize()
        return out

    def nbytes(self) -> int:
        return self._bytes

    def to_host(self) -> HostRecurrent:
        """A copy in host RAM (the prefix cache keeps these); its copy() comes back to the GPU."""
        return HostRecurrent(self.ledger, self.dims, self.n_layer, to_pinned(self.conv), to_pinned(self.ssm))

    def __del__(self) -> None:
        self.ledger.give(self._bytes)


class HostRecurrent:
    """A RecurrentState in host RAM."""

    def __init__(self, ledger: Ledger, dims: DNDims, n_layer: int, conv: np.ndarray, ssm: np.ndarray) -> None:
        self.ledger, self.dims, self.n_layer, self.conv, self.ssm = ledger, dims, n_layer, conv, ssm

    def copy(self) -> RecurrentState:
        out = RecurrentState(self.ledger, self.dims, self.n_layer)
        out.conv.set(self.conv)
        out.ssm.set(self.ssm)
        cupy_module().cuda.get_current_stream().synchronize()
        return out

    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


def run_deltanet(
    ops: Any,
    j: int,
    w: DeltaNetWeights,
    dn: DNDims,
    norm: Any,
    eps: float,
    act: Any,
    n: int,
    tab: Any,
    tab_stride: int,
    segments: list[tuple[int, int]] | None,
    small: bool,
    before_write: Callable[[], None] | None = None,
) -> None:
    """x[:n] += DeltaNet_j(rmsnorm(x)) (norm None: of act.h as it stands) for DeltaNet layer j (its index
    among DeltaNet layers). segments: (start, length) per sequence, or None when every row is one sequence's
    single decode token. before_write: called before the launch that adds into x (the lookahead's branch reads
    x until then)."""
    mix, ld, c = act.dn_mix, dn.mix_cols, dn.conv_channels
    src = act.h if norm is None else act.x  # no norm: act.h holds the input (hyper-connections)
    if small:
        _grouped(
            w.proj, lambda ms, col: ops.matvec(ms, src, n, ptr(mix, 4 * col), ldy=ld, norm=norm, eps=eps)
        )
    else:
        if norm is not None:
            ops.rmsnorm(act.x, norm, eps, n, act.x.shape[1], act.h)
        _grouped(w.proj, lambda ms, col: ops.matmul(ms, act.h, n, ptr(mix, 4 * col), ldc=ld))
    nc, ns = dn.state_floats()
    runs = [(0, 1, n)] if segments is None else [(s, t, 1) for s, t in segments]
    for start, t, count in runs:  # decode: every row its own segment of 1; prefill: one launch per sequence
        rows = ptr(tab, 8 * tab_stride * start)
        y = ptr(act.dn_y, 4 * c * start)
        ops.dn_conv(
            dn.width, ptr(mix, 4 * ld * start), ld, c, t, count, rows, tab_stride, j * nc, w.conv, y, c
        )
        ops.dn_recur(
            dn.k,
            y,
            c,
            ptr(mix, 4 * (ld * start + c + dn.inner)),
            ld,
            t,
            count,
            rows,
            tab_stride,
            j * ns,
            dn.n_k,
            dn.n_v,
            dn.v,
            dn.tiled,
            dn.fused_r,
            w.a,
            w.dt_bias,
            ptr(act.dn_o, 4 * dn.inner * start),
            dn.inner,
        )
    ops.dn_gated_norm(act.dn_o, dn.inner, ptr(mix, 4 * c), ld, w.norm, dn.n_v, dn.v, dn.eps, n)
    if before_write is not None:
        before_write()
    if small:
        ops.matvec([w.out], act.dn_o, n, act.x, accumulate=True)
    else:
        ops.matmul(w.out, act.dn_o, n, act.x, accumulate=True)


def _grouped(ms: list[DevMatrix], run: Any) -> None:
    """Call run(group, first column) for runs of consecutive matrices one product can read (same type and
    width, at most 3): a decode step then makes as few launches as the file's types allow."""
    col, group = 0, [ms[0]]
    for m in ms[1:]:
        if m.qtype == group[0].qtype and m.cols == group[0].cols and len(group) < 3:
            group.append(m)
            continue
        run(group, col)
        col += sum(g.rows for g in group)
        group = [m]
    run(group, col)

"""The Gated DeltaNet sublayer as GGUF files store it: projections, causal conv, the gated delta
rule, the gated RMSNorm and the output projection, with its per-sequence state.

What llama.cpp's converter did to the HF weights, and how it is undone here:
- `A_log` became `ssm_a = -exp(A_log)`, so the decay is g = ssm_a * softplus(a + dt_bias).
- conv1d weights lost their middle axis: ssm_conv1d [C, W].
- qwen3next: `in_proj_qkvz` (per key head [q|k|v|z]) was split into attn_qkv ([q..|k..|v..], value heads
  still grouped by key head) and attn_gate (z); `in_proj_ba` stays per key head [b(r)|a(r)] in ssm_ba.
- qwen3.5/qwen4exp: value heads were reordered from grouped (k0v0, k0v1, k1v0, ...) to tiled (k0v0,
  k1v0, k0v1, ...) in every tensor that has them, so value head h reads key head h % Hk instead of h // r.
The gated norm weight (ssm_norm) is used as stored: it was never zero-centred.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from strata.blocks.deltanet import causal_conv1d, gated_delta, gated_rms_norm, normalize_qk, softplus
from strata.blocks.norms import sigmoid, silu
from strata.gguf import GGUFFile
from strata.gguf.names import Keys, T, tensor
from strata.runtime.weights import WeightStore


class HeadOrder(enum.Enum):
    GROUPED = "grouped"  # value head h uses key head h // r (HF order; qwen3next files)
    TILED = "tiled"  # value head h uses key head h % Hk (qwen3.5 / qwen4exp files)


@dataclass(frozen=True, slots=True)
class DeltaNetParams:
    n_k_heads: int
    n_v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    eps: float
    order: HeadOrder
    fused_ba: bool  # qwen3next: one ssm_ba tensor; otherwise ssm_beta and ssm_alpha
    gate_act: str = "silu"  # activation of the output gate z

    @classmethod
    def from_gguf(cls, g: GGUFFile, order: HeadOrder, fused_ba: bool, eps: float) -> DeltaNetParams:
        n_v = int(g.arch_get(Keys.SSM_TIME_STEP_RANK))
        return cls(
            n_k_heads=int(g.arch_get(Keys.SSM_GROUP_COUNT)),
            n_v_heads=n_v,
            k_dim=int(g.arch_get(Keys.SSM_STATE_SIZE)),
            v_dim=int(g.arch_get(Keys.SSM_INNER_SIZE)) // n_v,
            conv_kernel=int(g.arch_get(Keys.SSM_CONV_KERNEL)),
            eps=eps,
            order=order,
            fused_ba=fused_ba,
        )

    @property
    def conv_channels(self) -> int:
        return 2 * self.n_k_heads * self.k_dim + self.n_v_heads * self.v_dim


@dataclass(slots=True)
class DeltaNetState:
    """Conv window [W-1, C] (pre-conv q|k|v inputs) and recurrent matrix [H, K, V]."""

    conv: np.ndarray
    ssm: np.ndarray

    @classmethod
    def empty(cls, p: DeltaNetParams) -> DeltaNetState:
        return cls(
            np.zeros((p.conv_kernel - 1, p.conv_channels), np.float32),
            np.zeros((p.n_v_heads, p.k_dim, p.v_dim), np.float32),
        )

    def copy(self) -> DeltaNetState:
        return DeltaNetState(self.conv.copy(), self.ssm.copy())

    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


def _beta_alpha(
    h: np.ndarray, w: WeightStore, layer: int, p: DeltaNetParams
) -> tuple[np.ndarray, np.ndarray]:
    """Beta and alpha logits [T, H] in the file's value-head order."""
    t = h.shape[0]
    if not p.fused_ba:
        return w.matmul(h, tensor(T.SSM_BETA, layer)), w.matmul(h, tensor(T.SSM_ALPHA, layer))
    r = p.n_v_heads // p.n_k_heads
    ba = w.matmul(h, tensor(T.SSM_BETA_ALPHA, layer)).reshape(t, p.n_k_heads, 2 * r)  # per key head [b|a]
    return ba[:, :, :r].reshape(t, p.n_v_heads), ba[:, :, r:].reshape(t, p.n_v_heads)


def _expand(x: np.ndarray, p: DeltaNetParams) -> np.ndarray:
    """Key-head tensor [T, Hk, K] -> one per value head [T, H, K], in the file's head order."""
    r = p.n_v_heads // p.n_k_heads
    if r == 1:
        return x
    return np.repeat(x, r, axis=1) if p.order is HeadOrder.GROUPED else np.tile(x, (1, r, 1))


def deltanet(h: np.ndarray, w: WeightStore, layer: int, p: DeltaNetParams, st: DeltaNetState) -> np.ndarray:
    """h [T, D] (already normed or mixed) -> sublayer output [T, D]; advances `st`."""
    t = h.shape[0]
    qkv = w.matmul(h, tensor(T.ATTN_QKV, layer))  # [T, C]
    z = w.matmul(h, tensor(T.ATTN_GATE, layer)).reshape(t, p.n_v_heads, p.v_dim)
    b, a = _beta_alpha(h, w, layer, p)  # [T, H] x2
    y, st.conv = causal_conv1d(qkv, st.conv, kernel(w, tensor(T.SSM_CONV1D, layer)))
    y = silu(y)
    nk = p.n_k_heads * p.k_dim
    q = y[:, :nk].reshape(t, p.n_k_heads, p.k_dim)
    k = y[:, nk : 2 * nk].reshape(t, p.n_k_heads, p.k_dim)
    v = y[:, 2 * nk :].reshape(t, p.n_v_heads, p.v_dim)
    q, k = normalize_qk(_expand(q, p), _expand(k, p))  # [T, H, K]
    beta = sigmoid(b)
    g = w.vector(tensor(T.SSM_A, layer, "")) * softplus(
        a + w.vector(tensor(T.SSM_DT, layer, "bias"))
    )  # [T, H]
    o, st.ssm = gated_delta(q, k, v, g.astype(np.float32), beta, st.ssm)  # [T, H, V]
    o = gated_rms_norm(o, w.vector(tensor(T.SSM_NORM, layer)), z, p.eps, p.gate_act)
    return w.matmul(o.reshape(t, p.n_v_heads * p.v_dim), tensor(T.SSM_OUT, layer))


def kernel(w: WeightStore, name: str) -> np.ndarray:
    """A depthwise conv kernel [C, W] as f32 (small, so it is cached like a vector)."""
    return w.vector(name).reshape(w.shape(name))

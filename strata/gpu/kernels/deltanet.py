"""Gated DeltaNet (Qwen3-Next) on the GPU: the causal conv, the gated delta rule and the gated norm.

The layer's input projections write one row per token into a `mix` buffer:
    [ q (Hk*K) | k (Hk*K) | v (H*V) | z (H*V) | b/a ]
where the first C = 2*Hk*K + H*V columns are the conv channels, z the output gate, and b/a the beta
and alpha logits: per key head [b(r) | a(r)] when fused (qwen3next's ssm_ba, r = H / Hk), else
[beta (H) | alpha (H)]. A sequence's recurrent state lives in two device buffers found through the
row table (columns 5 and 6, as the KV cache is found through columns 0..3), so one captured decode
graph serves whichever sequences sit in its slots:
    conv  [L_dn, W-1, C]  the last W-1 pre-conv inputs of each DeltaNet layer
    ssm   [L_dn, H, K, V] the recurrent matrix S of each head (keys -> values)

- `dn_conv`: one thread per (channel, 16 tokens) writes silu(conv) of the q|k|v columns into a
  separate buffer y (the inputs stay, so token chunks run in parallel) and the window back to the state.
- `dn_recur`: one warp per (head, 8 value columns), four lanes per column, each holding a quarter of
  the column of S in registers for the whole segment. Per token it L2-normalises q and k (shared
  memory, warp sums), computes beta = sigmoid(b) and the decay exp(A * softplus(a + dt_bias)), and applies
      S <- decay S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
  with the products in registers and two shuffles per dot product. Tokens run one after another (the
  recurrent form); prefill chunks take T steps per launch.
- `dn_gated_norm`: one warp per (row, head): o = rmsnorm(o) * w * silu(z), in place.

Numpy twins: `ref_conv`, `ref_recur`, `ref_gated_norm` (built from strata.blocks.deltanet on the
same column layout).
"""

from __future__ import annotations

import numpy as np

from strata.blocks.deltanet import (
    causal_conv1d,
    gated_delta_recurrent,
    gated_rms_norm,
    normalize_qk,
    softplus,
)
from strata.blocks.norms import sigmoid, silu
from strata.gpu.kernels.common import HEADER

KEY_DIMS = (16, 32, 64, 128)  # dn_recur keeps a quarter of a K-long column of S per lane in registers
CONV_T = 16  # tokens per dn_conv thread (the kernel's constant)
CONV_WIDTHS = (2, 3, 4)

SOURCE = (
    HEADER
    + r"""
// grid (ceil(C / 128), ceil(T / CONV_T), segments), block 128. Segment s is rows s*T .. s*T+T-1 of mix; its
// state comes from the table row of its first row. w: the conv kernel [C, W], tap W-1 on the newest input.
// Thread (channel c, token chunk) writes silu(conv) of tokens t0 .. t0+CONV_T-1 to out; the inputs stay
// untouched, so chunks run in parallel, each taking the W-1 inputs before t0 from mix (or, for chunk 0,
// from the state). Chunk 0 alone writes the new window (the segment's last W-1 inputs), after reading the
// old.
template <int W>
__global__ void __launch_bounds__(128) dn_conv(const float* __restrict__ mix, int ld, int C, int T,
                                               const i64* __restrict__ tab, int tab_stride, i64 state_off,
                                               const float* __restrict__ w, float* __restrict__ out,
                                               int ldo) {
  constexpr int CONV_T = 16;
  const int c = blockIdx.x * 128 + threadIdx.x, t0 = blockIdx.y * CONV_T;
  if (c >= C || t0 >= T) return;
  const i64 row0 = (i64)blockIdx.z * T;
  float* st = (float*)tab[row0 * tab_stride + 5] + state_off;
  const float* x = mix + row0 * ld + c;
  float win[W - 1], wt[W];
#pragma unroll
  for (int j = 0; j < W - 1; j++) {
    const int t = t0 - (W - 1) + j;  // times -(W-1) .. -1 are rows 0 .. W-2 of the state
    win[j] = t >= 0 ? x[(i64)t * ld] : st[(i64)(t + W - 1) * C + c];
  }
#pragma unroll
  for (int j = 0; j < W; j++) wt[j] = w[(i64)c * W + j];
  const int t1 = min(T, t0 + CONV_T);
  for (int t = t0; t < t1; t++) {
    const float xin = x[(i64)t * ld];
    float y = 0.f;
#pragma unroll
    for (int j = 0; j < W - 1; j++) y = fmaf(win[j], wt[j], y);
    y = fmaf(xin, wt[W - 1], y);
#pragma unroll
    for (int j = 0; j < W - 2; j++) win[j] = win[j + 1];
    win[W - 2] = xin;
    out[(row0 + t) * ldo + c] = silu(y);
  }
  if (blockIdx.y == 0) {
    float nw[W - 1];
#pragma unroll
    for (int j = 0; j < W - 1; j++) {
      const int t = T - (W - 1) + j;
      nw[j] = t >= 0 ? x[(i64)t * ld] : st[(i64)(t + W - 1) * C + c];
    }
#pragma unroll
    for (int j = 0; j < W - 1; j++) st[(i64)j * C + c] = nw[j];
  }
}

// grid (H, ceil(V / 8), segments), block 32. Reads q|k|v from y (dn_conv's output) and b/a from ba, writes
// o [rows, H*V] at ldo. fused_r > 0: b/a per key head [b(r) | a(r)] (value head h = kh*r + j), else
// [beta (H) | alpha (H)]. tiled: value head h reads key head h % Hk, else h / r.
// Four lanes share a value column v (8 columns a block): lane part p holds rows k = 4i + p of column v of S,
// KD/4 registers, and each of the column's two dot products is summed over its four lanes by two shuffles:
// dependent FMA chains of KD/4, and four times the warps of a lane per column.
template <int KD>
__global__ void __launch_bounds__(32) dn_recur(
    const float* __restrict__ y, int ldy, const float* __restrict__ ba, int ldba, int T,
    const i64* __restrict__ tab, int tab_stride, i64 state_off, int Hk, int H, int V, int tiled, int fused_r,
    const float* __restrict__ a_coef, const float* __restrict__ dt_bias, float* __restrict__ out, int ldo) {
  constexpr int KS = KD / 4;
  __shared__ float qs[KD], ks[KD];
  const int h = blockIdx.x, lane = threadIdx.x, part = lane & 3, v = blockIdx.y * 8 + (lane >> 2);
  const i64 row0 = (i64)blockIdx.z * T;
  const int r = H / Hk, kh = tiled ? h % Hk : h / r;
  const int bcol = fused_r ? (h / fused_r) * 2 * fused_r + h % fused_r : h;
  const int acol = bcol + (fused_r ? fused_r : H);
  float* S = (float*)tab[row0 * tab_stride + 6] + state_off + (i64)h * KD * V;  // [K, V] of head h
  const bool live = v < V;
  float s[KS];
#pragma unroll
  for (int i = 0; i < KS; i++) s[i] = live ? S[(i64)(4 * i + part) * V + v] : 0.f;
  const float A = a_coef[h], dtb = dt_bias[h];
  const float qk_scale = 1.0f / sqrtf((float)KD);
  // A token's inputs (this lane's share of q and k, its v, b and a) are loaded one token ahead: the loads
  // for t+1 are in flight while t is computed, so the chain per token is arithmetic, not an L2 round trip.
  constexpr int PL = (KD + 31) / 32;
  float nq[PL], nk[PL], nv = 0.f, nb = 0.f, na = 0.f;
  auto fetch = [&](int t) {
    const float* row = y + (row0 + t) * ldy;
    const float* brow = ba + (row0 + t) * ldba;
#pragma unroll
    for (int j = 0; j < PL; j++) {
      const int i = lane + 32 * j;
      nq[j] = i < KD ? row[kh * KD + i] : 0.f;
      nk[j] = i < KD ? row[(Hk + kh) * KD + i] : 0.f;
    }
    nv = live ? row[2 * Hk * KD + h * V + v] : 0.f;
    nb = brow[bcol];
    na = brow[acol];
  };
  fetch(0);
  for (int t = 0; t < T; t++) {
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int j = 0; j < PL; j++) {
      const int i = lane + 32 * j;
      if (i < KD) { qs[i] = nq[j]; ks[i] = nk[j]; }
      sq = fmaf(nq[j], nq[j], sq); sk = fmaf(nk[j], nk[j], sk);
    }
    const float vt = nv, bl = nb, al = na;
    if (t + 1 < T) fetch(t + 1);
    sq = warp_sum(sq); sk = warp_sum(sk);
    __syncwarp();
    const float qn = qk_scale / sqrtf(sq + 1e-6f), kn = 1.0f / sqrtf(sk + 1e-6f);
    const float beta = 1.0f / (1.0f + expf(-bl));
    const float x = al + dtb;
    const float decay = expf(A * (x > 20.f ? x : log1pf(expf(x))));
    float kv = 0.f;
#pragma unroll
    for (int i = 0; i < KS; i++) { s[i] *= decay; kv = fmaf(s[i], ks[4 * i + part], kv); }
    kv += __shfl_xor_sync(0xffffffffu, kv, 1);
    kv += __shfl_xor_sync(0xffffffffu, kv, 2);
    const float dk = (vt - kv * kn) * beta * kn;  // the rank-1 write's value, with k's norm folded in
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < KS; i++) {
      s[i] = fmaf(ks[4 * i + part], dk, s[i]);
      o = fmaf(s[i], qs[4 * i + part], o);
    }
    o += __shfl_xor_sync(0xffffffffu, o, 1);
    o += __shfl_xor_sync(0xffffffffu, o, 2);
    if (live && part == 0) out[(row0 + t) * ldo + h * V + v] = o * qn;
    __syncwarp();  // every lane is done with qs/ks before the next token overwrites them
  }
  if (live) {
#pragma unroll
    for (int i = 0; i < KS; i++) S[(i64)(4 * i + part) * V + v] = s[i];
  }
}

// grid (H, rows), block 32: o[row, h*V ..] = rmsnorm(o) * w * silu(z), z at z + row * ldz + h*V
__global__ void __launch_bounds__(32) dn_gated_norm(float* __restrict__ o, int ldo,
                                                    const float* __restrict__ z, int ldz,
                                                    const float* __restrict__ w, int V, float eps) {
  const int h = blockIdx.x, lane = threadIdx.x;
  float* p = o + (i64)blockIdx.y * ldo + h * V;
  const float* g = z + (i64)blockIdx.y * ldz + h * V;
  float s = 0.f;
  for (int i = lane; i < V; i += 32) s = fmaf(p[i], p[i], s);
  const float den = sqrtf(warp_sum(s) / (float)V + eps);
  for (int i = lane; i < V; i += 32) p[i] = ((p[i] / den) * w[i]) * silu(g[i]);
}
"""
)


def conv_name(width: int) -> str:
    return f"dn_conv<{width}>"


def recur_name(k: int) -> str:
    return f"dn_recur<{k}>"


def kernel_names() -> list[str]:
    return [conv_name(w) for w in CONV_WIDTHS] + [recur_name(k) for k in KEY_DIMS] + ["dn_gated_norm"]


def ref_conv(
    mix: np.ndarray, c: int, window: np.ndarray, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`dn_conv` on one segment: silu(conv) [T, C] of mix's first c columns, and the new window."""
    y, window = causal_conv1d(mix[:, :c], window, weight)
    return silu(y), window


def ba_columns(n_k: int, n_v: int, fused_r: int) -> tuple[np.ndarray, np.ndarray]:
    """Columns of beta and alpha per value head inside the b/a block (see the module docstring)."""
    h = np.arange(n_v)
    if fused_r:
        b = (h // fused_r) * 2 * fused_r + h % fused_r
        return b, b + fused_r
    return h, h + n_v


def ref_recur(
    y: np.ndarray,
    ba: np.ndarray,
    n_k: int,
    n_v: int,
    k: int,
    v: int,
    fused_r: int,
    tiled: bool,
    a_coef: np.ndarray,
    dt_bias: np.ndarray,
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """`dn_recur` on one segment: y [T, C] from dn_conv, ba [T, 2H] the b/a block; state [H, K, V].
    Returns o [T, H*V] and the state."""
    t = y.shape[0]
    q = y[:, : n_k * k].reshape(t, n_k, k)
    kk = y[:, n_k * k : 2 * n_k * k].reshape(t, n_k, k)
    vv = y[:, 2 * n_k * k : 2 * n_k * k + n_v * v].reshape(t, n_v, v)
    heads = np.arange(n_v) % n_k if tiled else np.arange(n_v) // (n_v // n_k)
    q, kk = normalize_qk(q[:, heads], kk[:, heads])
    bc, ac = ba_columns(n_k, n_v, fused_r)
    beta = sigmoid(ba[:, bc])
    g = (a_coef * softplus(ba[:, ac] + dt_bias)).astype(np.float32)
    o, state = gated_delta_recurrent(q, kk, vv, g, beta, state)
    return o.reshape(t, n_v * v), state


def ref_gated_norm(o: np.ndarray, z: np.ndarray, w: np.ndarray, n_v: int, eps: float) -> np.ndarray:
    """`dn_gated_norm`: o, z [T, H*V] -> [T, H*V]."""
    t = o.shape[0]
    return gated_rms_norm(o.reshape(t, n_v, -1), w, z.reshape(t, n_v, -1), eps).reshape(t, -1)

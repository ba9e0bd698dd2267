"""Decode products on int8 activations: the weights' own integer codes times int8 inputs, 4 at a time (dp4a).

Decode is bound by how fast the weight bytes stream in, and per weight the fp32 kernels (gemv.py) spend a
decode, a convert and an FMA per value and a dozen loads per 8 values. Here each lane takes 32 weights
at once (one 16-byte load for Q4_K), keeps the codes as packed bytes and multiplies them with the input's
int8 codes by `dp4a`; the block scales are applied once per 16 products. Inputs are quantized per 32
values (`q8_store`: d = max|x| / 127, code = rint(x / d), and d * sum(codes) for the Q4_K minimum term),
as llama.cpp's q8_1 does.

- `mmvq`: y (+)= W . f(x) for up to NT tokens: every block quantizes f(x) (PRO 0: x; 1: RMSNorm(x); 2:
  silu(g) * u of a [2K] row) into shared memory, then `split` warps share each row as in gemv_split.
- `moe_gate_up_q8`: 32 expert rows of one (token, slot) pair per block; the block writes
  silu(gate . h) * (up . h) already quantized, so `moe_down_q8` reads int8 codes and each warp's lanes
  cover every slot of its row (slot-major order, so the sum's order is fixed: batch == solo).

Formats: Q4_K, Q6_K, Q8_0 (`V<type>::dot`, 32 weights per unit); others keep the fp32 kernels.
Numpy twins: `quantize_q8`, `ref_mmvq`, `ref_moe_q8` (dequantize, then float64 products with the
dequantized int8 inputs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from strata.blocks.moe import dispatch
from strata.blocks.norms import rms_norm, silu
from strata.gpu.kernels.common import HEADER
from strata.quants import dequantize

MMVQ_TYPES: frozenset[int] = frozenset({int(T.Q4_K), int(T.Q6_K), int(T.Q8_0)})
MAX_K = 8192  # staging keeps 4 chunks of 8 inputs per thread in registers
ROWS_PER_GATE_UP_BLOCK = 32  # one quantization group of the expert activations

SOURCE = (
    HEADER
    + r"""
#define MAXC 4

// Quantize one token's K inputs f(x) into shared memory: xq [K] codes, xds [K / 32] (d, d * sum).
// Thread i holds chunks i, i + 256, ... of 8 values; four consecutive lanes make one group of 32.
template <int PRO>
__device__ __forceinline__ void stage_row_q8(i8* xq, float2* xds, const float* r, int K, const float* nw,
                                             float eps, float* red) {
  const int nc = K >> 3, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float v[MAXC][8];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < MAXC; k++) {
    const int c = threadIdx.x + 256 * k;
#pragma unroll
    for (int i = 0; i < 8; i++) v[k][i] = 0.f;
    if (c < nc) {
      if (PRO == 2) {
        const float4 g0 = *(const float4*)(r + 8 * c), g1 = *(const float4*)(r + 8 * c + 4);
        const float4 u0 = *(const float4*)(r + K + 8 * c), u1 = *(const float4*)(r + K + 8 * c + 4);
        v[k][0] = silu(g0.x) * u0.x; v[k][1] = silu(g0.y) * u0.y;
        v[k][2] = silu(g0.z) * u0.z; v[k][3] = silu(g0.w) * u0.w;
        v[k][4] = silu(g1.x) * u1.x; v[k][5] = silu(g1.y) * u1.y;
        v[k][6] = silu(g1.z) * u1.z; v[k][7] = silu(g1.w) * u1.w;
      } else {
        const float4 a = *(const float4*)(r + 8 * c), b = *(const float4*)(r + 8 * c + 4);
        v[k][0] = a.x; v[k][1] = a.y; v[k][2] = a.z; v[k][3] = a.w;
        v[k][4] = b.x; v[k][5] = b.y; v[k][6] = b.z; v[k][7] = b.w;
      }
      if (PRO == 1)
#pragma unroll
        for (int i = 0; i < 8; i++) ss += v[k][i] * v[k][i];
    }
  }
  float inv = 1.f;
  if (PRO == 1) {
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += red[w];
    inv = 1.0f / sqrtf(s / (float)K + eps);
    __syncthreads();  // red is rewritten by the next token
  }
#pragma unroll
  for (int k = 0; k < MAXC; k++) {
    if (256 * k >= nc) break;  // uniform: every lane of a warp takes part in q8_store's shuffles
    const int c = threadIdx.x + 256 * k;
    if (PRO == 1 && c < nc)
#pragma unroll
      for (int i = 0; i < 8; i++) v[k][i] = v[k][i] * inv * nw[8 * c + i];
    q8_store(v[k], c < nc ? (u32*)(xq + 8 * c) : nullptr, xds + (c >> 2));
  }
}

// Rows x [n, K] as the experts' int8 inputs (hq [n, K], hds [n, K / 32]) where no fused router launch
// wrote them: hyper-connection layers have no norm for router_topk to fuse. Grid (n), block 256.
__global__ void __launch_bounds__(256) q8_rows(const float* __restrict__ x, int ldx, int K,
                                               i8* __restrict__ xq, float2* __restrict__ xds) {
  __shared__ float red[8];
  const int t = blockIdx.x;
  stage_row_q8<0>(xq + (i64)t * K, xds + (i64)t * (K >> 5), x + (i64)t * ldx, K, nullptr, 0.f, red);
}

// 32 weights of a row (unit u) against the inputs' codes: acc[t] += sum over the unit for t < n.
template <int QT> struct V;

template <> struct V<12> {  // Q4_K: unit = 16 bytes of qs = half of a 64-value group (2 sub-blocks x 16)
  template <int NT>
  static __device__ __forceinline__ void dot(const u8* row, int u, const i8* xq, const float2* xds, int K,
                                             int n, float* acc) {
    const u8* b = row + (u >> 3) * 144;
    const int j = (u >> 1) & 3, hh = u & 1;
    const uint4 q = __ldg((const uint4*)(b + 16 + 32 * j + 16 * hh));
    const u32 dd = __ldg((const u32*)b);
    int sc0, m0, sc1, m1;
    scale_min_k4(b + 4, 2 * j, &sc0, &m0);
    scale_min_k4(b + 4, 2 * j + 1, &sc1, &m1);
    const float d = h2f(dd & 0xFFFF), dmin = h2f(dd >> 16);
    const int l0 = q.x & 0x0F0F0F0F, l1 = q.y & 0x0F0F0F0F, l2 = q.z & 0x0F0F0F0F, l3 = q.w & 0x0F0F0F0F;
    const int h0 = (q.x >> 4) & 0x0F0F0F0F, h1 = (q.y >> 4) & 0x0F0F0F0F, h2 = (q.z >> 4) & 0x0F0F0F0F,
              h3 = (q.w >> 4) & 0x0F0F0F0F;
    const int g = (u >> 3) * 8 + 2 * j;  // the low nibbles' group of 32 inputs; the high nibbles' is g + 1
#pragma unroll
    for (int t = 0; t < NT; t++)
      if (t < n) {
        const int4 a = *(const int4*)(xq + t * K + 32 * g + 16 * hh);
        const int4 c = *(const int4*)(xq + t * K + 32 * g + 32 + 16 * hh);
        const int s0 = dp4a(l3, a.w, dp4a(l2, a.z, dp4a(l1, a.y, dp4a(l0, a.x, 0))));
        const int s1 = dp4a(h3, c.w, dp4a(h2, c.z, dp4a(h1, c.y, dp4a(h0, c.x, 0))));
        const float2 x0 = xds[t * (K >> 5) + g], x1 = xds[t * (K >> 5) + g + 1];
        float r = d * ((float)sc0 * x0.x * (float)s0 + (float)sc1 * x1.x * (float)s1);
        if (hh == 0) r -= dmin * ((float)m0 * x0.y + (float)m1 * x1.y);  // each group's minimum term once
        acc[t] += r;
      }
  }
};

template <> struct V<14> {  // Q6_K: unit = 16 bytes of ql (two quarters' low 4 bits) + their 16 qh bytes
  template <int NT>
  static __device__ __forceinline__ void dot(const u8* row, int u, const i8* xq, const float2* xds, int K,
                                             int n, float* acc) {
    const u8* b = row + (u >> 3) * 210;  // 210-byte blocks are only 2-aligned
    const int v = u & 7, h = v >> 2, s = (v >> 1) & 1, vv = v & 1;
    const u8* ql = b + 64 * h + 32 * s + 16 * vv;
    const u8* qh = b + 128 + 32 * h + 16 * vv;
    int lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const u32 l = ld32a2(ql + 4 * i), m = ld32a2(qh + 4 * i);
      // 6-bit codes 0..63 per byte; (c + 0x60) ^ 0x80 is c - 32 as a signed byte, with no carry between bytes
      lo[i] = (int)((((l & 0x0F0F0F0Fu) | (((m >> (2 * s)) & 0x03030303u) << 4)) + 0x60606060u) ^
                    0x80808080u);
      hi[i] = (int)(((((l >> 4) & 0x0F0F0F0Fu) | (((m >> (2 * s + 4)) & 0x03030303u) << 4)) + 0x60606060u) ^
                    0x80808080u);
    }
    const float d = ldh(b + 208);
    const float sl = (float)(signed char)b[192 + 8 * h + 2 * s + vv],
                sh = (float)(signed char)b[196 + 8 * h + 2 * s + vv];
    const int g = (u >> 3) * 8 + 4 * h + s;  // quarter s of half h; the high nibbles are quarter s + 2
#pragma unroll
    for (int t = 0; t < NT; t++)
      if (t < n) {
        const int4 a = *(const int4*)(xq + t * K + 32 * g + 16 * vv);
        const int4 c = *(const int4*)(xq + t * K + 32 * g + 64 + 16 * vv);
        const int s0 = dp4a(lo[3], a.w, dp4a(lo[2], a.z, dp4a(lo[1], a.y, dp4a(lo[0], a.x, 0))));
        const int s1 = dp4a(hi[3], c.w, dp4a(hi[2], c.z, dp4a(hi[1], c.y, dp4a(hi[0], c.x, 0))));
        const float2 x0 = xds[t * (K >> 5) + g], x1 = xds[t * (K >> 5) + g + 2];
        acc[t] += d * (sl * x0.x * (float)s0 + sh * x1.x * (float)s1);
      }
  }
};

template <> struct V<8> {  // Q8_0: unit = one 34-byte block
  template <int NT>
  static __device__ __forceinline__ void dot(const u8* row, int u, const i8* xq, const float2* xds, int K,
                                             int n, float* acc) {
    const u8* b = row + u * 34;
    int w[8];
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = (int)ld32a2(b + 2 + 4 * i);
    const float d = ldh(b);
#pragma unroll
    for (int t = 0; t < NT; t++)
      if (t < n) {
        const int4 a = *(const int4*)(xq + t * K + 32 * u), c = *(const int4*)(xq + t * K + 32 * u + 16);
        int s = dp4a(w[0], a.x, dp4a(w[1], a.y, dp4a(w[2], a.z, dp4a(w[3], a.w, 0))));
        s = dp4a(w[4], c.x, dp4a(w[5], c.y, dp4a(w[6], c.z, dp4a(w[7], c.w, s))));
        acc[t] += d * xds[t * (K >> 5) + u].x * (float)s;
      }
  }
};

// y[t, row] (+)= W[row] . f(x[t]); rows below r1 from W0, below r2 from W1, the rest from W2 (q|k|v).
// Dynamic smem: NT * (K + K / 4) bytes: codes (each token's row 32-aligned for the 16-byte loads), then
// scales. Grid (row blocks, token groups of NT).
template <int QT, int NT, int PRO>
__global__ void __launch_bounds__(256) mmvq(
    const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2, int r1, int r2,
    i64 row_bytes, int rows, int K, const float* __restrict__ x, int ldx, int n_tok,
    const float* __restrict__ nw, float eps, float* __restrict__ y, int ldy, int accumulate, int split) {
  extern __shared__ float4 smem4[];
  i8* xq = (i8*)smem4;
  float2* xds = (float2*)(xq + NT * K);
  __shared__ float part[8][NT];
  __shared__ float red[8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t0 = blockIdx.y * NT, n = min(NT, n_tok - t0);
  const int rpb = 8 / split, sub = warp % split, nu = K >> 5;
  {  // start this warp's first row towards L2 while the inputs are staged
    const int r = blockIdx.x * rpb + warp / split;
    if (r < rows) {
      const u8* row = cat_row(W0, W1, W2, r1, r2, row_bytes, r);
      for (i64 o = 128 * (i64)(sub * 32 + lane); o < row_bytes; o += 128 * 32 * split) prefetch_l2(row + o);
    }
  }
  for (int t = 0; t < n; t++)
    stage_row_q8<PRO>(xq + t * K, xds + t * nu, x + (i64)(t0 + t) * ldx, K, nw, eps, red);
  __syncthreads();
  for (int base = blockIdx.x * rpb; base < rows; base += gridDim.x * rpb) {  // uniform over the block
    const int r = base + warp / split;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if (r < rows) {
      const u8* row = cat_row(W0, W1, W2, r1, r2, row_bytes, r);
#pragma unroll 2
      for (int u = sub * 32 + lane; u < nu; u += 32 * split)
        V<QT>::template dot<NT>(row, u, xq, xds, K, n, acc);
    }
    split_store<NT>(acc, part, split, r, rows, n, nullptr, y, t0, ldy, accumulate);
  }
}

// act for pair p, rows 32 * blockIdx.x .. + 31: silu(gate_e . h) * (up_e . h) with e = ids[p], h = row p / A
// of the quantized inputs (hq, hds), written quantized (aq [P, F], ads [P, F / 32]).
// Warp w: rows 4w .. 4w + 3.
template <int QG, int QU>
__global__ void __launch_bounds__(256) moe_gate_up_q8(
    const i64* __restrict__ Tg, const i64* __restrict__ Tu, i64 g_row, i64 u_row,
    const int* __restrict__ ids, int A, const i8* __restrict__ hq, const float2* __restrict__ hds,
    int D, int F, i8* __restrict__ aq, float2* __restrict__ ads) {
  __shared__ float gs[32], us[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, p = blockIdx.y, e = ids[p];
  const int j0 = blockIdx.x * 32 + 4 * warp, nu = D >> 5;
  const i8* xq = hq + (i64)(p / A) * D;
  const float2* xd = hds + (i64)(p / A) * nu;
  const u8* rg = (const u8*)Tg[e] + j0 * g_row;
  const u8* ru = (const u8*)Tu[e] + j0 * u_row;
  float acc[8];
#pragma unroll
  for (int k = 0; k < 8; k++) acc[k] = 0.f;
  for (int u = lane; u < nu; u += 32)
#pragma unroll
    for (int k = 0; k < 4; k++) {
      V<QG>::template dot<1>(rg + k * g_row, u, xq, xd, D, 1, acc + k);
      V<QU>::template dot<1>(ru + k * u_row, u, xq, xd, D, 1, acc + 4 + k);
    }
#pragma unroll
  for (int k = 0; k < 8; k++) acc[k] = warp_sum(acc[k]);
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < 4; k++) { gs[4 * warp + k] = acc[k]; us[4 * warp + k] = acc[4 + k]; }
  __syncthreads();
  if (warp == 0) {
    float v[8];
    const int k0 = (lane & 3) * 8;  // lanes 0..3 hold the group's 32 values, 8 each; the rest hold zeros
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = lane < 4 ? silu(gs[k0 + i]) * us[k0 + i] : 0.f;
    q8_store(v, lane < 4 ? (u32*)(aq + (i64)p * F + blockIdx.x * 32 + k0) : nullptr,
             ads + (i64)p * (F >> 5) + blockIdx.x);
  }
}

// x[t, r] += sum_a w[t, a] * (down_e[r] . act[t * A + a]); one warp per row, grid (D / 8, T)
template <int QD>
__global__ void __launch_bounds__(256) moe_down_q8(
    const i64* __restrict__ Td, i64 d_row, const int* __restrict__ ids, const float* __restrict__ wts,
    int A, const i8* __restrict__ aq, const float2* __restrict__ ads, int D, int F, float* __restrict__ x) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.y, r = blockIdx.x * 8 + warp;
  if (r >= D) return;
  const int nu = F >> 5, total = A * nu;
  float acc = 0.f;
#pragma unroll 2
  for (int k = lane; k < total; k += 32) {
    const int a = k / nu, u = k - a * nu, p = t * A + a;
    float s = 0.f;
    V<QD>::template dot<1>((const u8*)Td[ids[p]] + r * d_row, u, aq + (i64)p * F, ads + (i64)p * nu,
                           F, 1, &s);
    acc = fmaf(wts[p], s, acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) x[(i64)t * D + r] += acc;
}
"""
)


def mmvq_name(qt: int, nt: int, pro: int) -> str:
    return f"mmvq<{qt},{nt},{pro}>"


def gate_up_q8_name(qg: int, qu: int) -> str:
    return f"moe_gate_up_q8<{qg},{qu}>"


def down_q8_name(qd: int) -> str:
    return f"moe_down_q8<{qd}>"


def smem_bytes(nt: int, k: int) -> int:
    return nt * (k + k // 4)


def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [n, K] float32 -> codes int8 [n, K], scales d float32 [n, K / 32], as `q8_store` rounds them."""
    n, k = x.shape
    g = x.astype(np.float32).reshape(n, k // 32, 32)
    amax = np.abs(g).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))[..., None]
    q = np.where(amax[..., None] > 0, np.rint(g / safe), 0).astype(np.int8)
    return q.reshape(n, k), d


def dequantize_q8(x: np.ndarray) -> np.ndarray:
    """What the kernels multiply with: each input replaced by d * code, in float64."""
    q, d = quantize_q8(x)
    return q.astype(np.float64) * np.repeat(d.astype(np.float64), 32, axis=1)


def ref_mmvq(
    w_raw: np.ndarray,
    qtype: int,
    x: np.ndarray,
    pro: int = 0,
    norm_w: np.ndarray | None = None,
    eps: float = 1e-6,
) -> np.ndarray:
    """x [n, K] (or [n, 2K] for pro=2) -> [n, rows]: what `mmvq` computes."""
    if pro == 1:
        assert norm_w is not None
        x = rms_norm(x, norm_w, eps)
    elif pro == 2:
        k = x.shape[1] // 2
        x = silu(x[:, :k]) * x[:, k:]
    w = dequantize(w_raw, qtype).astype(np.float64)
    return (dequantize_q8(np.asarray(x, np.float32)) @ w.T).astype(np.float32)


def ref_moe_q8(
    h: np.ndarray,
    ids: np.ndarray,
    weights: np.ndarray,
    gate: Callable[[int], np.ndarray],
    up: Callable[[int], np.ndarray],
    down: Callable[[int], np.ndarray],
) -> np.ndarray:
    """The expert FFN as `moe_gate_up_q8` + `moe_down_q8` compute it: h and each expert's activations
    quantized per 32 values; gate/up/down(e) give expert e's dequantized matrices."""
    hq = dequantize_q8(h)

    def expert(e: int, rows: np.ndarray) -> np.ndarray:
        g, u = rows @ gate(e).T, rows @ up(e).T
        act = (g / (1 + np.exp(-g)) * u).astype(np.float32)
        return dequantize_q8(act) @ down(e).T

    return dispatch(hq, ids, weights, expert)

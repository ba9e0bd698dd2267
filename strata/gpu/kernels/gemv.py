"""Matrix-vector products on quantized weights (decode, and any batch of up to 8 tokens).

One warp per weight row: lane l decodes chunks l, l+32, ... of 8 elements (`Q<QT>::deq8`) and
multiplies them with up to NT tokens' inputs staged in shared memory, so each weight byte is read
once per NT tokens. The input can be transformed while it is staged (PRO): 0 = as is, 1 = RMSNorm
(the block also writes the normed rows once, for the kernels that follow), 2 = silu(a) * b of a
[2K] gate|up row. Up to three weight tensors with the same type and width are read as one matrix
(q|k|v): rows below r1 come from W0, below r2 from W1, the rest from W2.

Numpy twin: `ref_gemv` (dequantize, then float64 products).
"""

from __future__ import annotations

import numpy as np

from strata.blocks.norms import rms_norm, silu
from strata.gpu.kernels.common import HEADER
from strata.gpu.kernels.moe import TOPK_WARP
from strata.quants import dequantize

WARPS = 8  # rows per block per pass

SOURCE = (
    HEADER
    + TOPK_WARP
    + r"""
// Stage NT tokens' inputs [NT][K] into shared memory, transformed by PRO; zero rows past n.
template <int NT, int PRO>
__device__ __forceinline__ void stage_x(float* xs, const float* x, int ldx, int n, int K,
                                        const float* nw, float eps, float* hout, int ldh) {
  for (int t = 0; t < NT; t++)
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
      float v = 0.0f;
      if (t < n) {
        const float* r = x + (i64)t * ldx;
        v = PRO == 2 ? silu(r[i]) * r[K + i] : r[i];
      }
      xs[t * K + i] = v;
    }
  if (PRO == 1) {
    __shared__ float red[32];
    __syncthreads();
    for (int t = 0; t < n; t++) {
      float s = 0.0f;
      for (int i = threadIdx.x; i < K; i += blockDim.x) s += xs[t * K + i] * xs[t * K + i];
      s = warp_sum(s);
      if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
      __syncthreads();
      if (threadIdx.x < 32) {
        float r = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.0f;
        r = warp_sum(r);
        if (threadIdx.x == 0) red[0] = sqrtf(r / (float)K + eps);
      }
      __syncthreads();
      const float den = red[0];
      for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float v = (xs[t * K + i] / den) * nw[i];
        xs[t * K + i] = v;
        if (hout != nullptr && blockIdx.x == 0) hout[(i64)t * ldh + i] = v;
      }
      __syncthreads();
    }
  }
  __syncthreads();
}

// acc[t] += row . xs[t] over the row's K elements; lane-strided chunks of 8, warp-reduced by the caller
template <int QT, int NT>
__device__ __forceinline__ void row_dot(const u8* row, const float* xs, int K, float* acc) {
  const int lane = threadIdx.x & 31;
#pragma unroll 2  // two chunks' loads in flight before the first use
  for (int c = lane; c < (K >> 3); c += 32) {
    float v[8];
    Q<QT>::deq8(row, c, v);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      const float4 a = *(const float4*)(xs + t * K + 8 * c);
      const float4 b = *(const float4*)(xs + t * K + 8 * c + 4);
      float s = acc[t];
      s = fmaf(v[0], a.x, s); s = fmaf(v[1], a.y, s); s = fmaf(v[2], a.z, s); s = fmaf(v[3], a.w, s);
      s = fmaf(v[4], b.x, s); s = fmaf(v[5], b.y, s); s = fmaf(v[6], b.z, s); s = fmaf(v[7], b.w, s);
      acc[t] = s;
    }
  }
}

// y[t, row] (+)= W[row] . f(x[t]) for tokens blockIdx.y*NT .. +NT; dynamic smem = NT*K floats.
template <int QT, int NT, int PRO>
__global__ void __launch_bounds__(256) gemv(
    const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2, int r1, int r2,
    i64 row_bytes, int rows, int K, const float* __restrict__ x, int ldx, int n_tok,
    const float* __restrict__ nw, float eps, float* __restrict__ hout, int ldh,
    float* __restrict__ y, int ldy, int accumulate) {
  extern __shared__ float4 smem4[];
  float* xs = (float*)smem4;
  const int t0 = blockIdx.y * NT;
  const int n = min(NT, n_tok - t0);
  stage_x<NT, PRO>(xs, x + (i64)t0 * ldx, ldx, n, K, nw, eps,
                   hout == nullptr ? nullptr : hout + (i64)t0 * ldh, ldh);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = blockIdx.x * (blockDim.x >> 5) + warp; r < rows; r += gridDim.x * (blockDim.x >> 5)) {
    const u8* row = cat_row(W0, W1, W2, r1, r2, row_bytes, r);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    row_dot<QT, NT>(row, xs, K, acc);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      float s = warp_sum(acc[t]);
      if (lane == 0 && t < n) {
        float* o = y + (i64)(t0 + t) * ldy + r;
        *o = accumulate ? *o + s : s;
      }
    }
  }
}

// The decode form: `split` warps share each row (1, 2, 4 or 8), so small matrices still put ~4k warps'
// loads in flight, and x is read straight from global memory (L1-resident: every warp of the block
// reads the same rows) instead of being staged first. PRO 1 folds the norm weight into the decoded
// weights and scales each dot by 1/rms at the end. The sums of squares are spread over every thread
// of the block (one float4 in flight per thread and token for K <= 1024, two for K = 2048), so no
// warp waits on a long serial chain of loads; an extra barrier publishes 1/rms before the rows.
#define GEMV_SPLIT_ARGS \
    const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2, int r1, int r2, \
    i64 row_bytes, int rows, int K, const float* __restrict__ x, int ldx, int n_tok, \
    const float* __restrict__ nw, float eps, float* __restrict__ hout, int ldh, \
    float* __restrict__ y, int ldy, int accumulate, int split
template <int QT, int NT, int PRO>
__device__ __forceinline__ void gemv_split_body(GEMV_SPLIT_ARGS) {
  __shared__ float part[8][NT];
  __shared__ float inv[NT];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t0 = blockIdx.y * NT, n = min(NT, n_tok - t0);
  x += (i64)t0 * ldx;
  if (PRO == 1) {
    float ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) ss[t] = 0.f;
#pragma unroll 4
    for (int i = 4 * threadIdx.x; i < K; i += 4 * blockDim.x) {
#pragma unroll
      for (int t = 0; t < NT; t++)
        if (t < n) {
          const float4 a = __ldg((const float4*)(x + (i64)t * ldx + i));
          ss[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
      const float s = warp_sum(ss[t]);
      if (lane == 0) part[warp][t] = s;
    }
    __syncthreads();
    if (threadIdx.x < n) {
      float s = 0.f;
      for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += part[w][threadIdx.x];
      inv[threadIdx.x] = 1.0f / sqrtf(s / (float)K + eps);
    }
    __syncthreads();  // inv is read only after the rows' first barrier, but part is rewritten below
  }
  const int rpb = 8 / split, sub = warp % split, nch = K >> 3;
  for (int base = blockIdx.x * rpb; base < rows; base += gridDim.x * rpb) {  // uniform over the block
    const int r = base + warp / split;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if (r < rows) {
      const u8* row = cat_row(W0, W1, W2, r1, r2, row_bytes, r);
#pragma unroll 2
      for (int c = sub * 32 + lane; c < nch; c += 32 * split) {
        float v[8];
        Q<QT>::deq8(row, c, v);
        if (PRO == 1) {
          const float4 ga = __ldg((const float4*)(nw + 8 * c)), gb = __ldg((const float4*)(nw + 8 * c + 4));
          v[0] *= ga.x; v[1] *= ga.y; v[2] *= ga.z; v[3] *= ga.w;
          v[4] *= gb.x; v[5] *= gb.y; v[6] *= gb.z; v[7] *= gb.w;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
          if (t < n) {
            const float4 a = __ldg((const float4*)(x + (i64)t * ldx + 8 * c));
            const float4 b = __ldg((const float4*)(x + (i64)t * ldx + 8 * c + 4));
            float s = acc[t];
            s = fmaf(v[0], a.x, s); s = fmaf(v[1], a.y, s); s = fmaf(v[2], a.z, s); s = fmaf(v[3], a.w, s);
            s = fmaf(v[4], b.x, s); s = fmaf(v[5], b.y, s); s = fmaf(v[6], b.z, s); s = fmaf(v[7], b.w, s);
            acc[t] = s;
          }
        }
      }
    }
    split_store<NT>(acc, part, split, r, rows, n, PRO == 1 ? inv : nullptr, y, t0, ldy, accumulate);
  }
  if (PRO == 1 && hout != nullptr && blockIdx.x == 0)  // block 0 ran the loop, so inv is published
    for (int t = 0; t < n; t++)
      for (int i = threadIdx.x; i < K; i += blockDim.x)
        hout[(i64)(t0 + t) * ldh + i] = x[(i64)t * ldx + i] * inv[t] * nw[i];
}

template <int QT, int NT, int PRO>
__global__ void __launch_bounds__(256) gemv_split(GEMV_SPLIT_ARGS) {
  gemv_split_body<QT, NT, PRO>(W0, W1, W2, r1, r2, row_bytes, rows, K, x, ldx, n_tok, nw, eps, hout, ldh, y,
                               ldy, accumulate, split);
}

// The MoE router of decode rows: gemv_split with the fused RMSNorm (logits y [n_tok, rows = E]), then the
// last block of the grid to finish routes every token as moe_topk does, so routing needs no launch of
// its own. counter: one int, 0 between launches (the last block puts it back). Dynamic smem: 8 * E floats.
// hq != null: block 0 also writes the normed rows it wrote to hout as int8 codes (hq [n, K], hds [n, K / 32])
// for the experts' int8 kernels (mmvq.py).
template <int QT, int NT>
__global__ void __launch_bounds__(256) router_topk(GEMV_SPLIT_ARGS, int* __restrict__ counter, int A,
                                                   int norm_topk, int* __restrict__ ids,
                                                   float* __restrict__ wts, i8* __restrict__ hq,
                                                   float2* __restrict__ hds) {
  extern __shared__ float4 smem4[];
  __shared__ int last;
  gemv_split_body<QT, NT, 1>(W0, W1, W2, r1, r2, row_bytes, rows, K, x, ldx, n_tok, nw, eps, hout, ldh, y,
                             ldy, accumulate, split);
  if (hq != nullptr && blockIdx.x == 0) {
    __syncthreads();  // this block's hout writes are visible to all its threads
    const int t0 = blockIdx.y * NT, n = min(NT, n_tok - t0), nc = K >> 3;
    for (int t = t0; t < t0 + n; t++)
      for (int c0 = 0; c0 < nc; c0 += blockDim.x) {
        const int c = c0 + threadIdx.x;
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = c < nc ? hout[(i64)t * ldh + 8 * c + i] : 0.f;
        q8_store(v, c < nc ? (u32*)(hq + (i64)t * K + 8 * c) : nullptr, hds + (i64)t * (K >> 5) + (c >> 2));
      }
  }
  __threadfence();  // this block's logits are visible to whichever block finishes last
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == (int)(gridDim.x * gridDim.y) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int warp = threadIdx.x >> 5;
  for (int t = warp; t < n_tok; t += blockDim.x >> 5)
    topk_warp(y + (i64)t * ldy, rows, A, norm_topk, (float*)smem4 + warp * rows, ids + t * A, wts + t * A);
  if (threadIdx.x == 0) *counter = 0;
}

// Whole rows of a matrix as float32 (embedding lookup; also the dequantization test)
template <int QT>
__global__ void __launch_bounds__(128) get_rows(const u8* __restrict__ W, i64 row_bytes,
                                                const i64* __restrict__ ids, int id_stride, int K,
                                                float* __restrict__ out) {
  const u8* row = W + ids[(i64)blockIdx.x * id_stride] * row_bytes;
  for (int c = threadIdx.x; c < (K >> 3); c += blockDim.x) {
    float v[8];
    Q<QT>::deq8(row, c, v);
    float4* o = (float4*)(out + (i64)blockIdx.x * K + 8 * c);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}
"""
)


def gemv_name(qt: int, nt: int, pro: int) -> str:
    return f"gemv<{qt},{nt},{pro}>"


def gemv_split_name(qt: int, nt: int, pro: int) -> str:
    return f"gemv_split<{qt},{nt},{pro}>"


# The split-K target: rows * split warps. On the H200 (132 SMs, ~40 resident warps each at these
# kernels' 48-64 registers) 4096 keeps each gemv in about one wave: decode b=1 263 tok/s against 249 at
# 16384 and 237 at 32768, b=4 487 against 480 (perf/bench_gpu.py --sweep). Module-level so --sweep can
# retune it; the graphs capture whatever it is when they are built.
WARPS_IN_FLIGHT = 4096


def split_for(rows: int, k: int, cap: int = 8) -> int:
    """Warps per row: enough that ~WARPS_IN_FLIGHT warps are in flight, while every lane keeps at least a
    chunk."""
    s = 1
    while s < cap and rows * s * 2 <= WARPS_IN_FLIGHT and k // 8 >= 32 * s * 2:
        s *= 2
    return s


def router_topk_name(qt: int, nt: int) -> str:
    return f"router_topk<{qt},{nt}>"


def get_rows_name(qt: int) -> str:
    return f"get_rows<{qt}>"


def ref_gemv(
    w_raw: np.ndarray,
    qtype: int,
    x: np.ndarray,
    pro: int = 0,
    norm_w: np.ndarray | None = None,
    eps: float = 1e-6,
) -> np.ndarray:
    """x [n, K] (or [n, 2K] for pro=2) -> [n, rows]: what `gemv` computes, in float64 products."""
    w = dequantize(w_raw, qtype).astype(np.float64)
    if pro == 1:
        assert norm_w is not None
        x = rms_norm(x, norm_w, eps)
    elif pro == 2:
        k = x.shape[1] // 2
        x = silu(x[:, :k]) * x[:, k:]
    return (x.astype(np.float64) @ w.T).astype(np.float32)

"""Mixture-of-experts on the GPU: softmax top-k routing, and expert FFNs two ways.

Legend: T = tokens, D = hidden size, F = expert width, E = experts, A = active experts per token,
P = T * A (token, slot) pairs.

- `moe_topk`: one warp per token (`topk_warp`): softmax over E logits, then A rounds of warp argmax
  (ties to the lower expert id, as a stable argsort does), weights renormalised when the model asks.
  Decode rows route inside the router gemv instead (gemv.py `router_topk`, same `topk_warp`).
Every expert kernel finds expert e's matrix at the address `T[e]` of its table (a VRAM slot, or
pinned RAM read over PCIe: strata.tiers.slots), never at a fixed stride, so the expert cache can
change what is where without touching the kernels or a captured graph.

- Few tokens (decode): `moe_gate_up` and `moe_down` read each pair's expert straight from the ids,
  one warp per weight row as in gemv; `moe_down` also sums the A slots and adds into the residual.
- Many tokens (prefill): grouped by expert on the GPU. `moe_count` histograms the ids,
  `moe_plan` scans the counts into row offsets and a list of 64-row tiles (expert, first row, rows),
  `moe_scatter` gives each pair its row in expert order; then `qgemm` in grouped mode runs each
  expert's tiles, and `moe_combine` adds sum_a w[t, a] * y[row(t, a)] into the residual in slot
  order, so the result does not depend on the order atomics handed out rows.

Numpy twins: `ref_topk`, `ref_plan` (the grouping, index for index), `ref_moe` (the whole FFN).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from strata.blocks.moe import dispatch, route_softmax_topk
from strata.gpu.kernels.common import HEADER

TILE = 64  # rows per grouped-GEMM tile; equals gemm.BM

TOPK_WARP = r"""
// One warp routes one token: softmax over its E logits l (read through L2, as another block of the same
// launch may have just written them), then A rounds of warp argmax (ties to the lower expert id, as a
// stable argsort does); p: E floats of shared scratch. ids, w: the token's A slots.
__device__ __forceinline__ void topk_warp(const float* l, int E, int A, int norm, float* p, int* ids,
                                          float* w) {
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, __ldcg(l + e));
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) { const float v = expf(__ldcg(l + e) - mx); p[e] = v; sum += v; }
  sum = warp_sum(sum);
  for (int e = lane; e < E; e += 32) p[e] = p[e] / sum;
  __syncwarp();
  float chosen = 0.f, total = 0.f;
  for (int a = 0; a < A; a++) {
    float best = -1.f; int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32)
      if (p[e] > best) { best = p[e]; bi = e; }  // lanes scan ascending ids: strict > keeps the lowest
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
    }
    if (lane == a) chosen = best;
    total += best;
    if (lane == 0) { ids[a] = bi; p[bi] = -2.f; }
    __syncwarp();
  }
  if (lane < A) w[lane] = norm ? chosen / total : chosen;
}
"""

SOURCE = (
    HEADER
    + TOPK_WARP
    + r"""
#define TILE 64

// logits [T, E] -> ids [T, A] int32, w [T, A]; block = 4 warps, one token each; smem 4*E floats
__global__ void __launch_bounds__(128) moe_topk(const float* __restrict__ logits, int T, int E, int A,
                                                int norm, int* __restrict__ ids, float* __restrict__ w) {
  extern __shared__ float sp[];
  const int warp = threadIdx.x >> 5, t = blockIdx.x * 4 + warp;
  if (t >= T) return;
  topk_warp(logits + (i64)t * E, E, A, norm, sp + warp * E, ids + t * A, w + t * A);
}

// act[p, j] = silu(gate_e[j] . h[p / A]) * (up_e[j] . h[p / A]) for e = ids[p]; grid (row blocks, P)
template <int QG, int QU>
__global__ void __launch_bounds__(256) moe_gate_up(
    const i64* __restrict__ Tg, const i64* __restrict__ Tu, i64 g_row, i64 u_row,
    const int* __restrict__ ids, int A, const float* __restrict__ h, int D, int F, float* __restrict__ act) {
  extern __shared__ float4 smem4[];
  float* xs = (float*)smem4;
  const int p = blockIdx.y, e = ids[p];
  for (int i = threadIdx.x; i < D; i += blockDim.x) xs[i] = h[(i64)(p / A) * D + i];
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int j = blockIdx.x * 8 + warp; j < F; j += gridDim.x * 8) {
    const u8* rg = (const u8*)Tg[e] + j * g_row;
    const u8* ru = (const u8*)Tu[e] + j * u_row;
    float g = 0.f, u = 0.f;
    for (int c = lane; c < (D >> 3); c += 32) {
      float a[8], b[8];
      Q<QG>::deq8(rg, c, a);
      Q<QU>::deq8(ru, c, b);
#pragma unroll
      for (int i = 0; i < 8; i++) { g = fmaf(a[i], xs[8 * c + i], g); u = fmaf(b[i], xs[8 * c + i], u); }
    }
    g = warp_sum(g); u = warp_sum(u);
    if (lane == 0) act[(i64)p * F + j] = silu(g) * u;
  }
}

// x[t, r] += sum_a w[t, a] * (down_e[r] . act[t*A + a]); grid (row blocks, T); smem A*F floats
template <int QD>
__global__ void __launch_bounds__(256) moe_down(
    const i64* __restrict__ Td, i64 d_row, const int* __restrict__ ids, const float* __restrict__ wts,
    int A, const float* __restrict__ act, int D, int F, float* __restrict__ x) {
  extern __shared__ float4 smem4[];
  float* xs = (float*)smem4;
  const int t = blockIdx.y;
  for (int i = threadIdx.x; i < A * F; i += blockDim.x) xs[i] = act[(i64)t * A * F + i];
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = blockIdx.x * 8 + warp; r < D; r += gridDim.x * 8) {
    // sum_a w_a (row_a . act_a) = warp_sum(sum_a w_a * lane's partial): one reduction, and the A
    // experts' loads are independent, so they overlap instead of waiting on a reduction each
    float total = 0.f;
#pragma unroll 4
    for (int a = 0; a < A; a++) {
      const u8* row = (const u8*)Td[ids[t * A + a]] + r * d_row;
      float s = 0.f;
      for (int c = lane; c < (F >> 3); c += 32) {
        float v[8];
        Q<QD>::deq8(row, c, v);
#pragma unroll
        for (int i = 0; i < 8; i++) s = fmaf(v[i], xs[a * F + 8 * c + i], s);
      }
      total = fmaf(wts[t * A + a], s, total);
    }
    total = warp_sum(total);
    if (lane == 0) x[(i64)t * D + r] += total;
  }
}

// The decode forms with split-K (see gemv_split): `split` warps share each (pair, row); h and act are
// read straight from global memory. moe_down_split splits a row's A experts over its warps instead.
template <int QG, int QU>
__global__ void __launch_bounds__(256) moe_gate_up_split(
    const i64* __restrict__ Tg, const i64* __restrict__ Tu, i64 g_row, i64 u_row,
    const int* __restrict__ ids, int A, const float* __restrict__ h, int D, int F, float* __restrict__ act,
    int split) {
  __shared__ float part[8][2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, p = blockIdx.y, e = ids[p];
  const float* xr = h + (i64)(p / A) * D;
  const int rpb = 8 / split, sub = warp % split;
  for (int base = blockIdx.x * rpb; base < F; base += gridDim.x * rpb) {
    const int j = base + warp / split;
    float g = 0.f, u = 0.f;
    if (j < F) {
      const u8* rg = (const u8*)Tg[e] + j * g_row;
      const u8* ru = (const u8*)Tu[e] + j * u_row;
#pragma unroll 2
      for (int c = sub * 32 + lane; c < (D >> 3); c += 32 * split) {
        float a[8], b[8];
        Q<QG>::deq8(rg, c, a);
        Q<QU>::deq8(ru, c, b);
        const float4 x0 = __ldg((const float4*)(xr + 8 * c)), x1 = __ldg((const float4*)(xr + 8 * c + 4));
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int i = 0; i < 8; i++) { g = fmaf(a[i], xv[i], g); u = fmaf(b[i], xv[i], u); }
      }
    }
    g = warp_sum(g); u = warp_sum(u);
    if (lane == 0) { part[warp][0] = g; part[warp][1] = u; }
    __syncthreads();
    if (sub == 0 && lane == 0 && j < F) {
      float gs = 0.f, us = 0.f;
      for (int k = 0; k < split; k++) { gs += part[warp + k][0]; us += part[warp + k][1]; }
      act[(i64)p * F + j] = silu(gs) * us;
    }
    __syncthreads();
  }
}

template <int QD>
__global__ void __launch_bounds__(256) moe_down_split(
    const i64* __restrict__ Td, i64 d_row, const int* __restrict__ ids, const float* __restrict__ wts,
    int A, const float* __restrict__ act, int D, int F, float* __restrict__ x, int split) {
  __shared__ float part[8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.y;
  const int rpb = 8 / split, sub = warp % split;
  for (int base = blockIdx.x * rpb; base < D; base += gridDim.x * rpb) {
    const int r = base + warp / split;
    float total = 0.f;
    if (r < D) {
      for (int a = sub; a < A; a += split) {
        const u8* row = (const u8*)Td[ids[t * A + a]] + r * d_row;
        const float* xr = act + ((i64)t * A + a) * F;
        float s = 0.f;
#pragma unroll 2
        for (int c = lane; c < (F >> 3); c += 32) {
          float v[8];
          Q<QD>::deq8(row, c, v);
          const float4 x0 = __ldg((const float4*)(xr + 8 * c)), x1 = __ldg((const float4*)(xr + 8 * c + 4));
          s = fmaf(v[0], x0.x, s); s = fmaf(v[1], x0.y, s); s = fmaf(v[2], x0.z, s); s = fmaf(v[3], x0.w, s);
          s = fmaf(v[4], x1.x, s); s = fmaf(v[5], x1.y, s); s = fmaf(v[6], x1.z, s); s = fmaf(v[7], x1.w, s);
        }
        total = fmaf(wts[t * A + a], s, total);
      }
    }
    total = warp_sum(total);
    if (lane == 0) part[warp] = total;
    __syncthreads();
    if (sub == 0 && lane == 0 && r < D) {
      float s = 0.f;
      for (int k = 0; k < split; k++) s += part[warp + k];
      x[(i64)t * D + r] += s;
    }
    __syncthreads();
  }
}

__global__ void moe_count(const int* __restrict__ ids, int P, int* __restrict__ counts) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < P) atomicAdd(counts + ids[p], 1);
}

// one block of E threads (E <= 1024): offsets[E+1], tiles[max][3], n_tiles; also zeroes the cursors
__global__ void moe_plan(const int* __restrict__ counts, int E, int* __restrict__ offsets,
                         int* __restrict__ cursor, int* __restrict__ tiles, int* __restrict__ n_tiles) {
  extern __shared__ int sh[];  // [2 * (E + 1)]: row offsets, tile offsets
  const int e = threadIdx.x;
  if (e == 0) {
    int r = 0, t = 0;
    for (int i = 0; i < E; i++) {
      sh[i] = r; sh[E + 1 + i] = t;
      r += counts[i]; t += (counts[i] + TILE - 1) / TILE;
    }
    sh[E] = r; sh[2 * E + 1] = t;
    *n_tiles = t;
  }
  __syncthreads();
  for (int i = e; i <= E; i += blockDim.x) offsets[i] = sh[i];
  for (int i = e; i < E; i += blockDim.x) {
    cursor[i] = 0;
    const int c = counts[i];
    for (int k = 0; k * TILE < c; k++) {
      int* tl = tiles + 3 * (sh[E + 1 + i] + k);
      tl[0] = i; tl[1] = sh[i] + k * TILE; tl[2] = min(TILE, c - k * TILE);
    }
  }
}

// pair p -> its row in expert order; rows[p] = that row, tok_of_row[row] = p / A
__global__ void moe_scatter(const int* __restrict__ ids, int P, int A, const int* __restrict__ offsets,
                            int* __restrict__ cursor, int* __restrict__ rows, int* __restrict__ tok_of_row) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= P) return;
  const int e = ids[p];
  const int r = offsets[e] + atomicAdd(cursor + e, 1);
  rows[p] = r;
  tok_of_row[r] = p / A;
}

// x[t, :] += sum_a w[t, a] * y[rows[t*A + a], :]; grid T
__global__ void __launch_bounds__(256) moe_combine(const float* __restrict__ y, const int* __restrict__ rows,
                                                   const float* __restrict__ wts, int A, int D,
                                                   float* __restrict__ x) {
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float s = 0.f;
    for (int a = 0; a < A; a++) s += wts[t * A + a] * y[(i64)rows[t * A + a] * D + i];
    x[(i64)t * D + i] += s;
  }
}
"""
)


def gate_up_name(qg: int, qu: int) -> str:
    return f"moe_gate_up<{qg},{qu}>"


def down_name(qd: int) -> str:
    return f"moe_down<{qd}>"


def gate_up_split_name(qg: int, qu: int) -> str:
    return f"moe_gate_up_split<{qg},{qu}>"


def down_split_name(qd: int) -> str:
    return f"moe_down_split<{qd}>"


def max_tiles(n_pairs: int, n_expert: int) -> int:
    """Upper bound on sum_e ceil(count_e / TILE): the grouped GEMM's grid height."""
    return min(n_pairs, n_pairs // TILE + n_expert)


def ref_topk(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    return route_softmax_topk(logits, k, normalize)


def ref_plan(ids: np.ndarray, n_expert: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grouping the kernels build: offsets [E+1], tiles [n, 3], rows [P] (stable within an
    expert here; the GPU may order an expert's rows differently, which changes nothing downstream)."""
    flat = ids.reshape(-1)
    counts = np.bincount(flat, minlength=n_expert)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    tiles = [
        (e, offsets[e] + s, min(TILE, counts[e] - s))
        for e in range(n_expert)
        for s in range(0, counts[e], TILE)
    ]
    rows = np.empty(flat.size, np.int64)
    rows[np.argsort(flat, kind="stable")] = np.arange(flat.size)
    return offsets, np.array(tiles, np.int64).reshape(-1, 3), rows


def ref_moe(
    h: np.ndarray, ids: np.ndarray, weights: np.ndarray, expert: Callable[[int, np.ndarray], np.ndarray]
) -> np.ndarray:
    """The expert FFN the kernels compute: strata.blocks.moe.dispatch (added to the residual by them)."""
    return dispatch(h, ids, weights, expert)

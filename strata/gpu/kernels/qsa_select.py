"""QSA's block selection on the GPU (a part of kernels/qsa.py's source, which defines QSA_COL and the record
layout before it): block scores and the exact top-k of them.

- `qsa_score` + `qsa_pick`: block scores sum_h relu(q_h . k_b) / sqrt(d) into a scratch row per query
  (grid (splits, rows): each block a strided share of the row's 64-key tiles, so one decode row at 65k
  blocks still fills the GPU; a prefill pass takes `qsa_score_tiled`, 8 rows by 128 keys a block, which
  reads each key tile once for 8 rows instead of once a row), then one block of 1024 threads per row finds
  the k-th largest score exactly (radix select on the float bits, 8 bits a pass: scores are >= 0, so the
  bits order them) and compacts, in ascending block order, everything above it plus the lowest-index ties
  at it: the CPU's stable argsort.

Numpy twins: `ref_qsa_scores`, `ref_qsa_pick`, `ref_qsa_select`.

Legend: T = rows, B = complete blocks, Hi = indexer heads, d = indexer head dim, K = top_blocks.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

SCORE_KT = 64  # compressed keys a scoring tile
# scoring blocks a launch aims for (2 per H200 SM); a row's share shrinks as more rows share the launch
SCORE_BLOCKS = 264
# qsa_score_tiled's tile: rows (a warp each) by compressed keys (4 a lane); fewer rows take qsa_score
SCORE_TILE_ROWS, SCORE_TILE_KEYS = 8, 128
PICK_THREADS = 1024


def score_smem(hi: int, d: int) -> int:
    """qsa_score's dynamic shared memory: the row's queries [hi, d] and one key tile [SCORE_KT, d + 1]."""
    return 4 * (hi * d + SCORE_KT * (d + 1))


SOURCE = (
    f"#define QSA_KT {SCORE_KT}\n"
    + r"""
// ---- block scores: rows row0 + blockIdx.y, into scores[blockIdx.y, b] (ld floats a row) ----
// grid (splits, rows), block 256; dynamic smem score_smem(hi, D). A tile's KT = 64 keys sit in shared memory
// (rows padded to D + 1 floats: the lanes of a warp read 32 keys' same dim from 32 banks); thread t scores
// key t % 64 against heads t / 64, + 4, .. (one head per warp at a time: the query reads broadcast).
template <int D>
__global__ void __launch_bounds__(256) qsa_score(
    const float* __restrict__ q, int hi, const i64* __restrict__ tab, int tab_stride, int row0, int j,
    int stride, int ratio, float sqrt_d, float* __restrict__ scores, int ld) {
  constexpr int KT = QSA_KT, LD = D + 1, GROUPS = 256 / KT;
  extern __shared__ float ssm[];
  float* qs = ssm;            // [hi][D]
  float* ks = ssm + hi * D;   // [KT][LD]
  __shared__ float red[GROUPS][KT];
  const int row = row0 + blockIdx.y;
  const i64* tr = tab + (i64)row * tab_stride;
  const int C = (int)((tr[3] + 1) / ratio), tiles = (C + KT - 1) / KT;
  if ((int)blockIdx.x >= tiles) return;
  const float* blocks = (const float*)tr[QSA_COL] + (i64)j * stride;
  for (int i = threadIdx.x; i < hi * D; i += blockDim.x) qs[i] = q[(i64)row * hi * D + i];
  const int kk = threadIdx.x % KT, g = threadIdx.x / KT;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int b0 = tile * KT, nk = min(KT, C - b0);
    __syncthreads();  // the last tile's keys and sums are read; the queries are in
    for (int i = threadIdx.x; i < nk * D; i += blockDim.x) ks[(i / D) * LD + i % D] = blocks[(i64)b0 * D + i];
    __syncthreads();
    float part = 0.f;
    if (kk < nk) {
      for (int h = g; h < hi; h += GROUPS) {
        float dot = 0.f;
#pragma unroll 16
        for (int d = 0; d < D; d++) dot = fmaf(qs[h * D + d], ks[kk * LD + d], dot);
        part += fmaxf(dot, 0.f);
      }
    }
    red[g][kk] = part;
    __syncthreads();
    if (threadIdx.x < nk) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < GROUPS; i++) s += red[i][threadIdx.x];
      scores[(i64)blockIdx.y * ld + b0 + threadIdx.x] = s / sqrt_d;
    }
  }
}

// ---- block scores of a prefill pass: the same sums as qsa_score, register-tiled (qsa_score re-reads every
// key tile for each row, so a 4,096-row chunk at 262k positions ran at ~5 of the GPU's ~60 fp32 TFLOP/s) ----
// grid (key tiles of 128, row tiles of 8), block 256: warp w takes row row0 + blockIdx.y * 8 + w (below
// row0 + n), lane l its keys 4l .. 4l + 3 of the tile, against 16 heads at a time: 64 sums in
// registers, a float4 of keys and four of queries from shared memory per dim. The keys are the record's of
// the tile's rows: a tile whose rows belong to several sequences takes them one record at a time (a pass's
// sequences are contiguous, so that is a boundary tile's lot). Row r's scores go to scores[r - row0] (ld
// floats a row), blocks below its complete count only.
template <int D>
__global__ void __launch_bounds__(256) qsa_score_tiled(
    const float* __restrict__ q, int hi, const i64* __restrict__ tab, int tab_stride, int row0, int n, int j,
    int stride, int ratio, float sqrt_d, float* __restrict__ scores, int ld) {
  constexpr int TR = 8, TK = 128, HG = 16, DK = D < 32 ? D : 32, KP = TK + 4, HP = HG + 4;
  static_assert(D % DK == 0 && DK % 4 == 0, "the indexer dim: a multiple of 32, or 4 .. 32");
  __shared__ __align__(16) float ks[DK][KP];      // the tile's keys, dim-major
  __shared__ __align__(16) float qs[TR][DK][HP];  // the rows' queries of 16 heads, dim-major
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int first = row0 + blockIdx.y * TR, end = min(first + TR, row0 + n), b0 = blockIdx.x * TK;
  const int me = first + w;
  const bool live = me < end;
  const i64 rec_me = live ? tab[(i64)me * tab_stride + QSA_COL] : 0;
  const int c_me = live ? (int)((tab[(i64)me * tab_stride + 3] + 1) / ratio) : 0;
  for (int lead = first; lead < end; lead++) {
    const i64 rec = tab[(i64)lead * tab_stride + QSA_COL];
    bool seen = false;
    int cmax = 0;
    for (int r = first; r < end; r++) {
      const i64* t2 = tab + (i64)r * tab_stride;
      if (t2[QSA_COL] != rec) continue;
      seen |= r < lead;
      cmax = max(cmax, (int)((t2[3] + 1) / ratio));
    }
    if (seen || b0 >= cmax) continue;  // the same for the whole block
    const bool mine = rec_me == rec && b0 < c_me;  // the same for the whole warp
    const float* blocks = (const float*)rec + (i64)j * stride;
    const int nk = min(TK, cmax - b0);
    float part[4] = {0.f, 0.f, 0.f, 0.f};
    for (int h0 = 0; h0 < hi; h0 += HG) {
      float acc[HG][4];
#pragma unroll
      for (int h = 0; h < HG; h++) acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = 0.f;
      for (int d0 = 0; d0 < D; d0 += DK) {
        __syncthreads();  // the last chunk is read
        for (int i = threadIdx.x; i < TK * (DK / 4); i += blockDim.x) {
          const int kk = i / (DK / 4), x = 4 * (i % (DK / 4));
          const float4 v = kk < nk ? *(const float4*)(blocks + (i64)(b0 + kk) * D + d0 + x)
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
          ks[x][kk] = v.x; ks[x + 1][kk] = v.y; ks[x + 2][kk] = v.z; ks[x + 3][kk] = v.w;
        }
        for (int i = threadIdx.x; i < TR * HG * DK; i += blockDim.x) {
          const int e = i / (HG * DK), h = (i / DK) % HG, k = i % DK, r = first + e;
          const bool ok = r < end && h0 + h < hi && tab[(i64)r * tab_stride + QSA_COL] == rec;
          qs[e][k][h] = ok ? q[((i64)r * hi + h0 + h) * D + d0 + k] : 0.f;
        }
        __syncthreads();
        if (mine) {
#pragma unroll 4
          for (int k = 0; k < DK; k++) {
            const float4 kv = *(const float4*)&ks[k][4 * lane];
#pragma unroll
            for (int h4 = 0; h4 < HG / 4; h4++) {
              const float4 qv = *(const float4*)&qs[w][k][4 * h4];
              const float qh[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
              for (int u = 0; u < 4; u++) {
                float* a = acc[4 * h4 + u];
                a[0] = fmaf(qh[u], kv.x, a[0]); a[1] = fmaf(qh[u], kv.y, a[1]);
                a[2] = fmaf(qh[u], kv.z, a[2]); a[3] = fmaf(qh[u], kv.w, a[3]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int h = 0; h < HG; h++)
#pragma unroll
        for (int c = 0; c < 4; c++) part[c] += fmaxf(acc[h][c], 0.f);
    }
    if (mine) {
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int b = b0 + 4 * lane + c;
        if (b < c_me) scores[(i64)(me - row0) * ld + b] = part[c] / sqrt_d;
      }
    }
  }
}

// ---- top-k: sel [rows, top] the kept blocks ascending (-1 past nsel), nsel [rows] ----
// A score's bits with the sign cleared (-0 is 0): for scores >= 0 their order is the scores' order.
__device__ __forceinline__ u32 score_bits(float s) { return __float_as_uint(s) & 0x7FFFFFFFu; }

// Warp 0: the bin d of hist[256] holding the kleft-th largest candidate, counting from bin 255 down, into
// out[0], and kleft less the candidates above bin d into out[1]. Lane l holds bins 255 - 8l .. 248 - 8l.
__device__ __forceinline__ void radix_bin(const u32* hist, u32 kleft, u32* out) {
  const int lane = threadIdx.x & 31;
  u32 c[8], sum = 0u;
#pragma unroll
  for (int i = 0; i < 8; i++) { c[i] = hist[255 - 8 * lane - i]; sum += c[i]; }
  u32 incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u32 t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  u32 run = incl - sum;
  if (run < kleft && kleft <= incl) {  // one lane: kleft never exceeds the candidates
#pragma unroll
    for (int i = 0; i < 8; i++) {
      if (run + c[i] >= kleft) { out[0] = 255 - 8 * lane - i; out[1] = kleft - run; break; }
      run += c[i];
    }
  }
}

// This thread's rank among the block's threads with flag set (in thread order), and their count in *total.
// Every thread calls it; tot: 32 ints of shared memory.
__device__ __forceinline__ int block_rank(bool flag, int* tot, int* total) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const u32 b = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) tot[warp] = __popc(b);
  __syncthreads();
  if (warp == 0) {
    int v = lane < nw ? tot[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += t;
    }
    if (lane < nw) tot[lane] = v;  // inclusive
  }
  __syncthreads();
  const int rank = (warp > 0 ? tot[warp - 1] : 0) + __popc(b & ((1u << lane) - 1u));
  *total = tot[nw - 1];
  __syncthreads();  // tot is rewritten by the next call
  return rank;
}

// grid (rows), block 1024: row row0 + blockIdx.x, its scores in scores[blockIdx.x] (ld floats a row)
__global__ void __launch_bounds__(1024) qsa_pick(const float* __restrict__ scores, int ld,
                                                 const i64* __restrict__ tab, int tab_stride, int row0,
                                                 int ratio, int top, int* __restrict__ sel,
                                                 int* __restrict__ nsel) {
  __shared__ u32 hist[256];
  __shared__ u32 found[2];
  __shared__ int tot[32];
  const int row = row0 + blockIdx.x;
  const int C = (int)((tab[(i64)row * tab_stride + 3] + 1) / ratio), K = min(C, top);
  const float* s = scores + (i64)blockIdx.x * ld;
  int* out = sel + (i64)row * top;
  if (threadIdx.x == 0) nsel[row] = K;
  for (int i = K + threadIdx.x; i < top; i += blockDim.x) out[i] = -1;
  if (K == C || K == 0) {  // every complete block is kept, or none
    for (int i = threadIdx.x; i < K; i += blockDim.x) out[i] = i;
    return;
  }
  // the K-th largest score's bits, 8 at a time from the top; kleft: its rank among the candidates so far
  u32 prefix = 0u, kleft = (u32)K;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0u;
    __syncthreads();
    const u32 high = shift == 24 ? 0u : 0xFFFFFFFFu << (shift + 8);
    // warp-uniform trips, so a warp's lanes of one bin add once: the first pass puts nearly every score in
    // one or two bins (they share their top exponent bits), which per-lane atomics would serialize on
    for (int b0 = 0; b0 < C; b0 += blockDim.x) {
      const int i = b0 + threadIdx.x;
      const u32 u = i < C ? score_bits(s[i]) : 0u;
      const u32 bin = i < C && (u & high) == prefix ? (u >> shift) & 255u : 256u;  // 256: not a candidate
      const u32 same = __match_any_sync(0xffffffffu, bin);
      if (bin < 256u && (threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[bin], (u32)__popc(same));
    }
    __syncthreads();
    if (threadIdx.x < 32) radix_bin(hist, kleft, found);
    __syncthreads();
    prefix |= found[0] << shift;
    kleft = found[1];
  }
  // everything above the threshold, and its first kleft ties by block index, in ascending order
  int taken = 0, ties = 0;
  for (int b0 = 0; b0 < C; b0 += blockDim.x) {
    const int i = b0 + threadIdx.x;
    const u32 u = i < C ? score_bits(s[i]) : 0u;
    const bool eq = i < C && u == prefix;
    int n_eq, n_take;
    const int tie = ties + block_rank(eq, tot, &n_eq);
    const bool take = i < C && (u > prefix || (eq && tie < (int)kleft));
    const int at = taken + block_rank(take, tot, &n_take);
    if (take) out[at] = i;
    ties += n_eq;
    taken += n_take;
  }
}
"""
)


def score_name(d: int) -> str:
    return f"qsa_score<{d}>"


def tiled_score_name(d: int) -> str:
    return f"qsa_score_tiled<{d}>"


def tiles_dim(d: int) -> bool:
    """qsa_score_tiled takes the dim in chunks of 32 (or whole, up to 32) as float4s."""
    return d % 32 == 0 or (d < 32 and d % 4 == 0)


def kernel_names(head_dims: Iterable[int]) -> list[str]:
    dims = list(head_dims)
    return ["qsa_pick"] + [score_name(d) for d in dims] + [tiled_score_name(d) for d in dims if tiles_dim(d)]


# ---- numpy twins ----
def ref_qsa_scores(q: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """Block scores [T, B] of queries [T, Hi, d] against compressed keys [B, d], qsa_select's lines."""
    scores = np.matmul(q, blocks.T)  # [T, Hi, B]
    return np.maximum(scores, np.float32(0)).sum(axis=1) / np.float32(np.sqrt(q.shape[-1]))


def ref_qsa_pick(scores: np.ndarray, complete: np.ndarray, top_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """sel [T, top_blocks] int32 (the kept blocks ascending, -1 past nsel) and nsel [T]: each row's
    min(complete, top_blocks) best visible blocks, ties to the earlier block (qsa_select's stable argsort)."""
    t, n_blocks = scores.shape
    visible = np.arange(n_blocks)[None, :] < complete[:, None]  # [T, B]
    ranked = np.argsort(np.where(visible, -scores, np.inf), axis=1, kind="stable")  # best first
    nsel = np.minimum(complete, top_blocks).astype(np.int32)
    sel = np.full((t, top_blocks), -1, np.int32)
    for r in range(t):
        sel[r, : nsel[r]] = np.sort(ranked[r, : nsel[r]])
    return sel, nsel


def ref_qsa_select(
    q: np.ndarray, blocks: np.ndarray, positions: np.ndarray, ratio: int, top_blocks: int
) -> tuple[np.ndarray, np.ndarray]:
    """sel, nsel (ref_qsa_pick) for normed, rotated queries [T, Hi, d] at `positions` against one sequence's
    compressed keys [B, d] (B: at least the blocks complete by the last row)."""
    return ref_qsa_pick(ref_qsa_scores(q, blocks), (positions + 1) // ratio, top_blocks)

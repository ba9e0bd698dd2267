"""Matrix products on quantized weights for prefill: many tokens, tensor cores, no dequantized copy.

C[rows, N] (+)= A[rows, K] @ W[N, K]^T where W stays in its GGUF blocks. Each 256-thread block
computes a 64 x 128 tile: per K step (64 or 128 wide) it converts A to fp16 and decodes 128 weight rows
(`Q<QT>::deq8`) into shared memory, then 8 warps run `mma.sync.m16n8k16` (fp16 in, fp32
accumulate); two shared-memory stages let the next step's loads and decoding overlap the MMAs. The
decode happens once per 64 tokens, so the weight bytes and the decoding work are amortised over the
tile; nothing the size of a dequantized matrix ever exists.

Grouped (MoE) mode: `tiles` lists (expert, first row, row count) for each 64-row tile of the rows
sorted by expert, `experts` gives each expert's weight address (a VRAM slot or pinned RAM, see
strata.tiers.slots), `a_index` maps each sorted row to its token; a block past `*n_tiles` exits, so
the grid can be sized from an upper bound without reading the counts back. AMODE 1 stages
silu(A[:, :K]) * A[:, K:] (the gate|up product feeding a down projection).

Numpy twin: `ref_gemm` (both operands rounded to fp16, products in float64).
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels.common import HEADER
from strata.quants import dequantize

BM, BN = 64, 128
BKS = (64, 128)  # K step: 128 halves the barrier-separated rounds per tile (the v2 default); 64 is v1


def smem_bytes(bk: int) -> int:
    return 2 * (BM + BN) * (bk + 8) * 2  # two stages


SOURCE = (
    HEADER
    + r"""
#define BM 64
#define BN 128

// Q4_K scale / min pair j from the 12 scale bytes held in a block header's words y, z, w (scale_min_k4)
__device__ __forceinline__ u32 hdr_byte(const uint4& hd, int k) {
  const u32 w = k < 4 ? hd.y : (k < 8 ? hd.z : hd.w);
  return (w >> (8 * (k & 3))) & 0xFFu;
}
__device__ __forceinline__ void scale_min_hdr(const uint4& hd, int j, float* sc, float* mn) {
  if (j < 4) { *sc = (float)(hdr_byte(hd, j) & 63); *mn = (float)(hdr_byte(hd, j + 4) & 63); }
  else {
    *sc = (float)((hdr_byte(hd, j + 4) & 0xF) | ((hdr_byte(hd, j - 4) >> 6) << 4));
    *mn = (float)((hdr_byte(hd, j + 4) >> 4) | ((hdr_byte(hd, j) >> 6) << 4));
  }
}
// 4 codes (bytes of c) as fp16 pairs of dl * q - ml, rounded as deq8 rounds them
__device__ __forceinline__ uint2 q4k_pairs(u32 c, float dl, float ml) {
  return make_uint2(pack2(__fsub_rn(mul(byte_f(c, 0), dl), ml), __fsub_rn(mul(byte_f(c, 1), dl), ml)),
                    pack2(__fsub_rn(mul(byte_f(c, 2), dl), ml), __fsub_rn(mul(byte_f(c, 3), dl), ml)));
}

// Rows past r1 / r2 of the output columns come from W1 / W2 (q|k|v as one product), as in gemv.
// Dynamic shared memory: two stages of (BM + BN) * (BK + 8) halves; rows padded by 16 bytes so that
// fragment loads hit 32 distinct banks.
template <int QT, int AMODE, int BK>
__global__ void __launch_bounds__(256, 2) qgemm(
    const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2, int r1, int r2,
    const i64* __restrict__ experts, i64 row_bytes, int N, int K,
    const float* __restrict__ A, int lda, const int* __restrict__ a_index,
    float* __restrict__ C, int ldc, int accumulate,
    const int* __restrict__ tiles, const int* __restrict__ n_tiles, int M) {
  constexpr int LDS = BK + 8, CPR = BK / 8, AF4 = BK / 16, WCH = BN * CPR / 256;
  extern __shared__ uint4 smem_u4[];
  u16* As = (u16*)smem_u4;
  u16* Ws = As + BM * LDS;
  int expert = 0, row0 = blockIdx.y * BM, nrows = min(BM, M - row0);
  if (tiles != nullptr) {
    if ((int)blockIdx.y >= *n_tiles) return;
    expert = tiles[3 * blockIdx.y]; row0 = tiles[3 * blockIdx.y + 1]; nrows = tiles[3 * blockIdx.y + 2];
  }
  const int n0 = blockIdx.x * BN;
  const u8* Wb = experts != nullptr ? (const u8*)experts[expert] : W0;  // grouped: the expert's address
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows wm*32..+32, cols wn*32..+32
  // A staging: thread -> (row tid/4, BK/4 columns); its token row is fixed for the whole K loop
  const int ar = tid >> 2, ac = (tid & 3) * (BK / 4);
  const float* arow = nullptr;
  if (ar < nrows) arow = A + (i64)(a_index != nullptr ? a_index[row0 + ar] : row0 + ar) * lda;
  // W staging: chunk id = tid + 256 j -> (row id / CPR, chunk id % CPR); row pointers fixed too
  const u8* wrow[WCH];
#pragma unroll
  for (int j = 0; j < WCH; j++) {
    const int n = n0 + (tid + 256 * j) / CPR;
    wrow[j] = n >= N ? nullptr : n < r1 ? Wb + (i64)n * row_bytes
            : n < r2 ? W1 + (i64)(n - r1) * row_bytes : W2 + (i64)(n - r2) * row_bytes;
  }
  // Q4_K with 64-wide K steps (one 64-value group of a super-block per step): thread -> (row tid / 2, half
  // tid % 2) takes its 16 bytes of codes and the 16-byte block header in two loads, where deq8 would issue
  // ~7 small loads per 8 values, each repeated by the tile's other threads: those loads bound the GEMM
  // through L1 (perf/README.md, Nsight Compute).
  constexpr bool WIDE = QT == 12 && BK == 64;
  const u8* qrow = nullptr;
  if (WIDE) {
    const int n = n0 + (tid >> 1);
    qrow = n >= N ? nullptr : n < r1 ? Wb + (i64)n * row_bytes
         : n < r2 ? W1 + (i64)(n - r1) * row_bytes : W2 + (i64)(n - r2) * row_bytes;
  }
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int k = 0; k < 4; k++) acc[i][j][k] = 0.0f;

  // Two stages of shared memory: while the warps multiply stage k, the next K step's A loads are already
  // out and its weights are decoded into the other stage right after the MMAs are issued, so memory
  // latency and decoding overlap the tensor cores; one barrier per K step.
  float4 av[AF4];
  auto load_a = [&](int k0) {
    const int kc = k0 + ac;
#pragma unroll
    for (int q = 0; q < AF4; q++) {
      av[q] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (arow != nullptr && kc + 4 * q < K) {
        av[q] = *(const float4*)(arow + kc + 4 * q);
        if (AMODE == 1) {  // gate|up -> silu(gate) * up now: holding both would spill
          const float4 u = *(const float4*)(arow + K + kc + 4 * q), v = av[q];
          av[q] = make_float4(silu(v.x) * u.x, silu(v.y) * u.y, silu(v.z) * u.z, silu(v.w) * u.w);
        }
      }
    }
  };
  auto stage = [&](int k0, u16* as, u16* ws) {  // decode W's K step k0 into ws, store the loaded A into as
    if constexpr (WIDE) {
      const int hh = tid & 1;
      uint2 lo[4], hi[4];
#pragma unroll
      for (int i = 0; i < 4; i++) lo[i] = hi[i] = make_uint2(0u, 0u);
      if (qrow != nullptr) {
        const u8* b = qrow + (k0 >> 8) * 144;
        const int g = (k0 >> 6) & 3;
        const uint4 hd = *(const uint4*)b;  // d | dmin | scales[12]
        const uint4 q = *(const uint4*)(b + 16 + 32 * g + 16 * hh);
        float sc0, m0, sc1, m1;
        scale_min_hdr(hd, 2 * g, &sc0, &m0);
        scale_min_hdr(hd, 2 * g + 1, &sc1, &m1);
        const float d = h2f(hd.x & 0xFFFF), dmin = h2f(hd.x >> 16);
        const float dl0 = mul(d, sc0), ml0 = mul(dmin, m0), dl1 = mul(d, sc1), ml1 = mul(dmin, m1);
        const u32 w[4] = {q.x, q.y, q.z, q.w};
        // low nibbles: sub-block 2g, step positions 16hh + 4i..; high: 32 + that
#pragma unroll
        for (int i = 0; i < 4; i++) {
          lo[i] = q4k_pairs(w[i] & 0x0F0F0F0Fu, dl0, ml0);
          hi[i] = q4k_pairs((w[i] >> 4) & 0x0F0F0F0Fu, dl1, ml1);
        }
      }
      u16* wr = ws + (tid >> 1) * LDS + 16 * hh;
      *(uint4*)wr = make_uint4(lo[0].x, lo[0].y, lo[1].x, lo[1].y);
      *(uint4*)(wr + 8) = make_uint4(lo[2].x, lo[2].y, lo[3].x, lo[3].y);
      *(uint4*)(wr + 32) = make_uint4(hi[0].x, hi[0].y, hi[1].x, hi[1].y);
      *(uint4*)(wr + 40) = make_uint4(hi[2].x, hi[2].y, hi[3].x, hi[3].y);
    } else {
#pragma unroll
    for (int j = 0; j < WCH; j++) {
      const int id = tid + 256 * j, r = id / CPR, cc = id % CPR;
      const int c = (k0 >> 3) + cc;
      u32 h[4] = {0u, 0u, 0u, 0u};
      if (wrow[j] != nullptr && c < (K >> 3)) {
        float v[8];
        Q<QT>::deq8(wrow[j], c, v);
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = pack2(v[2 * i], v[2 * i + 1]);
      }
      *(uint4*)(ws + r * LDS + cc * 8) = make_uint4(h[0], h[1], h[2], h[3]);
    }
    }
#pragma unroll
    for (int q = 0; q < AF4; q += 2) {
      const float4 v0 = av[q], v1 = av[q + 1];
      *(uint4*)(as + ar * LDS + ac + 4 * q) =
          make_uint4(pack2(v0.x, v0.y), pack2(v0.z, v0.w), pack2(v1.x, v1.y), pack2(v1.z, v1.w));
    }
  };
  constexpr int STAGE = (BM + BN) * LDS;  // halves per stage: A tile, then W tile
  load_a(0);
  stage(0, As, Ws);
  __syncthreads();
  int cur = 0;
  for (int k0 = 0; k0 < K; k0 += BK) {
    const bool more = k0 + BK < K;
    if (more) load_a(k0 + BK);
    const u16* as = As + cur * STAGE;
    const u16* ws = Ws + cur * STAGE;
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
      u32 af[2][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; mi++) {
        const u16* p = as + (wm * 32 + mi * 16 + g) * LDS + ks + 2 * t4;
        af[mi][0] = *(const u32*)p;
        af[mi][1] = *(const u32*)(p + 8 * LDS);
        af[mi][2] = *(const u32*)(p + 8);
        af[mi][3] = *(const u32*)(p + 8 * LDS + 8);
      }
#pragma unroll
      for (int ni = 0; ni < 4; ni++) {
        const u16* p = ws + (wn * 32 + ni * 8 + g) * LDS + ks + 2 * t4;
        bf[ni][0] = *(const u32*)p;
        bf[ni][1] = *(const u32*)(p + 8);
      }
#pragma unroll
      for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++) mma16816(acc[mi][ni], af[mi], bf[ni]);
    }
    if (more) stage(k0 + BK, As + (cur ^ 1) * STAGE, Ws + (cur ^ 1) * STAGE);
    __syncthreads();  // the next stage is written; this one may be overwritten from the next step on
    cur ^= 1;
  }
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int r = wm * 32 + mi * 16 + g + 8 * h;
        const int col = n0 + wn * 32 + ni * 8 + 2 * t4;
        if (r >= nrows) continue;
        float* o = C + (i64)(row0 + r) * ldc + col;
#pragma unroll
        for (int e = 0; e < 2; e++)
          if (col + e < N) o[e] = accumulate ? o[e] + acc[mi][ni][2 * h + e] : acc[mi][ni][2 * h + e];
      }
}

"""
)


def gemm_name(qt: int, amode: int, bk: int = 128) -> str:
    return f"qgemm<{qt},{amode},{bk}>"


def ref_gemm(w_raw: np.ndarray, qtype: int, a: np.ndarray, amode: int = 0) -> np.ndarray:
    """a [M, K] (or [M, 2K] for amode=1) -> [M, N]: what `qgemm` computes, operands rounded to fp16."""
    w = dequantize(w_raw, qtype).astype(np.float16).astype(np.float64)
    if amode == 1:  # silu(g) * u in float32, as the kernel stages it
        k = a.shape[1] // 2
        g = np.asarray(a[:, :k], np.float32)
        with np.errstate(over="ignore"):
            a = g / (np.float32(1) + np.exp(-g)) * a[:, k:]
    a16 = np.asarray(a, np.float32).astype(np.float16).astype(np.float64)
    return (a16 @ w.T).astype(np.float32)

"""Decode attention against the KV cache, fp16 or int8 (`--kv-type`), on the tensor cores.

The cells, their layout and split-K's partials are kernels/cells.py's.

- `attn_decode`: one query per row (decode). Block (group of query heads that share a kv head, row, split),
  8 warps (`decode_warps`; 4 for 16-dim heads); the group's query heads (at most 8, padded to 16) are the
  rows of mma tiles, the split's keys stream through shared memory in tiles of 64 (cp.async, up to four
  stages; int8 codes go into the mma's fragments as exact fp16 integers, their scales applied to the partial
  scores and the probabilities), each warp takes 8 keys of every tile (16 with 4 warps) with a softmax of its
  own, and the warps merge at the end.
  `attn_decode_qkv` is the same with rows.py's q/k/v epilogue (`head_post`) in front, so a decode layer needs
  no qkv_post launch.
- prefill's `flash_attn` is kernels/flash.py's.

Numpy twin: `ref_decode` (flash_attn's twin on the last row for fp16 cells; the codes' arithmetic for int8).
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels import cells
from strata.gpu.kernels.common import HEADER
from strata.gpu.kernels.flash import ref_flash
from strata.gpu.kernels.rows import HEAD_POST
from strata.runtime.kvcache import quantize_rows

# decode blocks a (group of query heads, row) with a partials buffer. A block of the tensor-core kernel holds
# its SM alone (150 KB of shared memory for int8 tiles), so the 80B's 2 groups x 64 splits fill the H100's
# 132 SMs in one wave from a batch of one, where 128 splits take two and 32 leave half the SMs idle
# (perf/bench_attn.py --splits 32,64,128, H100, 8-warp kernel, int8 cells, us a layer: 262k keys 470 / 255 /
# 308, 131k 245 / 142 / 190, 32k 76 / 57 / 77, 4k 25.5 / 27.5 / 31.9); a split takes whole 128-key steps
# (cells.split_range), so below 8,192 keys fewer splits have work (the rest exit)
SPLITS = 64

# int8 cells: a value's scale goes into its probability before the probability is rounded to fp16, times this
# power of two so that the products of small probabilities and small scales stay out of fp16's subnormals (the
# outputs are divided back; a probability of 1 times a scale of 64, values of 8,128, is fp16's largest)
VFOLD = 1024


SOURCE = (
    HEADER
    + HEAD_POST
    + cells.SOURCE
    + f"#define VFOLD {VFOLD}.f\n"
    + r"""
// ---- decode, a block per group of query heads that share a kv head ----
// On the tensor cores: the block's GM query heads (at most 8 of a kv group, padded to 16 rows) are the rows
// of flash_attn's mma tiles, so a key's cells are multiplied for every head of the group by mma.sync (the
// lane-FMA kernel before took the same time a key for f16 cells as for int8's half bytes: bound by its
// FMAs). The block's keys [lo, hi) stream through shared memory in tiles of DT keys by cp.async, NST stages
// (the next NST - 1 tiles land while one is multiplied). Of NW warps, warp w takes keys KW w .. KW w + KW - 1
// of every tile (KW = 64 / NW) with a softmax of its own (base 2, queries pre-scaled by scale * log2 e, as
// flash_attn); the warps' states merge at the end. Heads j >= gb have zero queries and are not written.
// fp16 cells go to the mma by ldmatrix from rows padded against bank conflicts. int8 cells of whole 32-dim
// groups (DIRECT) go from their codes straight into the mma's fragments, exactly, as fp16 integers
// (codes_h2), with no decoded copy of the tile: a key's scale multiplies each 32-dim group's partial score
// (fp32, the CPU cache's arithmetic: codes summed per group, times the scale), and a value's scale its
// probability before the probability is rounded to fp16, times VFOLD so that small values stay clear of
// fp16's subnormals (values up to ~8,000 fit). Other int8 heads (16 dims) decode the tile to fp16 first
// (dequant8). Numpy twin: ref_decode.
#define DT 64
template <int HD, int Q8>
struct DecodeTile {
  static constexpr bool DIRECT = Q8 && HD % 32 == 0;
  static constexpr int LK = HD + 8;  // fp16 row pitch (u16s) of the queries and of the tiles ldmatrix reads
  // bytes a stored key and value row: int8 codes padded so that a warp's fragment loads hit every bank once
  // (K: 8 bytes a lane from 8 keys, V: 4 bytes a lane from 2), int8 codes as they are, or padded fp16
  static constexpr int KROW = DIRECT ? HD + 32 : (Q8 ? HD : 2 * LK);
  static constexpr int VROW = DIRECT ? HD + 16 : KROW;
  static constexpr int NGS = Q8 ? Q8_GROUPS(HD) : 0;  // scales a key
  static constexpr int VOFF = DT * KROW, SOFF = VOFF + DT * VROW;  // V rows, then K and V scales
  static constexpr int STAGE = SOFF + 2 * DT * NGS * 4;
  // stages in flight: a 256-dim head's block holds its SM alone (the registers of its warps' 16 x 256
  // outputs), so its shared memory goes to stages, four or as many as fit (fp16: 3); narrower heads keep two,
  // so that blocks can share an SM
  static constexpr int NST =
      (HD < 256 || (Q8 && !DIRECT)) ? 2 : ((2 * LK * 16 + 4 * STAGE) <= 200 * 1024 ? 4 : 3);
};

// two int8 codes of the sign-flipped word u (w ^ 0x80808080), picked by sel, as fp16x2, exactly: the permute
// puts each byte under fp16's exponent of 2^10 (0x64XX = 1024 + XX), the subtraction takes 1024 + 128 away
__device__ __forceinline__ u32 codes_h2(u32 u, u32 sel) {
  u32 r, h;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(u), "r"(0x64646464u), "r"(sel));
  asm("sub.f16x2 %0, %1, %2;" : "=r"(h) : "r"(r), "r"(0x64806480u));
  return h;
}

// Tile t0.. of the keys into stage st: cp.async from the device cache; plain loads for the key at `last`
// (from klast, vlast: the fused kernel's own copy) and for cells before the window's base (host memory);
// zeros past hi.
template <int HD, int Q8>
__device__ __forceinline__ void tile_load(char* st, const Cells<HD, Q8>& c, int t0, int hi, int last,
                                          const void* klast, const void* vlast, const float* klast_s,
                                          const float* vlast_s) {
  using TD = DecodeTile<HD, Q8>;
  constexpr int CH = HD * (Q8 ? 1 : 2) / 16;  // 16-byte pieces a cell row
  for (int i = threadIdx.x; i < 2 * DT * CH; i += blockDim.x) {
    const int isv = i / (DT * CH), key = (i / CH) % DT, off = (i % CH) * 16, kp = t0 + key;
    char* dst = st + (isv ? TD::VOFF + key * TD::VROW : key * TD::KROW) + off;
    if (kp >= hi) {
      *(uint4*)dst = make_uint4(0, 0, 0, 0);
    } else if (kp == last) {
      *(uint4*)dst = *(const uint4*)((const char*)(isv ? vlast : klast) + off);
    } else if (kp < c.base) {
      *(uint4*)dst = *(const uint4*)((isv ? c.vat(kp) : c.kat(kp)) + off);
    } else {
      cp_async16(dst, (isv ? c.vat(kp) : c.kat(kp)) + off);
    }
  }
  if constexpr (Q8 && TD::NGS % 4 == 0) {  // a key's scales in 16-byte pieces
    constexpr int SP = TD::NGS / 4;
    float* sc = (float*)(st + TD::SOFF);
    for (int i = threadIdx.x; i < 2 * DT * SP; i += blockDim.x) {
      const int isv = i / (DT * SP), key = (i / SP) % DT, g = (i % SP) * 4, kp = t0 + key;
      float* dst = sc + (isv * DT + key) * TD::NGS + g;
      if (kp >= hi) *(float4*)dst = make_float4(0.f, 0.f, 0.f, 0.f);
      else if (kp == last) *(float4*)dst = *(const float4*)((isv ? vlast_s : klast_s) + g);
      else if (kp < c.base) *(float4*)dst = *(const float4*)((isv ? c.vsat(kp) : c.ksat(kp)) + g);
      else cp_async16(dst, (isv ? c.vsat(kp) : c.ksat(kp)) + g);
    }
  } else if constexpr (Q8) {
    float* sc = (float*)(st + TD::SOFF);
    for (int i = threadIdx.x; i < 2 * DT * TD::NGS; i += blockDim.x) {
      const int isv = i / (DT * TD::NGS), key = (i / TD::NGS) % DT, g = i % TD::NGS, kp = t0 + key;
      float* dst = sc + i;
      if (kp >= hi) *dst = 0.f;
      else if (kp == last) *dst = (isv ? vlast_s : klast_s)[g];
      else if (kp < c.base) *dst = (isv ? c.vsat(kp) : c.ksat(kp))[g];
      else cp_async4(dst, (isv ? c.vsat(kp) : c.ksat(kp)) + g);
    }
  }
  cp_async_commit();
}

template <int HD, int Q8, int GM, int NW>
__device__ __forceinline__ void decode_mma(const float* qs, int gb, const Cells<HD, Q8>& c, int lo, int hi,
                                           int last, const void* klast, const void* vlast,
                                           const float* klast_s, const float* vlast_s, float scale,
                                           float* __restrict__ o0, i64 o_stride, int partial) {
  using TD = DecodeTile<HD, Q8>;
  constexpr bool DIRECT = TD::DIRECT;
  constexpr int LK = TD::LK, G = Q8_GROUPS(HD), GS = Q8_GROUP(HD), NST = TD::NST;
  constexpr int KW = DT / NW;  // keys a warp takes of every tile: 16 (k = 16 steps of P V) or 8 (k = 8)
  static_assert(HD % 16 == 0, "decode_mma takes head dims of whole 16-dim steps");
  static_assert(KW == 16 || (KW == 8 && HD % 32 == 0), "8-key warps read V in 32-dim steps");
  static_assert(!DIRECT || KW == 8, "int8 fragments come from 8-key warps");
  extern __shared__ uint4 dsm[];
  u16* Qs = (u16*)dsm;                        // [16][LK]: the queries, rows j >= gb zero
  char* stages = (char*)(Qs + 16 * LK);       // [NST][STAGE]
  u16* F = (u16*)(stages + NST * TD::STAGE);  // int8 cells of 16-dim heads: [2][DT][LK], the tile decoded
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const float qscale = scale * 1.4426950408889634f;
  for (int i = threadIdx.x; i < 16 * HD / 2; i += blockDim.x) {
    const int r = i / (HD / 2), d = (i % (HD / 2)) * 2;
    // DIRECT: column k of a 32-dim group's two 16-dim steps s holds dim 8 (k % 8 / 2) + 4 s + 2 (k / 8) +
    // k % 2, so that a lane's 8 bytes of a key row (dims 8 t4 .. 8 t4 + 7) are its B fragments of both steps
    const int pd = DIRECT ? (d & ~31) + 8 * ((d & 7) >> 1) + 4 * ((d >> 4) & 1) + 2 * ((d >> 3) & 1) : d;
    const float a = r < GM ? qs[pd * GM + r] * qscale : 0.f;
    const float b = r < GM ? qs[(pd + 1) * GM + r] * qscale : 0.f;
    *(u32*)(Qs + r * LK + d) = pack2(a, b);
  }
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  const int ntiles = (hi - lo + DT - 1) / DT;
#pragma unroll
  for (int p = 0; p < NST - 1; p++) {  // every stage's commit group, empty past the last tile
    if (p < ntiles) tile_load<HD, Q8>(stages + p * TD::STAGE, c, lo + p * DT, hi, last, klast, vlast, klast_s,
                                      vlast_s);
    else cp_async_commit();
  }
  for (int t = 0; t < ntiles; t++) {
    const int t0 = lo + t * DT;
    cp_async_wait<NST - 2>();
    // tile t complete for every thread (and, at t = 0, the queries); every warp is done with tile t - 1,
    // whose stage the load below takes
    __syncthreads();
    const int tn = t + NST - 1;
    if (tn < ntiles) tile_load<HD, Q8>(stages + (tn % NST) * TD::STAGE, c, lo + tn * DT, hi, last, klast,
                                       vlast, klast_s, vlast_s);
    else cp_async_commit();
    const char* st = stages + (t % NST) * TD::STAGE;
    const u16* Ks = (const u16*)st;
    const u16* Vs = (const u16*)(st + TD::VOFF);
    if constexpr (Q8 && !DIRECT) {  // decoded once a tile into F
      const signed char* kr = (const signed char*)st;
      const signed char* vr = kr + DT * HD;
      const float* kss = (const float*)(vr + DT * HD);
      const float* vss = kss + DT * G;
#pragma unroll 4
      for (int i = threadIdx.x; i < DT * HD / 8; i += NW * 32) {
        const int key = i / (HD / 8), d = (i % (HD / 8)) * 8;
        *(uint4*)(F + key * LK + d) = dequant8(*(const uint2*)(kr + key * HD + d), kss[key * G + d / GS]);
        *(uint4*)(F + (DT + key) * LK + d) =
            dequant8(*(const uint2*)(vr + key * HD + d), vss[key * G + d / GS]);
      }
      __syncthreads();
      Ks = F;
      Vs = F + DT * LK;
    }
    // scores: this warp's KW keys (8-key n-tiles) x 16 query rows
    float s[KW / 8][4];
#pragma unroll
    for (int nt = 0; nt < KW / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
    const u16* qs_ = Qs + (lane & 15) * LK + (lane >> 4) * 8;
    const float* kss = (const float*)(st + TD::SOFF);
    const float* vss = kss + DT * TD::NGS;
    if constexpr (DIRECT) {
      // a 32-dim group's partial scores (two mmas on the exact codes) times the scales of the lane's two
      // columns, keys 2 t4 and 2 t4 + 1 of the warp's 8
      const char* krow = (const char*)Ks + (warp * 8 + g) * TD::KROW + 8 * t4;
      const float* ks0 = kss + (warp * 8 + 2 * t4) * G;
#pragma unroll
      for (int kp = 0; kp < HD / 32; kp++) {
        u32 qa0[4], qa1[4];
        ldsm_x4(qa0, qs_ + kp * 32);
        ldsm_x4(qa1, qs_ + kp * 32 + 16);
        const uint2 w = *(const uint2*)(krow + kp * 32);
        const u32 ux = w.x ^ 0x80808080u, uy = w.y ^ 0x80808080u;
        const u32 b0[2] = {codes_h2(ux, 0x4140u), codes_h2(ux, 0x4342u)};
        const u32 b1[2] = {codes_h2(uy, 0x4140u), codes_h2(uy, 0x4342u)};
        float part[4] = {0.f, 0.f, 0.f, 0.f};
        mma16816(part, qa0, b0);
        mma16816(part, qa1, b1);
        const float sa = ks0[kp], sb = ks0[G + kp];
        s[0][0] = fmaf(part[0], sa, s[0][0]);
        s[0][1] = fmaf(part[1], sb, s[0][1]);
        s[0][2] = fmaf(part[2], sa, s[0][2]);
        s[0][3] = fmaf(part[3], sb, s[0][3]);
      }
    } else {
      // two accumulators a tile, the 16-dim steps alternating, halve the chain of dependent mmas
      float s2[KW / 8][4];
#pragma unroll
      for (int nt = 0; nt < KW / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s2[nt][e] = 0.f;
      qk_tile<HD, LK, KW / 8>(s, s2, qs_, Ks + warp * KW * LK, lane);
      if constexpr (HD % 32 == 0) {
#pragma unroll
        for (int nt = 0; nt < KW / 8; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) s[nt][e] += s2[nt][e];
      }
    }
#pragma unroll
    for (int nt = 0; nt < KW / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (t0 + warp * KW + nt * 8 + 2 * t4 + (e & 1) >= hi) s[nt][e] = -INFINITY;
    float alpha[2];
    softmax_tile(s, mrow, lrow, alpha);
    // the running max of a long context settles early: most tiles leave it, and the HD / 2 products of the
    // outputs by 1 are skipped where every row of the warp kept its max
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int dt = 0; dt < HD / 8; dt++) {
        o[dt][0] *= alpha[0]; o[dt][1] *= alpha[0]; o[dt][2] *= alpha[1]; o[dt][3] *= alpha[1];
      }
    }
    // values: P (16 rows x the warp's KW keys) times their V rows
    if constexpr (DIRECT) {
      // a 32-dim group dp: the lane's 4 bytes of keys 2 t4 and 2 t4 + 1 (dims 32 dp + 4 g .. + 3) are the B
      // fragments of 4 output tiles, tile m's column g being dim 32 dp + 4 g + m; the values' scales go
      // into the probabilities
      const char* vrow = (const char*)Vs + (warp * 8 + 2 * t4) * TD::VROW + 4 * g;
      const float* vs0 = vss + (warp * 8 + 2 * t4) * G;
#pragma unroll
      for (int dp = 0; dp < HD / 32; dp++) {
        const u32 ua = *(const u32*)(vrow + dp * 32) ^ 0x80808080u;
        const u32 ub = *(const u32*)(vrow + TD::VROW + dp * 32) ^ 0x80808080u;
        u32 x01, x23;  // bytes m of both keys side by side
        asm("prmt.b32 %0, %1, %2, 0x5140;" : "=r"(x01) : "r"(ua), "r"(ub));
        asm("prmt.b32 %0, %1, %2, 0x7362;" : "=r"(x23) : "r"(ua), "r"(ub));
        const u32 bv[4] = {codes_h2(x01, 0x4140u), codes_h2(x01, 0x4342u), codes_h2(x23, 0x4140u),
                           codes_h2(x23, 0x4342u)};
        const float fa = vs0[dp] * VFOLD, fb = vs0[G + dp] * VFOLD;
        const u32 pa[2] = {pack2(s[0][0] * fa, s[0][1] * fb), pack2(s[0][2] * fa, s[0][3] * fb)};
#pragma unroll
        for (int m = 0; m < 4; m++) mma1688(o[4 * dp + m], pa, bv[m]);
      }
    } else if constexpr (KW == 16) {
      const u32 pa[4] = {pack2(s[0][0], s[0][1]), pack2(s[0][2], s[0][3]), pack2(s[1][0], s[1][1]),
                         pack2(s[1][2], s[1][3])};
#pragma unroll
      for (int dp = 0; dp < HD / 16; dp++) {  // two 8-dim output tiles an ldmatrix.x4
        u32 b[4];
        ldsm_x4_trans(b, Vs + (warp * 16 + (lane & 15)) * LK + dp * 16 + (lane >> 4) * 8);
        mma16816(o[2 * dp], pa, b);
        mma16816(o[2 * dp + 1], pa, b + 2);
      }
    } else {
      const u32 pa[2] = {pack2(s[0][0], s[0][1]), pack2(s[0][2], s[0][3])};
#pragma unroll
      for (int dp = 0; dp < HD / 32; dp++) {  // four 8-dim output tiles an ldmatrix.x4: lanes 8m.. matrix m
        u32 b[4];
        ldsm_x4_trans(b, Vs + (warp * 8 + (lane & 7)) * LK + dp * 32 + (lane >> 3) * 8);
#pragma unroll
        for (int m = 0; m < 4; m++) mma1688(o[4 * dp + m], pa, b[m]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages (the empty groups included) before they hold states
  // the warps' states merge: rows g (< GM <= 8) of each warp's running max, sum and outputs
  lrow[0] += __shfl_xor_sync(0xffffffffu, lrow[0], 1);
  lrow[0] += __shfl_xor_sync(0xffffffffu, lrow[0], 2);
  float* wo = (float*)stages;          // [NW][GM][HD]: the stages are free now
  float* wml = wo + NW * GM * HD;      // [NW][GM][2]
  if (g < GM) {
    const float unfold = DIRECT ? 1.f / VFOLD : 1.f;
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) {
      // output tile dt's columns 2 t4, 2 t4 + 1: dims dt 8 + 2 t4 (+ 1), or DIRECT's 32 (dt / 4) + 8 t4 +
      // dt % 4 (+ 4)
      const int d0 = DIRECT ? 32 * (dt >> 2) + 8 * t4 + (dt & 3) : dt * 8 + 2 * t4;
      const int d1 = d0 + (DIRECT ? 4 : 1);
      wo[(warp * GM + g) * HD + d0] = o[dt][0] * unfold;
      wo[(warp * GM + g) * HD + d1] = o[dt][1] * unfold;
    }
    if (t4 == 0) { wml[(warp * GM + g) * 2] = mrow[0]; wml[(warp * GM + g) * 2 + 1] = lrow[0]; }
  }
  __syncthreads();
  for (int x = threadIdx.x; x < gb * HD; x += blockDim.x) {
    const int j = x / HD, d = x % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; w++) M = fmaxf(M, wml[(w * GM + j) * 2]);
    float ov = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
      const float mw = wml[(w * GM + j) * 2];
      const float f = mw == -INFINITY ? 0.f : exp2f(mw - M);  // a warp whose keys were all past hi
      ov += wo[(w * GM + j) * HD + d] * f;
      L += wml[(w * GM + j) * 2 + 1] * f;
    }
    float* oj = o0 + j * o_stride;
    oj[d] = partial ? ov : ov / L;
    // attn_merge weighs the partials by expf: the max in natural-log units
    if (partial && d == 0) { oj[HD] = M * 0.6931471805599453f; oj[HD + 1] = L; }
  }
}

// Where a block's gb heads write (heads h0.. of row `row`): the output rows, or their partials in part
// ([rows, H, splits, HD + 2]) with splits > 1; a split past the last key marks its partials empty.
template <int HD>
__device__ __forceinline__ float* group_out(float* out, float* part, int H, int splits, int row, int h0,
                                            i64& stride) {
  if (splits > 1) {
    stride = (i64)splits * (HD + 2);
    return part + (((i64)row * H + h0) * splits + blockIdx.z) * (HD + 2);
  }
  stride = HD;
  return out + (i64)row * H * HD + (i64)h0 * HD;
}

// grid (H / gb, rows, splits): block x takes query heads x * gb .. + gb - 1, all of one kv group
template <int HD, int Q8, int GM, int NW>
__global__ void __launch_bounds__(NW * 32) attn_decode(
    const float* __restrict__ q, const i64* __restrict__ tab, int tab_stride, int layer,
    int H, int KV, float scale, float* __restrict__ out, float* __restrict__ part, int splits) {
  __shared__ __align__(16) float qs[HD * GM];
  const int gb = H / gridDim.x, h0 = blockIdx.x * gb, row = blockIdx.y, kvh = h0 / (H / KV);
  const i64* tr = tab + (i64)row * tab_stride;
  const int S = (int)tr[3] + 1;  // keys 0..pos, this token's included
  int lo, hi;
  i64 stride;
  float* o0 = group_out<HD>(out, part, H, splits, row, h0, stride);
  if (!split_range(S, splits, lo, hi)) {
    if (threadIdx.x < gb) o0[threadIdx.x * stride + HD + 1] = 0.f;
    return;
  }
  const Cells<HD, Q8> c(tr, layer, KV, kvh);
  for (int x = threadIdx.x; x < HD * GM; x += blockDim.x) {
    const int d = x / GM, j = x % GM;
    qs[x] = j < gb ? q[(i64)row * H * HD + (i64)(h0 + j) * HD + d] : 0.f;
  }
  __syncthreads();
  decode_mma<HD, Q8, GM, NW>(qs, gb, c, lo, hi, S - 1, c.kat(S - 1), c.vat(S - 1), c.ksat(S - 1),
                             c.vsat(S - 1), scale, o0, stride, splits > 1);
}

// qkv_post and attn_decode in one launch (decode rows only): the warps make the block's gb queries and, in
// the split that holds the new key, this row's new K and V rows of the kv group (as qkv_post does,
// fp16-rounded) into shared memory; the group's first block also stores them in the cache. Every block takes
// the new key from its own shared copy, so no block waits for another's cache write.
template <int HD, int Q8, int GM, int NW>
__global__ void __launch_bounds__(NW * 32) attn_decode_qkv(
    const float* __restrict__ qkv, const i64* __restrict__ tab, int tab_stride, int layer, int H, int KV,
    const float* __restrict__ qn, const float* __restrict__ kn, float eps, const float* __restrict__ inv_freq,
    int n_rot, int neox, float pos_scale, float scale, float* __restrict__ out, float* __restrict__ part,
    int splits) {
  constexpr int PER = HD >= 32 ? HD / 32 : 1;
  __shared__ __align__(16) float qs[HD * GM];
  __shared__ float scr[NW][HD];
  // the new key and value row (fp16, or int8 codes with their scales)
  __shared__ __align__(16) u16 knew[HD > 8 ? HD : 8];
  __shared__ __align__(16) u16 vnew[HD > 8 ? HD : 8];
  __shared__ __align__(16) float knew_s[Q8_GROUPS(HD)];  // 16-byte aligned: tile_load reads them by float4
  __shared__ __align__(16) float vnew_s[Q8_GROUPS(HD)];
  const int gb = H / gridDim.x, h0 = blockIdx.x * gb, row = blockIdx.y, group = H / KV, kvh = h0 / group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64* tr = tab + (i64)row * tab_stride;
  const i64 pos = tr[3];
  const int S = (int)pos + 1;
  const Cells<HD, Q8> c(tr, layer, KV, kvh);
  int lo, hi;
  i64 stride;
  float* o0 = group_out<HD>(out, part, H, splits, row, h0, stride);
  if (!split_range(S, splits, lo, hi)) {
    if (threadIdx.x < gb) o0[threadIdx.x * stride + HD + 1] = 0.f;
    return;
  }
  for (int x = threadIdx.x; x < HD * GM; x += blockDim.x)
    if (x % GM >= gb) qs[x] = 0.f;
  // tasks: the gb queries, then the new key and value (only the split holding the new key makes them: the
  // others read older keys only)
  const int tasks = gb + (hi == S ? 2 : 0);
  for (int t = warp; t < tasks; t += NW) {
    const int kind = t < gb ? 0 : t - gb + 1;  // 0 query, 1 key, 2 value
    const int hh = kind == 0 ? h0 + t : (kind == 1 ? H + kvh : H + KV + kvh);
    float v[PER];
    head_post<HD>(qkv + (i64)row * (H + 2 * KV) * HD + hh * HD, kind, kind == 0 ? qn : kn, eps, inv_freq,
                  n_rot, neox, pos_scale, pos, scr[warp], v);
    u16* mine = kind == 1 ? knew : vnew;
    if (kind > 0 && Q8) {
      store_q8<HD>(v, (signed char*)mine, kind == 1 ? knew_s : vnew_s);
      if (h0 % group == 0)
        store_q8<HD>(v, (signed char*)(kind == 1 ? c.kat(pos) : c.vat(pos)),
                     (float*)(kind == 1 ? c.ksat(pos) : c.vsat(pos)));
    }
    u16* cache = (u16*)(kind == 1 ? c.kat(pos) : c.vat(pos));
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int d = lane + 32 * i;
      if (d >= HD) continue;
      if (kind == 0) {
        qs[d * GM + t] = v[i];
      } else if (!Q8) {
        const u16 hv = f2h(v[i]);
        mine[d] = hv;
        if (h0 % group == 0) cache[d] = hv;
      }
    }
  }
  __syncthreads();
  decode_mma<HD, Q8, GM, NW>(qs, gb, c, lo, hi, S - 1, knew, vnew, knew_s, vnew_s, scale, o0, stride,
                             splits > 1);
}
"""
)


# the query heads a decode block takes, at most (the kernels' GM): 1, 4 or 8, the least that holds gb
GROUP_SIZES = (1, 4, 8)


def group_heads(h: int, kv: int) -> int:
    """gb: the query heads of one kv group a decode block takes, the largest divisor of the group up to 8."""
    group = h // kv
    return max(d for d in range(1, GROUP_SIZES[-1] + 1) if group % d == 0)


def group_size(gb: int) -> int:
    return next(g for g in GROUP_SIZES if g >= gb)


DECODE_TILE = 64  # keys a decode tile (DT)
# warps a decode block: with one block an SM (the registers of 16 x 256 outputs a warp), 4 warps left every
# step's latency in view (5.6 us a 64-key tile at 262k, 848 GB/s on the H100); 8 warps of 8 keys a tile
# share the loads and keep two warps a scheduler. 8-key warps read V in 32-dim steps: 16-dim heads keep 4
DECODE_WARPS = 8


def decode_warps(hd: int) -> int:
    """Warps a decode block for head dim hd: DECODE_WARPS where the head takes whole 32-dim steps, else 4."""
    return DECODE_WARPS if hd % 32 == 0 else 4


def decode_tile(hd: int, q8: bool) -> tuple[int, int, int]:
    """DecodeTile's (bytes a stage, stages, bytes of the decoded tile): int8 cells of whole 32-dim groups go
    to the mma from their codes (rows padded by 32 and 16 bytes), 16-dim ones through an fp16 copy; fp16
    rows padded by 16 bytes; for 256-dim heads (one block an SM by their registers) as many stages as fit
    200 KB, at most 4, else 2."""
    direct = q8 and hd % 32 == 0
    lk = hd + 8
    krow = hd + 32 if direct else (hd if q8 else 2 * lk)
    vrow = hd + 16 if direct else krow
    scales = hd // min(hd, 32) if q8 else 0
    stage = DECODE_TILE * (krow + vrow) + 2 * DECODE_TILE * scales * 4
    if q8 and not direct:
        return stage, 2, 2 * DECODE_TILE * lk * 2
    if hd < 256:
        return stage, 2, 0
    return stage, 4 if 2 * lk * 16 + 4 * stage <= 200 * 1024 else 3, 0


def decode_smem(hd: int, q8: bool, gb: int) -> int:
    """decode_mma's dynamic shared memory: the queries as 16 fp16 rows, the stages of a tile's K and V rows
    and scales, and for 16-dim int8 heads the tile decoded to fp16 (the warps' outputs, maxima and sums reuse
    the stages at the end)."""
    stage, stages, decoded = decode_tile(hd, q8)
    merge = decode_warps(hd) * group_size(gb) * (hd + 2) * 4
    return 16 * (hd + 8) * 2 + max(stages * stage, merge) + decoded


def decode_name(hd: int, q8: bool = False, gb: int = 1) -> str:
    return f"attn_decode<{hd}, {int(q8)}, {group_size(gb)}, {decode_warps(hd)}>"


def decode_qkv_name(hd: int, q8: bool = False, gb: int = 1) -> str:
    return f"attn_decode_qkv<{hd}, {int(q8)}, {group_size(gb)}, {decode_warps(hd)}>"


def ref_decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, q8: bool = False) -> np.ndarray:
    """decode_mma's twin: one query row q [1, H, D] after k, v [S, KV, D]. fp16 cells, and int8 cells of
    16-dim heads (decoded as code * scale, then rounded, as dequant8): flash_attn's twin on its last row
    (fp16 queries and probabilities, fp32 sums; keys in other tiles, the roundings the same). int8 cells of
    whole 32-dim groups: `_ref_decode_codes`."""
    if q8 and q.shape[-1] % 32 == 0:
        return _ref_decode_codes(q, k, v, scale)
    return ref_flash(q, cells.ref_cells(k, q8), cells.ref_cells(v, q8), scale)


def _ref_decode_codes(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """The DIRECT int8 path step for step: fp16 queries times the exact codes, summed per 32-dim group in
    fp32 and times the key's scale; a 64-key tile's base-2 online softmax in fp32; each probability times the
    value's group scale and VFOLD, rounded to fp16, times the codes, summed in fp32 and divided back."""
    _, n_head, d = q.shape
    s_all, n_kv, _ = k.shape
    group, ng = n_head // n_kv, d // 32
    kc, ks = quantize_rows(k)  # [S, KV, D] int8, [S, KV, ng]
    vc, vs = quantize_rows(v)
    qs = q[0].astype(np.float32) * np.float32(scale * 1.4426950408889634)
    qs = qs.astype(np.float16).astype(np.float32)  # [H, D]
    out = np.empty((1, n_head, d), np.float32)
    for h in range(n_head):
        kh = kc[:, h // group].astype(np.float32).reshape(s_all, ng, 32)
        parts = np.einsum("gc,sgc->sg", qs[h].reshape(ng, 32), kh)  # [S, ng]
        sc = (parts * ks[:, h // group]).sum(axis=1, dtype=np.float32)  # [S]
        vh = vc[:, h // group].astype(np.float32).reshape(s_all, ng, 32)
        m, l, acc = np.float32(-np.inf), np.float32(0), np.zeros((ng, 32), np.float32)
        for j0 in range(0, s_all, DECODE_TILE):
            t = sc[j0 : j0 + DECODE_TILE]
            m_new = max(m, t.max())
            alpha = np.exp2(m - m_new) if m > -np.inf else np.float32(1)
            p = np.exp2(t - m_new).astype(np.float32)
            l = l * alpha + p.sum(dtype=np.float32)
            pv = (p[:, None] * vs[j0 : j0 + DECODE_TILE, h // group] * np.float32(VFOLD)).astype(np.float16)
            acc = acc * alpha + np.einsum("sg,sgc->gc", pv.astype(np.float32), vh[j0 : j0 + DECODE_TILE])
            m = m_new
        out[0, h] = acc.reshape(d) / np.float32(VFOLD) / l
    return out

"""Prefill attention: `flash_attn`, T queries of one sequence against its KV cache (kernels/cells.py has
the cache layout, kernels/attention.py the decode kernels).

Tiled 64 or 128 queries (4 or 8 warps) x 64 keys with `mma.sync` (fp16 operands, fp32 accumulators) and an
online softmax, so no T x S score matrix is built whatever the prompt length. Key tiles past the block's last
query are never loaded; the next tile streams into shared memory (cp.async) while this one is multiplied:
as fp16, or for int8 cells as its codes and scales, decoded to fp16 once a block. The queries wait in shared
memory, so at head dim 256 a thread's registers hold the output rows and one tile's scores, not the queries.

Numpy twin: `ref_flash`; an int8 tile is decoded to fp16 (code * scale, rounded once) before it is
multiplied, so the twin takes `cells.ref_cells(k, True)`.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels.common import HEADER

FLASH_KT = 64  # keys per tile
FLASH_WARPS = (4, 8)  # flash_attn's block sizes (warps of 16 query rows)
FLASH_WIDE_ROWS, FLASH_WIDE_KEYS = 1024, 16384  # where the 8-warp blocks take over: not yet measured


def flash_smem(hd: int, q8: bool, warps: int) -> int:
    """flash_attn's dynamic shared memory: the block's queries and the K and V tiles (two stages; one for int8
    cells, beside two raw stages of codes and scales), fp16 rows padded by 16 bytes."""
    lk = hd + 8
    fp16 = 16 * warps * lk + 2 * (1 if q8 else 2) * FLASH_KT * lk
    raw = 2 * (2 * FLASH_KT * hd + 8 * FLASH_KT * (hd // min(hd, 32))) if q8 else 0
    return 2 * fp16 + raw


SOURCE = (
    HEADER
    + r"""
// ---- prefill: T queries of one sequence at positions n_past.., keys 0..n_past+T-1 ----
// Dynamic shared memory (flash_smem): the block's queries Qs [16 W][HD + 8] fp16 (A fragments by ldmatrix, so
// no thread holds a query in registers: at HD 256 the output's 128 floats a thread leave no room for them),
// then the K and V tiles [KT][HD + 8] fp16: two stages of each for fp16 cells, which stream in by cp.async
// while the other stage is multiplied. For int8 cells one fp16 stage and two raw stages (codes [KT][HD] and
// their scales [KT][HD / 32] for K and V): tile j + 1's raw bytes stream in by cp.async while tile j is
// decoded into the fp16 stage and multiplied, so each block decodes a tile once, by one byte permute a code.
// Cells before `base` (--kv-resident) come from hkc, hvc (hksc, hvsc; h_stride cells a kv head): the host's,
// read in place, or a staged copy of them; plain loads there (cp.async reads device memory). kc, vc are then
// the window minus base cells.
// W warps a block, 16 query rows each: every key tile a block loads serves W x 16 queries, so W = 8 halves
// the loads (and int8 decodes) per multiply of W = 4 and doubles the warps an SM has to hide the multiplies'
// latency (the shared memory leaves one block an SM at HD 256).
template <int HD, int Q8, int W>
__global__ void __launch_bounds__(32 * W) flash_attn(
    const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc, i64 head_stride,
    const float* __restrict__ ksc, const float* __restrict__ vsc, i64 sc_stride,
    int T, int n_past, int H, int KV, float scale_log2, float* __restrict__ out,
    const void* __restrict__ hkc, const void* __restrict__ hvc, i64 h_stride, const float* __restrict__ hksc,
    const float* __restrict__ hvsc, int base) {
  constexpr int KT = 64, LK = HD + 8, TILE = KT * LK, G = Q8_GROUPS(HD), GS = Q8_GROUP(HD);
  constexpr int STAGES = Q8 ? 1 : 2;
  constexpr int RAW = 2 * KT * HD + 8 * KT * G;  // bytes of a raw stage: K and V codes, then their scales
  extern __shared__ uint4 fsm[];
  u16* Qs = (u16*)fsm;                  // [16 W][LK]
  u16* Ks = Qs + 16 * W * LK;           // [STAGES][KT][LK]
  u16* Vs = Ks + STAGES * TILE;         // [STAGES][KT][LK]
  char* raw = (char*)(Vs + STAGES * TILE);  // Q8: [2][RAW]: K codes, V codes, K scales, V scales
  const int h = blockIdx.y, kvh = h / (H / KV);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int q0 = blockIdx.x * 16 * W + warp * 16;  // this warp's first query row
  const u16* kb = (const u16*)kc + (i64)kvh * head_stride;
  const u16* vb = (const u16*)vc + (i64)kvh * head_stride;
  const signed char* kb8 = (const signed char*)kc + (i64)kvh * head_stride;
  const signed char* vb8 = (const signed char*)vc + (i64)kvh * head_stride;
  const float* ksb = Q8 ? ksc + (i64)kvh * sc_stride : nullptr;
  const float* vsb = Q8 ? vsc + (i64)kvh * sc_stride : nullptr;
  constexpr int ES = Q8 ? 1 : 2;
  const char* hkb = (const char*)hkc + (i64)kvh * h_stride * HD * ES;
  const char* hvb = (const char*)hvc + (i64)kvh * h_stride * HD * ES;
  const float* hksb = Q8 ? hksc + (i64)kvh * h_stride * G : nullptr;
  const float* hvsb = Q8 ? hvsc + (i64)kvh * h_stride * G : nullptr;
  const int S = n_past + T;
  // the queries, pre-scaled by scale*log2(e) (the softmax runs in base 2), as fp16 rows
  for (int i = threadIdx.x; i < 16 * W * HD / 2; i += blockDim.x) {
    const int r = i / (HD / 2), c = (i % (HD / 2)) * 2, row = blockIdx.x * 16 * W + r;
    float a = 0.f, b = 0.f;
    if (row < T) {
      const float* p = q + (i64)row * H * HD + h * HD + c;
      a = p[0] * scale_log2; b = p[1] * scale_log2;
    }
    *(u32*)(Qs + r * LK + c) = pack2(a, b);
  }
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  const int last = min(S, n_past + (int)blockIdx.x * 16 * W + 16 * W);  // keys this block can see
  // fp16 cells: tile j0's K and V into stage st (cp.async from the device, plain loads from the host, zeros
  // past the last key)
  auto load_tile = [&](int j0, int st) {
    for (int i = threadIdx.x; i < KT * HD / 8; i += blockDim.x) {
      const int key = i / (HD / 8), d = (i % (HD / 8)) * 8;
      u16* kd = Ks + st * TILE + key * LK + d;
      u16* vd = Vs + st * TILE + key * LK + d;
      if (j0 + key >= S) {
        *(uint4*)kd = make_uint4(0, 0, 0, 0);
        *(uint4*)vd = make_uint4(0, 0, 0, 0);
      } else if (j0 + key < base) {
        *(uint4*)kd = *(const uint4*)((const u16*)hkb + (i64)(j0 + key) * HD + d);
        *(uint4*)vd = *(const uint4*)((const u16*)hvb + (i64)(j0 + key) * HD + d);
      } else {
        cp_async16(kd, kb + (i64)(j0 + key) * HD + d);
        cp_async16(vd, vb + (i64)(j0 + key) * HD + d);
      }
    }
    cp_async_commit();
  };
  // int8 cells: tile j0's codes and scales into raw stage rs, as stored
  auto load_raw = [&](int j0, int rs) {
    signed char* kr = (signed char*)(raw + rs * RAW);
    signed char* vr = kr + KT * HD;
    float* kss = (float*)(vr + KT * HD);
    float* vss = kss + KT * G;
    for (int i = threadIdx.x; i < KT * HD / 16; i += blockDim.x) {
      const int key = i / (HD / 16), d = (i % (HD / 16)) * 16;
      const i64 cell = j0 + key;
      uint4* kd = (uint4*)(kr + key * HD + d);
      uint4* vd = (uint4*)(vr + key * HD + d);
      if (cell >= S) {
        *kd = make_uint4(0, 0, 0, 0);
        *vd = make_uint4(0, 0, 0, 0);
      } else if (cell < base) {
        *kd = *(const uint4*)(hkb + cell * HD + d);
        *vd = *(const uint4*)(hvb + cell * HD + d);
      } else {
        cp_async16(kd, kb8 + cell * HD + d);
        cp_async16(vd, vb8 + cell * HD + d);
      }
    }
    for (int i = threadIdx.x; i < KT * G; i += blockDim.x) {
      const i64 cell = j0 + i / G;
      const int gi = i % G;
      if (cell >= S) {
        kss[i] = 0.f; vss[i] = 0.f;
      } else if (cell < base) {
        kss[i] = hksb[cell * G + gi]; vss[i] = hvsb[cell * G + gi];
      } else {
        cp_async4(kss + i, ksb + cell * G + gi);
        cp_async4(vss + i, vsb + cell * G + gi);
      }
    }
    cp_async_commit();
  };
  // raw stage rs decoded into the fp16 stage
  auto decode_raw = [&](int rs) {
    const signed char* kr = (const signed char*)(raw + rs * RAW);
    const signed char* vr = kr + KT * HD;
    const float* kss = (const float*)(vr + KT * HD);
    const float* vss = kss + KT * G;
    for (int i = threadIdx.x; i < KT * HD / 8; i += blockDim.x) {
      const int key = i / (HD / 8), d = (i % (HD / 8)) * 8;
      *(uint4*)(Ks + key * LK + d) = dequant8(*(const uint2*)(kr + key * HD + d), kss[key * G + d / GS]);
      *(uint4*)(Vs + key * LK + d) = dequant8(*(const uint2*)(vr + key * HD + d), vss[key * G + d / GS]);
    }
  };
  if (Q8) load_raw(0, 0); else load_tile(0, 0);
  int st = 0;
  for (int j0 = 0; j0 < last; j0 += KT, st ^= 1) {
    if (Q8) {
      cp_async_wait<0>();
      __syncthreads();  // raw stage st complete; every warp done with the fp16 stage and the other raw stage
      if (j0 + KT < last) load_raw(j0 + KT, st ^ 1);
      decode_raw(st);
      __syncthreads();  // the fp16 stage complete
    } else if (j0 + KT < last) {  // the other stage was released by the barrier that ended the last step
      load_tile(j0 + KT, st ^ 1);
      cp_async_wait<1>();
      __syncthreads();  // stage st complete for every thread
    } else {
      cp_async_wait<0>();
      __syncthreads();
    }
    if (q0 < T) {  // a warp with no live query still helps load tiles
      const u16* ks_ = Ks + (Q8 ? 0 : st) * TILE;
      const u16* vs_ = Vs + (Q8 ? 0 : st) * TILE;
      const u16* qs_ = Qs + (warp * 16 + (lane & 15)) * LK + (lane >> 4) * 8;
      float s[KT / 8][4];
#pragma unroll
      for (int nt = 0; nt < KT / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      qk_tile<HD, LK, KT / 8>(s, s, qs_, ks_, lane);
#pragma unroll
      for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = j0 + nt * 8 + 2 * t4 + (e & 1);
          const int qpos = n_past + q0 + g + 8 * (e >> 1);
          if (key > qpos) s[nt][e] = -INFINITY;
        }
      float alpha[2];
      softmax_tile(s, mrow, lrow, alpha);
#pragma unroll
      for (int dt = 0; dt < HD / 8; dt++) {
        o[dt][0] *= alpha[0]; o[dt][1] *= alpha[0]; o[dt][2] *= alpha[1]; o[dt][3] *= alpha[1];
      }
#pragma unroll
      for (int kk = 0; kk < KT / 16; kk++) {
        const u32 pa[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                           pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {  // two 8-dim output tiles an ldmatrix.x4
          u32 b[4];
          ldsm_x4_trans(b, vs_ + (kk * 16 + (lane & 15)) * LK + dp * 16 + (lane >> 4) * 8);
          mma16816(o[2 * dp], pa, b);
          mma16816(o[2 * dp + 1], pa, b + 2);
        }
      }
    }
    if (!Q8) __syncthreads();  // every warp is done with stage st before the next step refills it
  }
  if (q0 >= T) return;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
  }
#pragma unroll
  for (int dt = 0; dt < HD / 8; dt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = q0 + g + 8 * r;
      if (row < T) {
        float* p = out + (i64)row * H * HD + h * HD + dt * 8 + 2 * t4;
        p[0] = o[dt][2 * r] / lrow[r];
        p[1] = o[dt][2 * r + 1] / lrow[r];
      }
    }
}
"""
)


def flash_name(hd: int, q8: bool = False, warps: int = 4) -> str:
    return f"flash_attn<{hd}, {int(q8)}, {warps}>"


def flash_warps(t: int, n_past: int) -> int:
    """flash_attn's warps a block for t queries after n_past keys: 8 where each block scans many keys and
    there are blocks enough (a long prompt's later chunks), 4 otherwise (more blocks for the SMs)."""
    return 8 if t >= FLASH_WIDE_ROWS and n_past + t >= FLASH_WIDE_KEYS else 4


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def ref_flash(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, tile: int = 64) -> np.ndarray:
    """`flash_attn` step for step in numpy: 64-key tiles, base-2 online softmax, fp16 q/k/v and
    probabilities, fp32 running sums. q [T, H, D]; k, v [S, KV, D] with the T queries last."""
    t_all, n_head, d = q.shape
    s_all, n_kv, _ = k.shape
    group = n_head // n_kv
    n_past = s_all - t_all
    qs = _f16(q * np.float32(scale * 1.4426950408889634))  # [T, H, D]
    k16, v16 = _f16(k), _f16(v)
    out = np.empty((t_all, n_head, d), np.float32)
    for h in range(n_head):
        kh, vh = k16[:, h // group], v16[:, h // group]  # [S, D]
        m = np.full(t_all, -np.inf, np.float32)
        l = np.zeros(t_all, np.float32)
        acc = np.zeros((t_all, d), np.float32)
        for j0 in range(0, s_all, tile):
            s = qs[:, h] @ kh[j0 : j0 + tile].T  # [T, tile]
            keys = np.arange(j0, min(s_all, j0 + tile))
            s = np.where(keys[None, :] <= (n_past + np.arange(t_all))[:, None], s, -np.inf).astype(np.float32)
            m_new = np.maximum(m, s.max(axis=1))
            alpha = np.exp2(m - m_new)
            p = np.exp2(s - m_new[:, None])
            l = l * alpha + p.sum(axis=1)
            acc = acc * alpha[:, None] + _f16(p) @ vh[j0 : j0 + tile]
            m = m_new
        out[:, h] = acc / l[:, None]
    return out

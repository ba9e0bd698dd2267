"""Causal grouped-query attention against the KV cache, fp16 or int8 (`--kv-type`).

Cache layout, per sequence: K and V [n_layer, n_kv, cap, head_dim] fp16, or int8 codes with float32
scales [n_layer, n_kv, cap, head_dim / 32] (strata.runtime.kvcache's cells: the template flag Q8). Kernels
find a row's cache through a table row of int64 (k pointer, v pointer, cap, position), so one captured CUDA
graph serves whichever sequences sit in its slots: only the table changes between replays.

- `attn_decode`: one query per row (decode). Block (head, row), 4 warps; each warp scores 32 keys
  at a time (a lane per key), keeps a running max/sum (online softmax) and accumulates V with the
  lanes over head dims (each lane a contiguous run of HD/32, several keys' V loads in flight); the
  4 partial results merge in shared memory. fp32 math throughout. `attn_decode_qkv` is the same
  with rows.py's q/k/v epilogue (`head_post`) in front, so a decode layer needs no qkv_post launch.
- `flash_attn`: T queries of one sequence (prefill), tiled 64 or 128 queries (4 or 8 warps) x 64 keys with
  `mma.sync` (fp16 operands, fp32 accumulators) and an online softmax, so no T x S score matrix
  is built whatever the prompt length. Key tiles past the block's last query are never loaded; the
  next tile streams into a second shared-memory stage (cp.async) while this one is multiplied.

Numpy twins: `ref_attention` (strata.blocks.attention.attend on the cells as cached, `ref_cells`) and
`ref_flash`; an int8 tile is decoded to fp16 as it loads, so flash's twin takes `ref_cells(k, True)`.
"""

from __future__ import annotations

import numpy as np

from strata.blocks.attention import attend
from strata.gpu.kernels.common import HEADER
from strata.gpu.kernels.rows import HEAD_POST
from strata.runtime.kvcache import dequantize_rows, quantize_rows

FLASH_KT = 64  # keys per tile
FLASH_WARPS = (4, 8)  # flash_attn's block sizes (warps of 16 query rows)
FLASH_WIDE_ROWS, FLASH_WIDE_KEYS = 1024, 16384  # where the 8-warp blocks take over: not yet measured
# decode blocks a (row, head) with a partials buffer: 16 heads x 32 splits keeps the H200's 132 SMs busy from
# a batch of one; a split scores whole 128-key steps, so below 4,096 keys fewer splits have work (the rest
# exit)
SPLITS = 32


def flash_smem(hd: int) -> int:
    """flash_attn's dynamic shared memory: two stages of K and V tiles, rows padded by 16 bytes."""
    return 2 * 2 * FLASH_KT * (hd + 8) * 2


SOURCE = (
    HEADER
    + HEAD_POST
    + r"""
// A row's cells of one kv head in the table's cache (columns 0, 1; with Q8 the scales at 7, 8), and key j's.
// --kv-resident: cells before the window's `base` (column COLD + 5) live on the host, [n_layer, n_kv, hcap]
// like the device's (columns COLD.. + 4: k, v, k scales, v scales, hcap), read in place (zero-copy); the
// device pointers are the window's minus `base` cells, so cell j >= base is at the same arithmetic as without
// a window (and base 0, the host columns 0, is the plain cache).
#define COLD 10
template <int HD, int Q8>
struct Cells {
  const char* k; const char* v; const float* ks; const float* vs;
  const char* hk; const char* hv; const float* hks; const float* hvs;
  int base;
  __device__ Cells(const i64* tr, int layer, int KV, int kvh) {
    constexpr int ES = Q8 ? 1 : 2;
    const i64 head = (i64)layer * KV + kvh, cell0 = head * tr[2], hcell0 = head * tr[COLD + 4];
    k = (const char*)tr[0] + cell0 * HD * ES;
    v = (const char*)tr[1] + cell0 * HD * ES;
    ks = Q8 ? (const float*)tr[7] + cell0 * Q8_GROUPS(HD) : nullptr;
    vs = Q8 ? (const float*)tr[8] + cell0 * Q8_GROUPS(HD) : nullptr;
    base = (int)tr[COLD + 5];
    hk = (const char*)tr[COLD] + hcell0 * HD * ES;
    hv = (const char*)tr[COLD + 1] + hcell0 * HD * ES;
    hks = Q8 ? (const float*)tr[COLD + 2] + hcell0 * Q8_GROUPS(HD) : nullptr;
    hvs = Q8 ? (const float*)tr[COLD + 3] + hcell0 * Q8_GROUPS(HD) : nullptr;
  }
  __device__ const char* kat(int j) const { return (j < base ? hk : k) + (i64)j * HD * (Q8 ? 1 : 2); }
  __device__ const char* vat(int j) const { return (j < base ? hv : v) + (i64)j * HD * (Q8 ? 1 : 2); }
  __device__ const float* ksat(int j) const {
    return Q8 ? (j < base ? hks : ks) + (i64)j * Q8_GROUPS(HD) : nullptr;
  }
  __device__ const float* vsat(int j) const {
    return Q8 ? (j < base ? hvs : vs) + (i64)j * Q8_GROUPS(HD) : nullptr;
  }
};

// ---- decode: q [rows, H*HD] fp32, out [rows, H*HD] fp32 ----
// Key lists: key i of a row's list is the cache position pos(i); in the V loop a lane's key jj of the
// warp's step from `base` is at(base, jj, kp), kp each lane's own position (QSA's lists share them by
// shuffle). AllKeys: positions 0..S-1 in order (attn_decode); kernels/qsa.py's QsaKeys: the selected blocks.
struct AllKeys {
  __device__ int pos(int i) const { return i; }
  __device__ int at(int base, int jj, int) const { return base + jj; }
};

// One head of one row against keys lo..hi-1 of its list (c: its kv head's cells); the key at position
// `last` (or none: -1) has its K and V rows read from klast, vlast (the cache itself, or shared memory when
// the fused kernel below has just computed them). qs: the query, in shared memory; o: the head's HD outputs,
// divided by the softmax sum, or with ml given (a split's partial) as they are, the running max and sum in
// ml[0..1].
// Q8: the cells are int8 codes (c's, klast, vlast as signed char) with per-row scales (c's, klast_s,
// vlast_s: Q8_GROUPS(HD) floats a key), each decoded as code * scale in fp32 as strata.runtime.kvcache does.
template <int HD, int Q8, class Keys>
__device__ __forceinline__ void decode_core(const float* qs, const Cells<HD, Q8>& c, const Keys& keys, int lo,
                                            int hi, int last, const void* klast, const void* vlast,
                                            const float* klast_s, const float* vlast_s, float scale,
                                            float* __restrict__ o_out, float* __restrict__ ml) {
  constexpr int PER = HD >= 32 ? HD / 32 : 1;  // head dims per lane
  constexpr int G = Q8_GROUP(HD), NG = Q8_GROUPS(HD);
  __shared__ float pm[4], pl[4];
  __shared__ float pacc[4][HD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float m = -INFINITY, l = 0.0f, acc[PER];
#pragma unroll
  for (int i = 0; i < PER; i++) acc[i] = 0.0f;
  for (int base = lo + warp * 32; base < hi; base += 128) {
    const int key = base + lane;
    int kp = 0;  // the key's position
    float s = -INFINITY;
    if (key < hi) {
      kp = keys.pos(key);
      float dot = 0.0f;
      if (Q8) {
        const uint4* kr = (const uint4*)(kp == last ? klast : (const void*)c.kat(kp));
        const float* sc = kp == last ? klast_s : c.ksat(kp);
#pragma unroll
        for (int g = 0; g < NG; g++) {
          float part = 0.0f;
#pragma unroll
          for (int cc = 0; cc < G / 16; cc++) {
            const uint4 w = kr[g * (G / 16) + cc];
            const signed char* b = (const signed char*)&w;
#pragma unroll
            for (int i = 0; i < 16; i++) part = fmaf(qs[g * G + 16 * cc + i], (float)b[i], part);
          }
          dot = fmaf(part, sc[g], dot);
        }
      } else {
        const uint4* kr = (const uint4*)(kp == last ? klast : (const void*)c.kat(kp));
#pragma unroll
        for (int cc = 0; cc < HD / 8; cc++) {
          const uint4 w = kr[cc];
          const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int i = 0; i < 4; i++) {
            dot = fmaf(qs[8 * cc + 2 * i], h2f(ws[i] & 0xFFFF), dot);
            dot = fmaf(qs[8 * cc + 2 * i + 1], h2f(ws[i] >> 16), dot);
          }
        }
      }
      s = dot * scale;
    }
    const float mnew = fmaxf(m, warp_max(s));  // lane 0's key is live: mnew is finite
    const float alpha = expf(m - mnew);  // m = -inf on the first step: alpha = 0, acc is 0 anyway
    const float p = key < hi ? expf(s - mnew) : 0.0f;
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < PER; i++) acc[i] *= alpha;
    // lane owns dims PER*lane .. +PER-1 (one 2/4/8-byte load per key); unrolled so several keys' V
    // loads are in flight at once instead of one dependent L2 round trip per key
    const int nk = min(32, hi - base);
#pragma unroll 8
    for (int jj = 0; jj < nk; jj++) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const int at = keys.at(base, jj, kp);
      if (PER * lane >= HD) continue;
      const bool is_last = at == last;
      if (Q8) {
        const signed char* vr = (const signed char*)(is_last ? vlast : (const void*)c.vat(at)) + PER * lane;
        const float sv = (is_last ? vlast_s : c.vsat(at))[(PER * lane) / G];
#pragma unroll
        for (int i = 0; i < PER; i++) acc[i] = fmaf(pj, (float)vr[i] * sv, acc[i]);
      } else {
        const u16* vr = (const u16*)(is_last ? vlast : (const void*)c.vat(at)) + PER * lane;
        float vv[PER];
        if (PER == 4) {
          const uint2 w = *(const uint2*)vr;
          vv[0] = h2f(w.x & 0xFFFF); vv[1 % PER] = h2f(w.x >> 16);
          vv[2 % PER] = h2f(w.y & 0xFFFF); vv[3 % PER] = h2f(w.y >> 16);
        } else if (PER == 2) {
          const u32 w = *(const u32*)vr;
          vv[0] = h2f(w & 0xFFFF); vv[1 % PER] = h2f(w >> 16);
        } else {
#pragma unroll
          for (int i = 0; i < PER; i++) vv[i] = h2f(vr[i]);
        }
#pragma unroll
        for (int i = 0; i < PER; i++) acc[i] = fmaf(pj, vv[i], acc[i]);
      }
    }
    m = mnew;
  }
  l = warp_sum(l);
  if (lane == 0) { pm[warp] = m; pl[warp] = l; }
#pragma unroll
  for (int i = 0; i < PER; i++) {
    const int d = PER * lane + i;
    if (d < HD) pacc[warp][d] = acc[i];
  }
  __syncthreads();
  float M = fmaxf(fmaxf(pm[0], pm[1]), fmaxf(pm[2], pm[3]));
  float w[4], L = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) { w[i] = pm[i] == -INFINITY ? 0.0f : expf(pm[i] - M); L += pl[i] * w[i]; }
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) o += pacc[i][d] * w[i];
    o_out[d] = ml == nullptr ? o / L : o;
  }
  if (ml != nullptr && threadIdx.x == 0) { ml[0] = M; ml[1] = L; }
}

// Split-K decode (flash-decoding): a long context's keys are shared out among `splits` blocks of a (head,
// row), each scoring a run of whole 128-key steps, so a batch of one keeps the SMs busy at 100k+ keys. Split
// z takes keys [z * chunk, (z + 1) * chunk) of S; with splits == 1 the block takes them all and writes the
// output.
// part: [rows, H, splits, HD + 2] partials (HD outputs, max, sum) that attn_merge combines.
__device__ __forceinline__ bool split_range(int S, int splits, int& lo, int& hi) {
  const int chunk = ((S + splits - 1) / splits + 127) / 128 * 128;
  lo = (int)blockIdx.z * chunk;
  hi = min(S, lo + chunk);
  return lo < hi;
}

template <int HD>
__device__ __forceinline__ float* part_of(float* part, int H, int splits) {
  return part + (((i64)blockIdx.y * H + blockIdx.x) * splits + blockIdx.z) * (HD + 2);
}

// grid (H, rows), block HD (<= 256 threads, one a dim): the splits' partials merged by the log-sum-exp rule
template <int HD>
__global__ void __launch_bounds__(256) attn_merge(const float* __restrict__ part, int splits, int H,
                                                  float* __restrict__ out) {
  const float* p = part + ((i64)blockIdx.y * H + blockIdx.x) * splits * (HD + 2);
  float M = -INFINITY;
  for (int z = 0; z < splits; z++) if (p[z * (HD + 2) + HD + 1] > 0.f) M = fmaxf(M, p[z * (HD + 2) + HD]);
  const int d = threadIdx.x;
  float o = 0.f, L = 0.f;
  for (int z = 0; z < splits; z++) {
    const float* pz = p + z * (HD + 2);
    if (pz[HD + 1] <= 0.f) continue;  // a split past the last key
    const float w = expf(pz[HD] - M);
    L += pz[HD + 1] * w;
    if (d < HD) o += pz[d] * w;
  }
  if (d < HD) out[(i64)blockIdx.y * H * HD + blockIdx.x * HD + d] = o / L;
}

// grid (H, rows, splits)
template <int HD, int Q8>
__global__ void __launch_bounds__(128) attn_decode(
    const float* __restrict__ q, const i64* __restrict__ tab, int tab_stride, int layer,
    int H, int KV, float scale, float* __restrict__ out, float* __restrict__ part, int splits) {
  __shared__ float qs[HD];
  const int h = blockIdx.x, row = blockIdx.y, kvh = h / (H / KV);
  const i64* tr = tab + (i64)row * tab_stride;
  const int S = (int)tr[3] + 1;  // keys 0..pos, this token's included
  int lo, hi;
  float* partial = splits > 1 ? part_of<HD>(part, H, splits) : nullptr;
  if (!split_range(S, splits, lo, hi)) { if (threadIdx.x == 0) partial[HD + 1] = 0.f; return; }
  const Cells<HD, Q8> c(tr, layer, KV, kvh);
  for (int d = threadIdx.x; d < HD; d += blockDim.x) qs[d] = q[(i64)row * H * HD + h * HD + d];
  __syncthreads();
  decode_core<HD, Q8>(qs, c, AllKeys(), lo, hi, S - 1, c.kat(S - 1), c.vat(S - 1), c.ksat(S - 1),
                      c.vsat(S - 1), scale, partial != nullptr ? partial : out + (i64)row * H * HD + h * HD,
                      partial != nullptr ? partial + HD : nullptr);
}

// qkv_post and attn_decode in one launch (decode rows only): warp 0 makes this head's query, warps 1
// and 2 this row's new K and V rows of the head's kv group (as qkv_post does, fp16-rounded) into
// shared memory, and the group's first query head also stores them in the cache. Every block takes
// the new key from its own shared copy, so no block waits for another's cache write.
template <int HD, int Q8>
__global__ void __launch_bounds__(128) attn_decode_qkv(
    const float* __restrict__ qkv, const i64* __restrict__ tab, int tab_stride, int layer, int H, int KV,
    const float* __restrict__ qn, const float* __restrict__ kn, float eps, const float* __restrict__ inv_freq,
    int n_rot, int neox, float pos_scale, float scale, float* __restrict__ out, float* __restrict__ part,
    int splits) {
  constexpr int PER = HD >= 32 ? HD / 32 : 1;
  __shared__ float qs[HD];
  __shared__ float scr[3][HD];
  // the new key and value row (fp16, or int8 codes with their scales)
  __shared__ __align__(16) u16 knew[HD > 8 ? HD : 8];
  __shared__ __align__(16) u16 vnew[HD > 8 ? HD : 8];
  __shared__ float knew_s[Q8_GROUPS(HD)], vnew_s[Q8_GROUPS(HD)];
  const int h = blockIdx.x, row = blockIdx.y, group = H / KV, kvh = h / group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64* tr = tab + (i64)row * tab_stride;
  const i64 pos = tr[3];
  const int S = (int)pos + 1;
  const Cells<HD, Q8> c(tr, layer, KV, kvh);
  int lo, hi;
  float* partial = splits > 1 ? part_of<HD>(part, H, splits) : nullptr;
  if (!split_range(S, splits, lo, hi)) { if (threadIdx.x == 0) partial[HD + 1] = 0.f; return; }
  // only the split holding the new key makes it (and stores it): the others read older keys only
  if (warp == 0 || (warp < 3 && hi == S)) {
    const int hh = warp == 0 ? h : (warp == 1 ? H + kvh : H + KV + kvh);
    float v[PER];
    head_post<HD>(qkv + (i64)row * (H + 2 * KV) * HD + hh * HD, warp, warp == 0 ? qn : kn, eps, inv_freq,
                  n_rot, neox, pos_scale, pos, scr[warp], v);
    u16* mine = warp == 1 ? knew : vnew;
    if (warp > 0 && Q8) {
      store_q8<HD>(v, (signed char*)mine, warp == 1 ? knew_s : vnew_s);
      if (h % group == 0)
        store_q8<HD>(v, (signed char*)(warp == 1 ? c.kat(pos) : c.vat(pos)),
                     (float*)(warp == 1 ? c.ksat(pos) : c.vsat(pos)));
    }
    u16* cache = (u16*)(warp == 1 ? c.kat(pos) : c.vat(pos));
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int d = lane + 32 * i;
      if (d >= HD) continue;
      if (warp == 0) {
        qs[d] = v[i];
      } else if (!Q8) {
        const u16 hv = f2h(v[i]);
        mine[d] = hv;
        if (h % group == 0) cache[d] = hv;
      }
    }
  }
  __syncthreads();
  decode_core<HD, Q8>(qs, c, AllKeys(), lo, hi, S - 1, knew, vnew, knew_s, vnew_s, scale,
                      partial != nullptr ? partial : out + (i64)row * H * HD + h * HD,
                      partial != nullptr ? partial + HD : nullptr);
}

// ---- prefill: T queries of one sequence at positions n_past.., keys 0..n_past+T-1 ----
__device__ __forceinline__ void mma16816(float* c, const u32* a, const u32* b) {
  asm volatile(
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
  unsigned long long a; asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p)); return (u32)a;
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
}
// Two 8x8 b16 matrices transposed: rows (keys) from lanes 0-7 and 8-15, so lane l gets the column (dim) l / 4
// at keys 2 (l % 4), +1 of each: the B fragment of m16n8k16 from a [key][dim] tile
__device__ __forceinline__ void ldsm_x2_trans(u32* r, const u16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}

// Dynamic shared memory: flash_smem(HD) bytes = two stages of K and V tiles [KT][HD + 8] halves. The next
// tile's K and V stream in by cp.async while this one is multiplied; V stays [key][dim] and its P.V
// fragments come through ldmatrix .trans.
// Q8: kc, vc hold int8 codes and ksc, vsc their scales (sc_stride floats a kv head); a tile is decoded to
// fp16 (code * scale, rounded) as it is loaded, with plain loads instead of cp.async.
// Cells before `base` (--kv-resident) come from hkc, hvc (hksc, hvsc; h_stride cells a kv head): the
// host's, read in place, or a staged copy of them; plain loads there too. kc, vc are then the window minus
// base cells.
// W warps a block, 16 query rows each: every key tile a block loads (and, for int8 cells, decodes) serves
// W x 16 queries, so W = 8 halves the loads and decodes per multiply of W = 4 and doubles the warps an SM
// has to hide the multiplies' latency (the two stages' shared memory leave one block an SM at HD 256).
template <int HD, int Q8, int W>
__global__ void __launch_bounds__(32 * W) flash_attn(
    const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc, i64 head_stride,
    const float* __restrict__ ksc, const float* __restrict__ vsc, i64 sc_stride,
    int T, int n_past, int H, int KV, float scale_log2, float* __restrict__ out,
    const void* __restrict__ hkc, const void* __restrict__ hvc, i64 h_stride, const float* __restrict__ hksc,
    const float* __restrict__ hvsc, int base) {
  constexpr int KT = 64, LK = HD + 8, TILE = KT * LK;
  extern __shared__ uint4 fsm[];
  u16* Ks = (u16*)fsm;        // [2][KT][LK]
  u16* Vs = Ks + 2 * TILE;    // [2][KT][LK]
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
  const float* hksb = Q8 ? hksc + (i64)kvh * h_stride * Q8_GROUPS(HD) : nullptr;
  const float* hvsb = Q8 ? hvsc + (i64)kvh * h_stride * Q8_GROUPS(HD) : nullptr;
  const int S = n_past + T;
  // Q fragments (pre-scaled by scale*log2(e): the softmax runs in base 2)
  u32 qa[HD / 16][4];
#pragma unroll
  for (int ks = 0; ks < HD / 16; ks++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int row = q0 + g + 8 * (r & 1), col = ks * 16 + 2 * t4 + 8 * (r >> 1);
      float a = 0.f, b = 0.f;
      if (row < T) {
        const float* p = q + (i64)row * H * HD + h * HD + col;
        a = p[0] * scale_log2; b = p[1] * scale_log2;
      }
      qa[ks][r] = pack2(a, b);
    }
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  const int last = min(S, n_past + (int)blockIdx.x * 16 * W + 16 * W);  // keys this block can see
  auto load_tile = [&](int j0, int st) {
    for (int i = threadIdx.x; i < KT * HD / 8; i += blockDim.x) {
      const int key = i / (HD / 8), d = (i % (HD / 8)) * 8;
      u16* kd = Ks + st * TILE + key * LK + d;
      u16* vd = Vs + st * TILE + key * LK + d;
      const bool cold = j0 + key < base;
      if (j0 + key < S && Q8) {
        const i64 cell = j0 + key;
        const signed char* kr = (cold ? (const signed char*)hkb : kb8) + cell * HD + d;
        const signed char* vr = (cold ? (const signed char*)hvb : vb8) + cell * HD + d;
        const uint2 kw = *(const uint2*)kr, vw = *(const uint2*)vr;
        const float ks = (cold ? hksb : ksb)[cell * Q8_GROUPS(HD) + d / Q8_GROUP(HD)],
                    vs = (cold ? hvsb : vsb)[cell * Q8_GROUPS(HD) + d / Q8_GROUP(HD)];
        const signed char* kq = (const signed char*)&kw;
        const signed char* vq = (const signed char*)&vw;
        u32 kh[4], vh[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
          kh[i] = (u32)f2h((float)kq[2 * i] * ks) | ((u32)f2h((float)kq[2 * i + 1] * ks) << 16);
          vh[i] = (u32)f2h((float)vq[2 * i] * vs) | ((u32)f2h((float)vq[2 * i + 1] * vs) << 16);
        }
        *(uint4*)kd = make_uint4(kh[0], kh[1], kh[2], kh[3]);
        *(uint4*)vd = make_uint4(vh[0], vh[1], vh[2], vh[3]);
      } else if (cold) {  // plain loads: cp.async is for device memory
        *(uint4*)kd = *(const uint4*)((const u16*)hkb + (i64)(j0 + key) * HD + d);
        *(uint4*)vd = *(const uint4*)((const u16*)hvb + (i64)(j0 + key) * HD + d);
      } else if (j0 + key < S) {
        cp_async16(kd, kb + (i64)(j0 + key) * HD + d);
        cp_async16(vd, vb + (i64)(j0 + key) * HD + d);
      } else {
        *(uint4*)kd = make_uint4(0, 0, 0, 0);
        *(uint4*)vd = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
  };
  load_tile(0, 0);
  int st = 0;
  for (int j0 = 0; j0 < last; j0 += KT, st ^= 1) {
    if (j0 + KT < last) {  // the other stage was released by the barrier that ended the last step
      load_tile(j0 + KT, st ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // stage st complete for every thread
    if (q0 < T) {  // a warp with no live query still helps load tiles
      const u16* ks_ = Ks + st * TILE;
      const u16* vs_ = Vs + st * TILE;
      float s[KT / 8][4];
#pragma unroll
      for (int nt = 0; nt < KT / 8; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
          const u16* p = ks_ + (nt * 8 + g) * LK + ks * 16 + 2 * t4;
          const u32 b[2] = {*(const u32*)p, *(const u32*)(p + 8)};
          mma16816(s[nt], qa[ks], b);
        }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = j0 + nt * 8 + 2 * t4 + (e & 1);
          const int qpos = n_past + q0 + g + 8 * (e >> 1);
          if (key > qpos) s[nt][e] = -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
        }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mnew = fmaxf(mrow[r], mx[r]);
        alpha[r] = mnew == -INFINITY ? 1.f : exp2f(mrow[r] - mnew);
        mrow[r] = mnew;
        lrow[r] *= alpha[r];
      }
#pragma unroll
      for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float mr = mrow[e >> 1];
          const float p = mr == -INFINITY ? 0.f : exp2f(s[nt][e] - mr);
          s[nt][e] = p;
          lrow[e >> 1] += p;
        }
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
        for (int dt = 0; dt < HD / 8; dt++) {
          u32 b[2];
          ldsm_x2_trans(b, vs_ + (kk * 16 + (lane & 15)) * LK + dt * 8);
          mma16816(o[dt], pa, b);
        }
      }
    }
    __syncthreads();  // every warp is done with stage st before the next step refills it
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


def decode_name(hd: int, q8: bool = False) -> str:
    return f"attn_decode<{hd}, {int(q8)}>"


def decode_qkv_name(hd: int, q8: bool = False) -> str:
    return f"attn_decode_qkv<{hd}, {int(q8)}>"


def merge_name(hd: int) -> str:
    return f"attn_merge<{hd}>"


def flash_name(hd: int, q8: bool = False, warps: int = 4) -> str:
    return f"flash_attn<{hd}, {int(q8)}, {warps}>"


def flash_warps(t: int, n_past: int) -> int:
    """flash_attn's warps a block for t queries after n_past keys: 8 where each block scans many keys and
    there are blocks enough (a long prompt's later chunks), 4 otherwise (more blocks for the SMs)."""
    return 8 if t >= FLASH_WIDE_ROWS and n_past + t >= FLASH_WIDE_KEYS else 4


def ref_cells(x: np.ndarray, q8: bool) -> np.ndarray:
    """Keys or values [S, KV, D] as the kernels read them back: fp16, or int8 cells decoded
    (strata.runtime.kvcache)."""
    if q8:
        return dequantize_rows(*quantize_rows(x))
    return x.astype(np.float16).astype(np.float32)


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, q8: bool = False) -> np.ndarray:
    """q [T, H, D] against k, v [S, KV, D] as the decode kernels see them (fp32 math on the cached cells)."""
    return attend(q.astype(np.float32), ref_cells(k, q8), ref_cells(v, q8), scale)


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

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
- prefill's `flash_attn` is kernels/flash.py's.

Numpy twin: `ref_attention` (strata.blocks.attention.attend on the cells as cached, `ref_cells`).
"""

from __future__ import annotations

import numpy as np

from strata.blocks.attention import attend
from strata.gpu.kernels.common import HEADER
from strata.gpu.kernels.rows import HEAD_POST
from strata.runtime.kvcache import dequantize_rows, quantize_rows

# decode blocks a (row, head) with a partials buffer: 16 heads x 32 splits keeps the H200's 132 SMs busy from
# a batch of one; a split scores whole 128-key steps, so below 4,096 keys fewer splits have work (the rest
# exit)
SPLITS = 32


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
"""
)


def decode_name(hd: int, q8: bool = False) -> str:
    return f"attn_decode<{hd}, {int(q8)}>"


def decode_qkv_name(hd: int, q8: bool = False) -> str:
    return f"attn_decode_qkv<{hd}, {int(q8)}>"


def merge_name(hd: int) -> str:
    return f"attn_merge<{hd}>"


def ref_cells(x: np.ndarray, q8: bool) -> np.ndarray:
    """Keys or values [S, KV, D] as the kernels read them back: fp16, or int8 cells decoded
    (strata.runtime.kvcache)."""
    if q8:
        return dequantize_rows(*quantize_rows(x))
    return x.astype(np.float16).astype(np.float32)


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, q8: bool = False) -> np.ndarray:
    """q [T, H, D] against k, v [S, KV, D] as the decode kernels see them (fp32 math on the cached cells)."""
    return attend(q.astype(np.float32), ref_cells(k, q8), ref_cells(v, q8), scale)

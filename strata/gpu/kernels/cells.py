"""A row's KV cells as the attention kernels read them, one head's fp32 attention over a list of them, and
split-K's partials with their merge; composed into kernels/attention.py's and kernels/qsa.py's sources.

Cache layout, per sequence: K and V [n_layer, n_kv, cap, head_dim] fp16, or int8 codes with float32
scales [n_layer, n_kv, cap, head_dim / 32] (strata.runtime.kvcache's cells: the template flag Q8). Kernels
find a row's cache through a table row of int64 (k pointer, v pointer, cap, position), so one captured CUDA
graph serves whichever sequences sit in its slots: only the table changes between replays.

- `Cells`: where key j's K and V rows (and int8 scales) are, in the device cache or, before a --kv-resident
  window, in host memory.
- `attend_keys`: one query head against a list of keys (QSA's selected blocks, kernels/qsa.py), a lane per
  key, 4 warps, an online softmax, fp32 math on the cells as strata.runtime.kvcache decodes them.
- `split_range`, `part_of`, `attn_merge`: split-K (flash-decoding): a long context's keys shared out among
  the blocks of a (head, row), each writing a partial that attn_merge combines by the log-sum-exp rule.

Numpy twins: `ref_cells` (the cells as read back), `ref_attention` (attend_keys over every key:
strata.blocks.attention.attend on the cells as cached).
"""

from __future__ import annotations

import numpy as np

from strata.blocks.attention import attend
from strata.runtime.kvcache import dequantize_rows, quantize_rows

SOURCE = r"""
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
// q . one cached K row (q in shared memory): int8 codes summed per 32-dim group, then times the group's
// scale (sc), as strata.runtime.kvcache decodes them; or fp16
template <int HD, int Q8>
__device__ __forceinline__ float k_dot(const float* q, const void* row, const float* sc) {
  constexpr int G = Q8_GROUP(HD), NG = Q8_GROUPS(HD);
  const uint4* kr = (const uint4*)row;
  float dot = 0.0f;
  if (Q8) {
#pragma unroll
    for (int g = 0; g < NG; g++) {
      float part = 0.0f;
#pragma unroll
      for (int cc = 0; cc < G / 16; cc++) {
        const uint4 w = kr[g * (G / 16) + cc];
        const signed char* b = (const signed char*)&w;
#pragma unroll
        for (int i = 0; i < 16; i++) part = fmaf(q[g * G + 16 * cc + i], (float)b[i], part);
      }
      dot = fmaf(part, sc[g], dot);
    }
  } else {
#pragma unroll
    for (int cc = 0; cc < HD / 8; cc++) {
      const uint4 w = kr[cc];
      const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 4; i++) {
        dot = fmaf(q[8 * cc + 2 * i], h2f(ws[i] & 0xFFFF), dot);
        dot = fmaf(q[8 * cc + 2 * i + 1], h2f(ws[i] >> 16), dot);
      }
    }
  }
  return dot;
}

// The lane's PER values of a cached V row (dims PER * lane ..), decoded: int8 codes times their 32 dims'
// scale in fp32, or fp16; one load a lane where PER allows
template <int HD, int Q8>
__device__ __forceinline__ void v_lane(const void* row, const float* scales, int lane, float* vv) {
  constexpr int PER = HD >= 32 ? HD / 32 : 1;
  if (Q8) {
    const signed char* vr = (const signed char*)row + PER * lane;
    const float sv = scales[(PER * lane) / Q8_GROUP(HD)];
#pragma unroll
    for (int i = 0; i < PER; i++) vv[i] = (float)vr[i] * sv;
    return;
  }
  const u16* vr = (const u16*)row + PER * lane;
  if (PER == 8) {
    const uint4 w = *(const uint4*)vr;
    const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      vv[(2 * i) % PER] = h2f(ws[i] & 0xFFFF);
      vv[(2 * i + 1) % PER] = h2f(ws[i] >> 16);
    }
  } else if (PER == 4) {
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
}

// One head of one row against keys lo..hi-1 of its list (c: its kv head's cells; key i is at cache position
// keys.pos(i), and in the V loop a lane's key jj of the warp's step from `base` at keys.at(base, jj, kp), kp
// each lane's own position). q: the query, in shared memory; o_out: the head's HD outputs, divided by the
// softmax sum, or with ml given (a split's partial) as they are, the running max and sum in ml[0..1].
template <int HD, int Q8, class Keys>
__device__ __forceinline__ void attend_keys(const float* q, const Cells<HD, Q8>& c, const Keys& keys, int lo,
                                            int hi, float scale, float* __restrict__ o_out,
                                            float* __restrict__ ml) {
  constexpr int PER = HD >= 32 ? HD / 32 : 1;  // head dims per lane
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
      s = k_dot<HD, Q8>(q, c.kat(kp), c.ksat(kp)) * scale;
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
      float vv[PER];
      v_lane<HD, Q8>(c.vat(at), c.vsat(at), lane, vv);
#pragma unroll
      for (int i = 0; i < PER; i++) acc[i] = fmaf(pj, vv[i], acc[i]);
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

"""


def merge_name(hd: int) -> str:
    return f"attn_merge<{hd}>"


def ref_cells(x: np.ndarray, q8: bool) -> np.ndarray:
    """Keys or values [S, KV, D] as the kernels read them back: fp16, or int8 cells decoded
    (strata.runtime.kvcache)."""
    if q8:
        return dequantize_rows(*quantize_rows(x))
    return x.astype(np.float16).astype(np.float32)


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, q8: bool = False) -> np.ndarray:
    """attend_keys' twin over every key: q [T, H, D] against k, v [S, KV, D] in fp32 math on the cached
    cells."""
    return attend(q.astype(np.float32), ref_cells(k, q8), ref_cells(v, q8), scale)

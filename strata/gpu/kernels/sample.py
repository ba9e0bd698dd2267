"""Token choice on the GPU, inside the decode graph: greedy argmax, and the top-k draw of strata/sampling/.

`sample_rows` reads one draw row per sequence (sampler.draw_row: temperature, top_k, top_p,
min_p and the uniform u, which the host computes from the same counter-based Philox as the CPU
sampler) and writes the chosen token into the table's token column, so the next replay of the graph
feeds it with no host round trip. Temperature 0 is greedy. Otherwise:

- the k largest logits, ties by the lower id as the CPU's stable sort, are found by a radix select
  over order-preserving keys (four 8-bit digits, per-warp histograms) and gathered, in two stages:
  `sample_chunks` takes the top k of each of SAMPLE_CHUNKS chunks of the row, one block each, and
  `sample_rows` the top k of those candidates (one block scanning the whole row four times cost ~0.26 ms
  a token on the H100, 6% of a b=1 decode step);
- the rest is strata.sampling.sampler.candidates on those k in float64, one thread, in the CPU's order:
  exp(z - z0) normalised, the top_p prefix, the min_p cut, the draw on the renormalised cdf.

Draws the device cannot make the same way (penalties, top_k 0 or above DEVICE_TOP_K) stay on the
host (strata.sampling.sampler.device_drawable). Sums run in sequence here where numpy sums pairwise, so a
draw can differ from the CPU's only when u lands within rounding of a bucket edge.

`advance` then moves each slot one position on, so the next replay decodes the token just chosen.

Numpy twins: `ref_argmax` (np.argmax); `ref_sample_chunks`, whose candidates CI checks hold every row's
top k; `ref_sample_rows`, which CI checks against strata.sampling.sampler.sample; and `ref_advance`, which CI
checks against the table the host would write (GpuModel.table_row) after its own bookkeeping of the step.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels.common import HEADER
from strata.sampling.sampler import DEVICE_TOP_K

# the table columns (strata/gpu/layers.py TAB) the kernels here write: sample_rows the token, advance
# the position
POSITION, TOKEN = 3, 4
# the draw's first stage splits a row into this many chunks, each one block (sample_chunks): their top k
# candidates, SAMPLE_CHUNKS * k of them, are all the second stage (sample_rows) reads but the chosen logits
SAMPLE_CHUNKS = 32

SOURCE = (
    HEADER
    + r"""
#define SAMPLE_KMAX """
    + str(DEVICE_TOP_K)
    + "\n#define SAMPLE_CHUNKS "
    + str(SAMPLE_CHUNKS)
    + r"""

// The row's argmax, ties to the lowest index like np.argmax; the answer is valid in thread 0
__device__ int block_argmax(const float* __restrict__ l, int V) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  float best = -INFINITY; int idx = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    if (l[i] > best) { best = l[i]; idx = i; }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ob > best || (ob == best && oi < idx)) { best = ob; idx = oi; }
  }
  if ((threadIdx.x & 31) == 0) { bv[threadIdx.x >> 5] = best; bi[threadIdx.x >> 5] = idx; }
  __syncthreads();
  if (threadIdx.x < 32) {
    best = threadIdx.x < (blockDim.x >> 5) ? bv[threadIdx.x] : -INFINITY;
    idx = threadIdx.x < (blockDim.x >> 5) ? bi[threadIdx.x] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ob > best || (ob == best && oi < idx)) { best = ob; idx = oi; }
    }
  }
  return idx == 0x7fffffff ? 0 : idx;
}

// out[b] = argmax(logits[b]); grid B, block 1024
__global__ void __launch_bounds__(1024) argmax_rows(const float* __restrict__ logits, int V,
                                                    i64* __restrict__ out, int out_stride) {
  const int idx = block_argmax(logits + (i64)blockIdx.x * V, V);
  if (threadIdx.x == 0) out[(i64)blockIdx.x * out_stride] = idx;
}

// Larger floats give larger keys; NaN (a masked token on the CPU) sorts below -inf
__device__ __forceinline__ unsigned order_key(float f) {
  const unsigned u = __float_as_uint(f);
  if (f != f) return 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The CPU sampler's float64 view of a logit: NaN is -inf, +inf the largest double
__device__ __forceinline__ double as_finite(float f) {
  if (f != f) return -INFINITY;
  if (isinf(f) && f > 0.0f) return 1.7976931348623157e308;
  return (double)f;
}

// Exclusive prefix sum over the block (block 1024); wsum is 32 words of shared memory
__device__ unsigned block_exclusive_scan(unsigned v, unsigned* wsum) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  unsigned x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) wsum[w] = x;
  __syncthreads();
  if (w == 0) {
    unsigned t = lane < (int)(blockDim.x >> 5) ? wsum[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned y = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += y;
    }
    wsum[lane] = t;
  }
  __syncthreads();
  return x - v + (w ? wsum[w - 1] : 0u);
}

// Element j of a selection's input: its order key and token id; false where it is padding.
struct LogitSrc {  // a chunk of a logits row
  const float* l;
  int base;
  __device__ __forceinline__ bool get(int j, unsigned& key, int& id) const {
    key = order_key(l[j]); id = base + j; return true;
  }
};
struct CandSrc {  // the chunks' candidates: id V or more is padding
  const unsigned* keys;
  const int* ids;
  int V;
  __device__ __forceinline__ bool get(int j, unsigned& key, int& id) const {
    id = ids[j]; key = keys[j]; return id < V;
  }
};

// The k largest of n elements (key descending, ties by the lower id, as the CPU's stable sort), sorted, into
// sk / si [k]: a radix select of the k-th largest key, most significant digit first (per-warp histograms),
// then every key above it and the first `need` equal to it in element order, which is id order among equal
// keys. Block 1024; every thread returns after the block's last sync.
template <class Src>
__device__ void top_k_sorted(const Src& src, int n, int k, unsigned* sk, int* si) {
  __shared__ unsigned whist[32][256];
  __shared__ unsigned hist[256];
  __shared__ unsigned wsum[32];
  __shared__ unsigned s_prefix, s_need;
  __shared__ int s_n;
  __shared__ unsigned ck[SAMPLE_KMAX];
  __shared__ int ci[SAMPLE_KMAX];
  unsigned prefix = 0u, mask = 0u, need = (unsigned)k;
  unsigned* mine = whist[threadIdx.x >> 5];
  const int lane = threadIdx.x & 31;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 32 * 256; i += blockDim.x) (&whist[0][0])[i] = 0u;
    __syncthreads();
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {  // whole warps step together: the match below needs them
      const int i = i0 + threadIdx.x;
      unsigned key = 0u; int id = 0;
      const bool counted = i < n && src.get(i, key, id) && (key & mask) == prefix;
      const unsigned active = __ballot_sync(0xffffffffu, counted);
      if (counted) {  // one leader per distinct digit adds its peers' count: no atomics, no conflicts
        const unsigned bin = (key >> shift) & 255u;
        const unsigned peers = __match_any_sync(active, bin);
        if (lane == __ffs(peers) - 1) mine[bin] += __popc(peers);
      }
    }
    __syncthreads();
    if (threadIdx.x < 256) {
      unsigned t = 0u;
      for (int w = 0; w < 32; ++w) t += whist[w][threadIdx.x];
      hist[threadIdx.x] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned cum = 0u; int dg = 255;
      for (; dg > 0; --dg) {
        if (cum + hist[dg] >= need) break;
        cum += hist[dg];
      }
      s_prefix = prefix | ((unsigned)dg << shift);
      s_need = need - cum;
      s_n = 0;
    }
    __syncthreads();
    prefix = s_prefix; need = s_need; mask |= 255u << shift;
  }
  // every key above the k-th, and the first `need` equal to it (each thread owns a contiguous range)
  const int per = (n + (int)blockDim.x - 1) / (int)blockDim.x;
  const int lo = min(n, (int)threadIdx.x * per), hi = min(n, lo + per);
  unsigned ties = 0u;
  for (int i = lo; i < hi; ++i) { unsigned key; int id; ties += src.get(i, key, id) && key == prefix; }
  unsigned rank = block_exclusive_scan(ties, wsum);
  for (int i = lo; i < hi; ++i) {
    unsigned key; int id;
    if (!src.get(i, key, id)) continue;
    bool take = key > prefix;
    if (key == prefix) { take = rank < need; ++rank; }
    if (take) { const int at = atomicAdd(&s_n, 1); ck[at] = key; ci[at] = id; }
  }
  __syncthreads();
  if ((int)threadIdx.x < k) {  // sorted by key, descending, ties by id
    const unsigned key = ck[threadIdx.x];
    const int id = ci[threadIdx.x];
    int r = 0;
    for (int j = 0; j < k; ++j) r += ck[j] > key || (ck[j] == key && ci[j] < id);
    sk[r] = key; si[r] = id;
  }
  __syncthreads();
}

// The draw's first stage: each chunk of a row's logits gives its own top k (k from the draw row), sorted, to
// cands [B, SAMPLE_CHUNKS * k] (keys, ids; id V pads a chunk of fewer than k tokens). The row's top k are the
// top k of these, and a chunk is 1/SAMPLE_CHUNKS of the row: one block scanning all 151,936 logits four
// times was most of the draw's cost. grid (SAMPLE_CHUNKS, B), block 1024; greedy rows do nothing
__global__ void __launch_bounds__(1024) sample_chunks(const float* __restrict__ logits, int V,
                                                      const double* __restrict__ draws,
                                                      unsigned* __restrict__ cand_keys,
                                                      int* __restrict__ cand_ids) {
  __shared__ unsigned sk[SAMPLE_KMAX];
  __shared__ int si[SAMPLE_KMAX];
  const int row = blockIdx.y, chunk = blockIdx.x;
  const double* d = draws + (i64)row * 8;
  int k = (int)d[1];
  if (d[0] == 0.0 || k <= 0) return;
  k = min(min(k, V), SAMPLE_KMAX);
  const int size = (V + SAMPLE_CHUNKS - 1) / SAMPLE_CHUNKS;
  const int lo = min(V, chunk * size), n = min(V, lo + size) - lo, kc = min(k, n);
  if (kc > 0) top_k_sorted(LogitSrc{logits + (i64)row * V + lo, lo}, n, kc, sk, si);
  const i64 at = (i64)row * SAMPLE_CHUNKS * SAMPLE_KMAX + (i64)chunk * k;
  for (int r = threadIdx.x; r < k; r += blockDim.x) {
    cand_keys[at + r] = r < kc ? sk[r] : 0u;
    cand_ids[at + r] = r < kc ? si[r] : V;
  }
}

// One token per row from logits [B, V], draw rows [B, 8] (temperature, top_k, top_p, min_p, u) and
// sample_chunks' candidates; the token goes to tab[b * tab_stride + 4] (the next step's input) and
// chosen[b]. grid B, block 1024
__global__ void __launch_bounds__(1024) sample_rows(const float* __restrict__ logits, int V,
                                                    const double* __restrict__ draws,
                                                    const unsigned* __restrict__ cand_keys,
                                                    const int* __restrict__ cand_ids, i64* __restrict__ tab,
                                                    int tab_stride, i64* __restrict__ chosen) {
  __shared__ unsigned sk[SAMPLE_KMAX];
  __shared__ int si[SAMPLE_KMAX];
  __shared__ double sp[SAMPLE_KMAX];
  const float* l = logits + (i64)blockIdx.x * V;
  const double* d = draws + (i64)blockIdx.x * 8;
  const double temp = d[0];
  int k = (int)d[1];
  int token = 0;
  if (temp == 0.0 || k <= 0) {
    token = block_argmax(l, V);
  } else {
    k = min(min(k, V), SAMPLE_KMAX);
    const i64 at = (i64)blockIdx.x * SAMPLE_CHUNKS * SAMPLE_KMAX;
    top_k_sorted(CandSrc{cand_keys + at, cand_ids + at, V}, SAMPLE_CHUNKS * k, k, sk, si);
    if (threadIdx.x == 0) {  // strata.sampling.sampler.candidates and the draw, in float64 and in its order
      const double top = as_finite(l[si[0]]);
      double tot = 0.0;
      for (int i = 0; i < k; ++i) { sp[i] = exp((as_finite(l[si[i]]) - top) / temp); tot += sp[i]; }
      for (int i = 0; i < k; ++i) sp[i] /= tot;
      int n = k;
      if (d[2] < 1.0) {
        double c = 0.0;
        for (int i = 0; i < n; ++i) { c += sp[i]; if (c >= d[2]) { n = i + 1; break; } }
      }
      if (d[3] > 0.0) {
        const double thr = d[3] * sp[0];
        int m = 0;
        for (int i = 0; i < n; ++i) m += sp[i] >= thr;
        n = m;
      }
      double s = 0.0;
      for (int i = 0; i < n; ++i) s += sp[i];
      double c = 0.0;
      for (int i = 0; i < n; ++i) c += sp[i] / s;
      const double target = d[4] * c;
      int pick = n - 1;
      c = 0.0;
      for (int i = 0; i < n; ++i) { c += sp[i] / s; if (c > target) { pick = i; break; } }
      token = si[pick];
    }
  }
  if (threadIdx.x == 0) {
    tab[(i64)blockIdx.x * tab_stride + 4] = token;
    chosen[blockIdx.x] = token;
  }
}

// After a graph step: each slot's next input is the token just chosen, one position later
__global__ void advance(i64* __restrict__ tab, int stride, int B) {
  const int b = threadIdx.x;
  if (b < B) { tab[b * stride + 3] += 1; }
}
"""
)


def ref_argmax(logits: np.ndarray) -> np.ndarray:
    return np.argmax(logits, axis=-1)


def _order_key(f: np.ndarray) -> np.ndarray:
    u = f.astype(np.float32).view(np.uint32)
    key = np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000))
    return np.where(np.isnan(f), np.uint32(0), key)


def _as_finite(f: np.ndarray) -> np.ndarray:
    return np.nan_to_num(f.astype(np.float64), nan=-np.inf, posinf=np.finfo(np.float64).max, neginf=-np.inf)


def _top_k(row: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest logits by order key, ties by the lower id (the kernels' order)."""
    return np.lexsort((np.arange(row.size), -_order_key(row).astype(np.int64)))[:k]


def ref_sample_chunks(logits: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sample_chunks on the host: each row's candidates [B, SAMPLE_CHUNKS * k] (order keys, ids; id V pads a
    chunk of fewer than k tokens), k from the row's draw row; greedy rows get none (id V throughout)."""
    b, v = logits.shape
    ks = [min(int(d[1]), v, DEVICE_TOP_K) if d[0] != 0.0 and d[1] > 0 else 0 for d in draws]
    width = SAMPLE_CHUNKS * max(ks + [1])
    keys, ids = np.zeros((b, width), np.uint32), np.full((b, width), v, np.int32)
    size = -(-v // SAMPLE_CHUNKS)
    for r, (row, k) in enumerate(zip(logits, ks)):
        for c in range(SAMPLE_CHUNKS if k else 0):
            lo = min(v, c * size)
            top = lo + _top_k(row[lo : min(v, lo + size)], k)
            ids[r, c * k : c * k + len(top)] = top
            keys[r, c * k : c * k + len(top)] = _order_key(row[top])
    return keys, ids


def ref_sample_rows(logits: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """sample_rows on the host: logits [B, V] float32, draw rows [B, 8] -> tokens [B]."""
    out = np.empty(len(logits), np.int64)
    for b, (row, d) in enumerate(zip(logits, draws)):
        temp, k = float(d[0]), int(d[1])
        if temp == 0.0 or k <= 0:
            out[b] = int(np.argmax(np.where(np.isnan(row), -np.inf, row)))  # NaN is masked, never the max
            continue
        k = min(k, row.size, DEVICE_TOP_K)
        ids = _top_k(row, k)
        z = _as_finite(row[ids])
        sp = np.exp((z - z[0]) / temp)
        sp = sp / np.cumsum(sp)[-1]  # sequential sums, as the kernel's one thread
        n = k
        if d[2] < 1.0:
            reach = np.flatnonzero(np.cumsum(sp) >= d[2])
            n = int(reach[0]) + 1 if reach.size else n
        if d[3] > 0.0:
            n = int(np.count_nonzero(sp[:n] >= d[3] * sp[0]))
        q = sp[:n] / np.cumsum(sp[:n])[-1]
        cdf = np.cumsum(q)
        above = np.flatnonzero(cdf > d[4] * cdf[-1])
        out[b] = ids[int(above[0]) if above.size else n - 1]
    return out


def ref_advance(tab: np.ndarray, n: int) -> np.ndarray:
    """advance on the host: a copy of the table [rows, TAB] int64 with slots :n one position later."""
    out = tab.copy()
    out[:n, POSITION] += 1
    return out

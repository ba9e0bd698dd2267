"""Kernels of the expert tiers: hit counting inside the decode graph, and the gather that stages a
prefill chunk's missing experts into borrowed slots.

- `tier_count`: after a MoE layer's routing, per routed (row, slot) pair: one lookup, a hit when the
  cache's `where[e] >= 0`, else the expert's bytes as read over PCIe; summed per row (atomics), so
  the host can give each sequence of a batch its own counters.
- `gather_rows`: copies n (source, destination, bytes) rows, one block a row, 16 bytes a load.
  Sources are pinned host memory read zero-copy, so one launch moves a whole layer's staged experts
  on a side stream (one copy call per expert part would cost more host time than the chunk's GEMMs).

Numpy twins: `ref_tier_count`, `ref_gather_rows`.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels.common import HEADER

SOURCE = (
    HEADER
    + r"""
typedef unsigned long long u64;

// counts [rows, 3] += (lookups, hits, miss bytes) of ids [P] (A per row) against where [E]
__global__ void tier_count(const int* __restrict__ ids, int P, int A, const int* __restrict__ where,
                           i64 expert_bytes, u64* __restrict__ counts) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= P) return;
  u64* c = counts + (i64)(p / A) * 3;
  atomicAdd(c, 1ull);
  if (where[ids[p]] >= 0) atomicAdd(c + 1, 1ull);
  else atomicAdd(c + 2, (u64)expert_bytes);
}

// dst[i][0 .. bytes[i]) = src[i][0 .. bytes[i]) for row i = blockIdx.y; blocks along x split the row.
// Four 16-byte loads in flight per thread before their stores: a read of pinned host memory takes
// microseconds, so one load at a time would leave PCIe idle.
__global__ void __launch_bounds__(256) gather_rows(const i64* __restrict__ src, const i64* __restrict__ dst,
                                                   const i64* __restrict__ nbytes) {
  const u8* s = (const u8*)src[blockIdx.y];
  u8* d = (u8*)dst[blockIdx.y];
  const i64 n = nbytes[blockIdx.y], n16 = n >> 4;
  const uint4* s4 = (const uint4*)s;
  uint4* d4 = (uint4*)d;
  const i64 step = (i64)gridDim.x * blockDim.x;
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * step < n16; i += 4 * step) {
    const uint4 a = s4[i], b = s4[i + step], c = s4[i + 2 * step], e = s4[i + 3 * step];
    d4[i] = a; d4[i + step] = b; d4[i + 2 * step] = c; d4[i + 3 * step] = e;
  }
  for (; i < n16; i += step) d4[i] = s4[i];
  if (blockIdx.x == 0)
    for (i64 k = (n16 << 4) + threadIdx.x; k < n; k += blockDim.x) d[k] = s[k];
}
"""
)

NAMES = ["tier_count", "gather_rows"]


def ref_tier_count(ids: np.ndarray, a: int, where: np.ndarray, expert_bytes: int, rows: int) -> np.ndarray:
    """What `tier_count` adds: [rows, 3] uint64 of (lookups, hits, miss bytes) for ids [P]."""
    out = np.zeros((rows, 3), np.int64)
    hit = where[ids] >= 0
    for p, h in enumerate(hit):
        out[p // a] += (1, int(h), 0 if h else expert_bytes)
    return out.astype(np.uint64)


def ref_gather_rows(memory: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """`gather_rows` on offsets into one byte array (the twin's stand-in for addresses)."""
    out = memory.copy()
    for s, d, n in zip(src, dst, nbytes):
        out[d : d + n] = memory[s : s + n]
    return out

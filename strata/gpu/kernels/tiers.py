"""Kernels of the expert tiers: hit counting inside the decode graph, and the gather that stages a
prefill chunk's missing experts into borrowed slots.

- `tier_count`: after a MoE layer's routing (raising the lookahead's stop), per routed (row, slot)
  pair: one lookup, a hit when the cache's `where[e] >= 0`, else the expert's bytes as read over PCIe;
  summed per row (atomics), so the host can give each sequence of a batch its own counters. It also copies
  the ids into the layer's row of `route` (hits marked), which the cache policy (tiers/policy.py) learns from
  between windows.
  `where[e] == -2` marks the CPU's share: neither a hit nor PCIe bytes (the CPU pool counts its own);
  `where[e] <= -3` a rider (tiers/ride.py): read over PCIe like any miss.
- `admit`: after tier_count (and the CPU share's publish), the riders a decode layer routes are copied from
  the arena into their slots as they are read, and their table entries flipped to the slots: admission by the
  miss's own read.
- `gather_rows`: copies n (source, destination, bytes) rows, one block a row, 16 bytes a load.
  Sources are pinned host memory read zero-copy, so one launch moves a whole layer's staged experts
  on a side stream (one copy call per expert part would cost more host time than the chunk's GEMMs).
- `cpu_publish` / `cpu_collect`: the decode graph's side of the CPU share (kernels/share.py, compiled
  here).
- `prefetch` / `prefetch_restore`: lookahead prefetch (strata/gpu/lookahead.py). Prefetch picks a decode
  layer's first K predicted misses and copies their parts, best first, from the arena into K staging slots
  until the main stream raises `stop`, pointing the decode table's entry of each part that lands at its copy;
  restore, after the layer's experts ran, points them back and counts how many landed parts the router used.

Numpy twins: `ref_tier_count`, `ref_admit`, `ref_gather_rows`, `ref_prefetch_pick`, `ref_prefetch_restore`.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels import share as ks
from strata.gpu.kernels.common import HEADER
from strata.tiers.lookahead import PREFETCH_MAX

ROUTE_HIT = 1 << 30  # tier_count's mark on a routed id that hit (expert ids stay below it)
# blocks of `admit`: each keeps 16 KB of pinned reads in flight; 32 of them (~512 KB) cover the link's
# bandwidth-latency product, and with no rider routed each only scans the layer's routed ids
ADMIT_BLOCKS = 32

SOURCE = (
    HEADER
    + f"#define PF_MAX_K {PREFETCH_MAX}\n#define ROUTE_HIT {ROUTE_HIT}\n"
    + r"""
typedef unsigned long long u64;

// The block copies 16-byte units [i0, min(hi, i0 + 4 * blockDim.x)) of s4 to d4, four reads in flight a
// thread before their stores, as gather_rows: a read of pinned host memory takes microseconds.
__device__ __forceinline__ void copy_16x4(const uint4* s4, uint4* d4, i64 i0, i64 hi) {
  uint4 v[4];
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const i64 i = i0 + u * blockDim.x + threadIdx.x;
    if (i < hi) v[u] = s4[i];
  }
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const i64 i = i0 + u * blockDim.x + threadIdx.x;
    if (i < hi) d4[i] = v[u];
  }
}

// counts [rows, 3] += (lookups, hits, miss bytes) of ids [P] (A per row) against where [E] (a rider, -3 -
// slot, is still read over PCIe); route[p] = ids[p] | ROUTE_HIT on a hit, so the host counts each layer's
// hits as the device did; stop != null: *stop = 1 (the layer's lookahead branch stops copying: the routing is
// known)
__global__ void tier_count(const int* __restrict__ ids, int P, int A, const int* __restrict__ where,
                           i64 expert_bytes, u64* __restrict__ counts, int* __restrict__ route, int* stop) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p == 0 && stop != nullptr) *stop = 1;
  if (p >= P) return;
  u64* c = counts + (i64)(p / A) * 3;
  atomicAdd(c, 1ull);
  const int id = ids[p];
  const int w = where[id];
  route[p] = w >= 0 ? id | ROUTE_HIT : id;
  if (w >= 0) atomicAdd(c + 1, 1ull);
  else if (w != -2) atomicAdd(c + 2, (u64)expert_bytes);
}

// Admission riding a miss (tiers/ride.py). A rider waits in `where` as -3 - slot, the decode table (tab [3 *
// E], the layer's rows) still reading it from the arena. For each rider this pass routes (ids [P], first pair
// of each), every block copies its slice of each part (nb0..nb2 bytes) from the arena to the slot (pend [3 *
// E]): the bytes cross PCIe once, as the miss they are, and the layer's experts then read them from VRAM. The
// block that completes a rider's last slice (arrive [E] counts them, and is reset) points its table entries
// at the slot and its `where` at the slot: later passes count it a hit. Runs after tier_count (which counted
// this read as the miss it is) and cpu_publish (which leaves riders to the GPU), so the CPU's share of the
// layer runs beside these reads.
__global__ void __launch_bounds__(256) admit(const int* __restrict__ ids, int P, int* where, i64* tab,
                                             const i64* __restrict__ pend, int E, i64 nb0, i64 nb1, i64 nb2,
                                             int* arrive) {
  const int nblk = gridDim.x, b = blockIdx.x;
  for (int p = 0; p < P; p++) {
    const int e = ids[p];
    // read before this block arrives for e (the flip below waits for every block's arrival); a later pair of
    // the same expert sees either the flip or, through the scan, that an earlier pair took it
    const int w = __ldcg(where + e);
    if (w > -3) continue;
    bool dup = false;
    for (int q = 0; q < p && !dup; q++) dup = ids[q] == e;
    if (dup) continue;
    for (int j = 0; j < 3; j++) {
      const i64 nb = j == 0 ? nb0 : j == 1 ? nb1 : nb2, n16 = nb >> 4, per = (n16 + nblk - 1) / nblk;
      const i64 lo = min(n16, b * per), hi = min(n16, lo + per);
      const u8* src = (const u8*)tab[(i64)j * E + e];
      u8* dst = (u8*)pend[(i64)j * E + e];
      const uint4* s4 = (const uint4*)src;
      uint4* d4 = (uint4*)dst;
      for (i64 i0 = lo; i0 < hi; i0 += 4 * blockDim.x) copy_16x4(s4, d4, i0, hi);
      if (b == nblk - 1)
        for (i64 q = (n16 << 4) + threadIdx.x; q < nb; q += blockDim.x) dst[q] = src[q];
    }
    __threadfence();  // this block's slices are visible before the table can point at them
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(arrive + e, 1) == nblk - 1) {
      __threadfence();
      arrive[e] = 0;
      for (int j = 0; j < 3; j++) tab[(i64)j * E + e] = pend[(i64)j * E + e];
      where[e] = -3 - w;
    }
  }
}

SHARE_KERNELS
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

// Lookahead prefetch of a decode layer (strata/gpu/lookahead.py), beside its mixer. Grid (blocks): every
// block picks the same K experts: the first distinct predicted ids (pred [n * A], each row's in descending
// weight, taken rank by rank across the rows) that the decode table reads over PCIe (where == -1). Then the
// blocks copy the picks' parts in that order, best pick first and gate, up, down within it, each block a
// slice of the part, from the arena into staging slot k (stage_j + k * stride_j). The block that completes a
// part's last slice (landed [3K] counts them) points the part's table entry (tab [3 * E], the layer's rows)
// at the copy, keeping the arena's address in saved [3K]: a part is the unit that lands, so a mixer too short
// for a whole expert still moves its gate and up ahead. The main stream raises *stop once its router has run:
// every block then abandons what it copies, so the link is the experts' again; a part that did not land is
// read zero-copy as before. An entry that flips while the experts' kernel reads the table gives it one of two
// copies of the same bytes.
// stats[4] += bytes copied (landed or not), stats[5] += ns block 0 ran.
__global__ void __launch_bounds__(256) prefetch(const int* __restrict__ pred, int n, int A,
                                                const int* __restrict__ where, i64* tab, int E, int K,
                                                i64 st0, i64 st1, i64 st2, i64 sd0, i64 sd1, i64 sd2,
                                                i64 nb0, i64 nb1, i64 nb2, int* __restrict__ picked,
                                                i64* __restrict__ saved, int* __restrict__ landed,
                                                volatile const int* stop, u64* __restrict__ stats) {
  __shared__ int pick[PF_MAX_K];
  __shared__ int halt, last;
  u64 t0 = 0;
  if (threadIdx.x == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    int m = 0;
    for (int r = 0; r < A && m < K; r++)
      for (int t = 0; t < n && m < K; t++) {
        const int e = pred[t * A + r];
        bool dup = where[e] != -1;
        for (int q = 0; q < m && !dup; q++) dup = pick[q] == e;
        if (!dup) pick[m++] = e;
      }
    for (int q = m; q < K; q++) pick[q] = -1;
  }
  const int nblk = gridDim.x, b = blockIdx.x;
  u64 copied = 0;
  for (int c = 0; c < 3 * K; c++) {
    __syncthreads();
    const int k = c / 3, j = c % 3, e = pick[k];
    if (e < 0) break;
    // picked[k] is seen before this block reads stop: a pick made after the router never lands, and
    // cpu_publish, which runs after the router, leaves the picks made before it to the lookahead
    if (b == 0 && threadIdx.x == 0 && j == 0) {
      picked[k] = e;
      __threadfence();
    }
    const i64 nb = j == 0 ? nb0 : j == 1 ? nb1 : nb2, n16 = nb >> 4, per = (n16 + nblk - 1) / nblk;
    const i64 lo = min(n16, b * per), hi = min(n16, lo + per);
    const u8* src = (const u8*)tab[(i64)j * E + e];
    u8* dst = (u8*)((j == 0 ? st0 : j == 1 ? st1 : st2) + k * (j == 0 ? sd0 : j == 1 ? sd1 : sd2));
    const uint4* s4 = (const uint4*)src;
    uint4* d4 = (uint4*)dst;
    for (i64 i0 = lo; i0 < hi; i0 += 4 * blockDim.x) {
      if (threadIdx.x == 0) halt = *stop;
      __syncthreads();
      if (halt) { c = 3 * K; break; }
      copy_16x4(s4, d4, i0, hi);
      copied += 16 * (u64)min((i64)4 * blockDim.x, hi - i0);
      __syncthreads();  // halt is read again only after every thread used it
    }
    if (c == 3 * K) break;  // stopped
    if (b == nblk - 1)
      for (i64 q = (n16 << 4) + threadIdx.x; q < nb; q += blockDim.x) dst[q] = src[q];
    __threadfence();  // this block's slice is visible before the table can point at it
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(landed + c, 1) == nblk - 1;
    __syncthreads();
    if (last && threadIdx.x == 0) {
      __threadfence();
      saved[c] = tab[(i64)j * E + e];
      tab[(i64)j * E + e] = (i64)dst;
    }
  }
  if (threadIdx.x == 0) {
    atomicAdd(stats + 4, copied);
    if (b == 0) {
      u64 t1;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
      atomicAdd(stats + 5, t1 - t0);
    }
  }
}

// After the layer's experts ran and the prefetch branch joined (one block of >= 3K threads): each landed
// part's table entry back to the arena, stats [4] += (parts landed, parts the router used, bytes of used, of
// unused) against the routed ids [P], and picked, saved, landed and stop cleared for the next layer.
__global__ void prefetch_restore(i64* tab, int E, int K, int* __restrict__ picked, i64* __restrict__ saved,
                                 int* __restrict__ landed, int* __restrict__ stop,
                                 const int* __restrict__ ids, int P, i64 nb0, i64 nb1, i64 nb2,
                                 u64* __restrict__ stats) {
  const int c = threadIdx.x, k = c / 3, j = c % 3;
  const int e = c < 3 * K ? picked[k] : -1;
  __syncthreads();  // every thread has read its pick before the picks are cleared
  if (c == 0) *stop = 0;
  if (c < K) picked[c] = -1;
  if (c >= 3 * K) return;
  landed[c] = 0;
  const i64 was = saved[c];
  if (was == 0) return;
  saved[c] = 0;
  tab[(i64)j * E + e] = was;
  bool used = false;
  for (int p = 0; p < P; p++) used |= ids[p] == e;
  const i64 nb = j == 0 ? nb0 : j == 1 ? nb1 : nb2;
  atomicAdd(stats, 1ull);
  if (used) atomicAdd(stats + 1, 1ull);
  atomicAdd(stats + (used ? 2 : 3), (u64)nb);
}
""".replace("SHARE_KERNELS", ks.SOURCE)
)

NAMES = ["tier_count", "admit", "gather_rows", "prefetch", "prefetch_restore", *ks.NAMES]


def ref_tier_count(ids: np.ndarray, a: int, where: np.ndarray, expert_bytes: int, rows: int) -> np.ndarray:
    """What `tier_count` adds: [rows, 3] uint64 of (lookups, hits, miss bytes) for ids [P] (its `route` is
    ids, each hit's marked with ROUTE_HIT)."""
    out = np.zeros((rows, 3), np.int64)
    for p, w in enumerate(where[ids]):
        out[p // a] += (1, int(w >= 0), expert_bytes if w == -1 or w <= -3 else 0)
    return out.astype(np.uint64)


def ref_admit(
    memory: np.ndarray,
    ids: np.ndarray,
    where: np.ndarray,
    tab: np.ndarray,
    pend: np.ndarray,
    nbytes: tuple[int, int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`admit` on offsets into one byte array (the stand-in for addresses): (memory, where [E], tab [3, E])
    after every rider (where <= -3) that ids [P] route has its parts copied from tab's offsets to pend's [3,
    E] and its entries pointed at them."""
    memory, where, tab = memory.copy(), where.copy(), tab.copy()
    for e in dict.fromkeys(ids.tolist()):
        if where[e] > -3:
            continue
        for j, n in enumerate(nbytes):
            memory[pend[j, e] : pend[j, e] + n] = memory[tab[j, e] : tab[j, e] + n]
            tab[j, e] = pend[j, e]
        where[e] = -3 - where[e]
    return memory, where, tab


def ref_gather_rows(memory: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """`gather_rows` on offsets into one byte array (the twin's stand-in for addresses)."""
    out = memory.copy()
    for s, d, n in zip(src, dst, nbytes):
        out[d : d + n] = memory[s : s + n]
    return out


def ref_prefetch_pick(pred: np.ndarray, where: np.ndarray, k: int) -> np.ndarray:
    """The experts `prefetch` picks [k] (-1 pads), and stages when stop stays down: predicted ids pred [n, A]
    (each row's best first) taken rank by rank across the rows, first distinct ones that the decode table
    reads over PCIe (where == -1)."""
    out: list[int] = []
    for e in pred.T.reshape(-1).tolist():
        if len(out) == k:
            break
        if where[e] == -1 and e not in out:
            out.append(e)
    return np.array(out + [-1] * (k - len(out)), np.int32)


def ref_prefetch_restore(
    picked: np.ndarray, flipped: np.ndarray, ids: np.ndarray, part_bytes: tuple[int, int, int]
) -> np.ndarray:
    """What `prefetch_restore` adds to stats[:4]: parts landed, parts used (their expert routed in ids), bytes
    of used parts, of unused; picked [K], flipped [K, 3] bool (the parts whose copy landed)."""
    out = np.zeros(4, np.int64)
    for k, e in enumerate(picked.tolist()):
        for j in range(3):
            if e < 0 or not flipped[k, j]:
                continue
            used = bool(np.isin(e, ids))
            out += (1, int(used), part_bytes[j] if used else 0, 0 if used else part_bytes[j])
    return out.astype(np.uint64)

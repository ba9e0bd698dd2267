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
- `cpu_publish` / `cpu_collect`: the decode graph's side of the CPU share (jit/share.py is the other).
  The split is made per layer and token, on the device: publish counts the layer's distinct PCIe misses m
  and gives the CPU `take[m]` of them (tiers/share.py's table, chosen so that both sides finish together),
  plus the experts that are the CPU's in any case (`where == -2`). It points the taken experts' table
  entries at the slot of zeros, copies the normed rows, the pairs' ids (-1 for the GPU's) and weights into
  the pinned mailbox and raises its ticket; collect puts the entries back, waits (polling the mailbox over
  PCIe) until the CPU has echoed that ticket and adds the CPU's sum into x. A layer that gives the CPU
  nothing publishes nothing and its collect does not wait. One request is in flight at a time: the next
  layer publishes only after this one collected. A CPU that does not answer within `timeout_ns` sets `err`
  and every later collect of the pass skips its wait, so the host sees the error after the pass instead of
  a hung GPU.

- `prefetch` / `prefetch_restore`: lookahead prefetch (strata/gpu/lookahead.py). Prefetch picks a decode
  layer's first K predicted misses and copies their parts, best first, from the arena into K staging slots
  until the main stream raises `stop`, pointing the decode table's entry of each part that lands at its copy;
  restore, after the layer's experts ran, points them back and counts how many landed parts the router used.

Numpy twins: `ref_tier_count`, `ref_admit`, `ref_gather_rows`, `ref_cpu_pick`, `ref_cpu_publish`,
`ref_cpu_collect`, `ref_prefetch_pick`, `ref_prefetch_restore`.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels.common import HEADER
from strata.jit.share import MB_DONE, MB_LAYER, MB_REQ, MB_ROWS
from strata.tiers.lookahead import PREFETCH_MAX

SHARE_PAIRS = 256  # most routed pairs a decode pass hands the CPU share (GEMV rows x experts a token)
ROUTE_HIT = 1 << 30  # tier_count's mark on a routed id that hit (expert ids stay below it)
# blocks of `admit`: each keeps 16 KB of pinned reads in flight; 32 of them (~512 KB) cover the link's
# bandwidth-latency product, and with no rider routed each only scans the layer's routed ids
ADMIT_BLOCKS = 32

SOURCE = (
    HEADER
    + f"#define PF_MAX_K {PREFETCH_MAX}\n#define SHARE_PAIRS {SHARE_PAIRS}\n#define ROUTE_HIT {ROUTE_HIT}\n"
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

// Mailbox control words (int64, jit/share.py's MB_*): REQ, LAYER, ROWS; DONE on its own 64-byte line.
MAILBOX_WORDS

// One block (>= P threads, P = n * A <= SHARE_PAIRS). Which routed experts of this layer the CPU computes:
// the CPU's own (where == -2), and of the m distinct ones the GPU would read over PCIe (where == -1, not a
// pick of the layer's lookahead, whose copy may land into the table meanwhile) the last ones in routing
// order, as many as take[m + r] allows (at most m): the r distinct riders routed (where <= -3) are read over
// PCIe by the GPU whatever the split (admit lands them), so they count on its side. Those taken get their
// table entries (tab [3 * E], the layer's rows) pointed at the slot of zeros (z0..z2), the old ones kept in
// saved [3 * P] and their ids in took [1 + P] (took[0]: how many), and each of their pairs' PCIe bytes, which
// tier_count counted, taken back from counts [rows, 3]. The mailbox gets the pairs' ids (-1: the GPU's) and
// weights, and h [n, D]; then ctl[REQ] = ++ticket. No CPU pair at all: no request (*asked = 0), so the
// collect does not wait.
__global__ void __launch_bounds__(256) cpu_publish(const float* __restrict__ h, const int* __restrict__ ids,
                                                   const float* __restrict__ wts, int n, int A, int D,
                                                   int layer, volatile i64* ctl, float* mh, int* mids,
                                                   float* mwts, i64* ticket, const int* __restrict__ where,
                                                   i64* tab, int E, i64 z0, i64 z1, i64 z2,
                                                   const int* __restrict__ take, volatile const int* picked,
                                                   int K, i64* __restrict__ saved, int* __restrict__ took,
                                                   u64* __restrict__ counts, i64 expert_bytes, int* asked) {
  // per pair: 0 the GPU's, 1 the CPU's own, 2 a PCIe miss, 3 a rider
  __shared__ signed char kind[SHARE_PAIRS];
  __shared__ signed char last[SHARE_PAIRS];  // a PCIe miss or rider whose expert no later pair routes to
  __shared__ int sid[SHARE_PAIRS], mine[SHARE_PAIRS];  // the pairs' ids, the taken experts
  __shared__ int n_took, any;
  const int P = n * A, tid = threadIdx.x;
  if (tid == 0) any = 0;
  if (tid < P) {
    const int e = ids[tid], w = where[e];
    int k = w == -2 ? 1 : w == -1 ? 2 : w <= -3 ? 3 : 0;
    for (int q = 0; q < K && k == 2; q++)
      if (picked[q] == e) k = 0;
    kind[tid] = k;
    sid[tid] = e;
  }
  __syncthreads();
  if (tid < P) {
    const int kd = kind[tid];
    bool l = kd >= 2;
    for (int q = tid + 1; q < P && l; q++) l = !(kind[q] == kd && sid[q] == sid[tid]);
    last[tid] = l;
  }
  __syncthreads();
  if (tid == 0) {  // m distinct misses, r riders; the CPU takes the last min(take[m + r], m) misses
    int m = 0, r = 0;
    for (int p = 0; p < P; p++)
      if (last[p]) (kind[p] == 2 ? m : r) += 1;
    const int want = min(take[m + r], m);
    int t = 0;
    for (int p = P - 1; p >= 0 && t < want; p--)
      if (last[p] && kind[p] == 2) mine[t++] = sid[p];
    n_took = t;
    took[0] = t;
  }
  __syncthreads();
  const int t = n_took;
  if (tid < P) {
    const int e = sid[tid];
    bool cpu = kind[tid] == 1;
    if (kind[tid] == 2)
      for (int q = 0; q < t && !cpu; q++) cpu = mine[q] == e;
    if (cpu && kind[tid] == 2) atomicAdd(counts + (i64)(tid / A) * 3 + 2, (u64)(-expert_bytes));
    if (cpu) any = 1;
    mids[tid] = cpu ? e : -1;
    mwts[tid] = wts[tid];
  }
  for (int i = tid; i < 3 * t; i += blockDim.x) {
    const int e = mine[i / 3], j = i % 3;
    saved[i] = tab[(i64)j * E + e];
    tab[(i64)j * E + e] = j == 0 ? z0 : j == 1 ? z1 : z2;
    if (j == 0) took[1 + i / 3] = e;
  }
  __syncthreads();
  if (!any) {
    if (tid == 0) *asked = 0;
    return;
  }
  for (int i = tid; i < n * D; i += blockDim.x) mh[i] = h[i];
  __threadfence_system();  // each thread's mailbox writes reach the host before the ticket below
  __syncthreads();
  if (tid == 0) {
    *asked = 1;
    const i64 next = *ticket + 1;
    *ticket = next;
    ctl[MB_LAYER] = layer;
    ctl[MB_ROWS] = n;
    __threadfence_system();
    ctl[MB_REQ] = next;
  }
}

// Grid (n): when the publish asked, block t waits for ctl[DONE] == ticket, then x[t] += out[t]; block 0
// points the taken experts' table entries back (tab, saved, took as cpu_publish left them), wait or not.
// err != 0: the CPU missed a deadline earlier in this pass; skip.
__global__ void __launch_bounds__(256) cpu_collect(float* __restrict__ x, int D, volatile i64* ctl,
                                                   volatile const float* out, const i64* __restrict__ ticket,
                                                   int* err, i64 timeout_ns, const int* __restrict__ asked,
                                                   i64* tab, int E, const i64* __restrict__ saved,
                                                   const int* __restrict__ took) {
  __shared__ int ok;
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < 3 * took[0]; i += blockDim.x)
      tab[(i64)(i % 3) * E + took[1 + i / 3]] = saved[i];
  if (!*asked) return;
  if (threadIdx.x == 0) {
    const i64 want = *ticket;
    int good = *(volatile int*)err == 0;
    if (good) {
      i64 t0, now;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      while (ctl[MB_DONE] != want) {
        __nanosleep(200);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - t0 > timeout_ns) { atomicExch(err, 1); good = 0; break; }
      }
    }
    __threadfence_system();
    ok = good;
  }
  __syncthreads();
  if (!ok) return;
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < D; i += blockDim.x) x[(i64)t * D + i] += out[(i64)t * D + i];
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
""".replace(
        "MAILBOX_WORDS",
        "\n".join(
            f"#define {k} {v}"
            for k, v in {
                "MB_REQ": MB_REQ,
                "MB_LAYER": MB_LAYER,
                "MB_ROWS": MB_ROWS,
                "MB_DONE": MB_DONE,
            }.items()
        ),
    )
)

NAMES = ["tier_count", "admit", "gather_rows", "cpu_publish", "cpu_collect", "prefetch", "prefetch_restore"]
# what one layer's hand-off adds beyond the CPU's compute: the publish's writes and the ticket reaching the
# host, the collect's polls over PCIe seeing the answer. Measured on the H200 (80B shape, 24 GiB): a share of
# ~1% of the misses decoded at 69.2 tok/s against 72.5 without one, 14 us a layer; added to the CPU pool's
# probed fixed cost when choosing the split.
HANDOFF_S = 14e-6


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


def ref_cpu_pick(
    ids: np.ndarray, where: np.ndarray, take: np.ndarray, picked: np.ndarray | None = None
) -> tuple[np.ndarray, list[int]]:
    """What `cpu_publish` hands the CPU of routed ids [P]: the pairs' ids for the mailbox (-1: the GPU's) and
    the experts it took from the PCIe misses (their table entries point at the slot of zeros until the
    collect). The CPU's own (where == -2) always; of the m distinct PCIe misses (where == -1, not in the
    lookahead's picks) min(take[m + r], m), the last ones in routing order, r the distinct riders routed
    (where <= -3: the GPU reads them whatever the split)."""
    ids = ids.reshape(-1)
    lookahead = set() if picked is None else set(picked.tolist())
    miss = [int(e) for e in ids if where[e] == -1 and int(e) not in lookahead]
    distinct = list(dict.fromkeys(miss))
    riders = {int(e) for e in ids if where[e] <= -3}
    took = list(dict.fromkeys(reversed(miss)))[: int(take[len(distinct) + len(riders)])]
    cpu = (where[ids] == -2) | np.isin(ids, took)
    return np.where(cpu, ids, -1).astype(np.int32), took


def ref_cpu_publish(
    h: np.ndarray,
    ids: np.ndarray,
    wts: np.ndarray,
    layer: int,
    where: np.ndarray,
    take: np.ndarray,
    ctl: np.ndarray,
    mh: np.ndarray,
    mids: np.ndarray,
    mwts: np.ndarray,
    ticket: np.ndarray,
    picked: np.ndarray | None = None,
) -> list[int] | None:
    """What `cpu_publish` writes: the pairs' ids (ref_cpu_pick) and weights, and when any pair is the CPU's
    h [n, D] and the next ticket. Returns the experts taken from the PCIe misses, None when nothing was
    published (the collect then skips its wait)."""
    n = h.shape[0]
    got, took = ref_cpu_pick(ids, where, take, picked)
    mids[: got.size] = got
    mwts[: wts.size] = wts.reshape(-1)
    if (got < 0).all():
        return None
    mh[:n] = h
    ticket[0] += 1
    ctl[MB_LAYER], ctl[MB_ROWS] = layer, n
    ctl[MB_REQ] = ticket[0]
    return took


def ref_cpu_collect(x: np.ndarray, ctl: np.ndarray, out: np.ndarray, ticket: np.ndarray) -> bool:
    """What `cpu_collect` does once the CPU answered: x[:n] += out[:n]; False (x untouched) while the
    mailbox does not hold this ticket's answer."""
    if ctl[MB_DONE] != ticket[0]:
        return False
    x += out[: x.shape[0]]
    return True


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

"""Kernels of the expert tiers: hit counting inside the decode graph, and the gather that stages a
prefill chunk's missing experts into borrowed slots.

- `tier_count`: after a MoE layer's routing, per routed (row, slot) pair: one lookup, a hit when the
  cache's `where[e] >= 0`, else the expert's bytes as read over PCIe; summed per row (atomics), so
  the host can give each sequence of a batch its own counters. It also copies the ids into the layer's
  row of `route`, which the cache policy (tiers/policy.py) learns from between windows.
  `where[e] == -2` marks the CPU's share: neither a hit nor PCIe bytes (the CPU pool counts its own).
- `gather_rows`: copies n (source, destination, bytes) rows, one block a row, 16 bytes a load.
  Sources are pinned host memory read zero-copy, so one launch moves a whole layer's staged experts
  on a side stream (one copy call per expert part would cost more host time than the chunk's GEMMs).
- `cpu_publish` / `cpu_collect`: the decode graph's side of the CPU share (jit/share.py is the other).
  Publish copies a layer's normed rows, routed ids and weights into the pinned mailbox and then raises its
  ticket; collect waits (polling the mailbox over PCIe) until the CPU has echoed that ticket and adds the
  CPU's sum into x. One request is in flight at a time: the next layer publishes only after this one
  collected. A CPU that does not answer within `timeout_ns` sets `err` and every later collect of the
  pass skips its wait, so the host sees the error after the pass instead of a hung GPU.

- `prefetch` / `prefetch_restore`: lookahead prefetch (strata/gpu/lookahead.py). Prefetch picks a decode
  layer's first K predicted misses and copies them, best first, from the arena into K staging slots until the
  main stream raises `stop`, pointing the decode table's entries at each copy that lands; restore, after the
  layer's experts ran, points them back and counts how many of the landed picks the router chose.

Numpy twins: `ref_tier_count`, `ref_gather_rows`, `ref_cpu_publish`, `ref_cpu_collect`, `ref_prefetch_pick`,
`ref_prefetch_restore`.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels.common import HEADER
from strata.jit.share import MB_DONE, MB_LAYER, MB_REQ, MB_ROWS
from strata.tiers.lookahead import PREFETCH_MAX

SOURCE = (
    HEADER
    + f"#define PF_MAX_K {PREFETCH_MAX}\n"
    + r"""
typedef unsigned long long u64;

// counts [rows, 3] += (lookups, hits, miss bytes) of ids [P] (A per row) against where [E]; route[p] = ids[p]
__global__ void tier_count(const int* __restrict__ ids, int P, int A, const int* __restrict__ where,
                           i64 expert_bytes, u64* __restrict__ counts, int* __restrict__ route) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= P) return;
  u64* c = counts + (i64)(p / A) * 3;
  atomicAdd(c, 1ull);
  const int id = ids[p];
  route[p] = id;
  const int w = where[id];
  if (w >= 0) atomicAdd(c + 1, 1ull);
  else if (w == -1) atomicAdd(c + 2, (u64)expert_bytes);
}

// Mailbox control words (int64, jit/share.py's MB_*): REQ, LAYER, ROWS; DONE on its own 64-byte line.
MAILBOX_WORDS

// One block: h [n, D], ids / wts [n * A] into the mailbox, then ctl[REQ] = ++ticket.
__global__ void __launch_bounds__(256) cpu_publish(const float* __restrict__ h, const int* __restrict__ ids,
                                                   const float* __restrict__ wts, int n, int A, int D, int layer,
                                                   volatile i64* ctl, float* mh, int* mids, float* mwts,
                                                   i64* ticket) {
  for (int i = threadIdx.x; i < n * D; i += blockDim.x) mh[i] = h[i];
  for (int i = threadIdx.x; i < n * A; i += blockDim.x) { mids[i] = ids[i]; mwts[i] = wts[i]; }
  __threadfence_system();  // each thread's mailbox writes reach the host before the ticket below
  __syncthreads();
  if (threadIdx.x == 0) {
    const i64 t = *ticket + 1;
    *ticket = t;
    ctl[MB_LAYER] = layer;
    ctl[MB_ROWS] = n;
    __threadfence_system();
    ctl[MB_REQ] = t;
  }
}

// Grid (n): block t waits for ctl[DONE] == ticket, then x[t] += out[t]. err != 0: the CPU missed a
// deadline earlier in this pass; skip.
__global__ void __launch_bounds__(256) cpu_collect(float* __restrict__ x, int D, volatile i64* ctl,
                                                   volatile const float* out, const i64* __restrict__ ticket,
                                                   int* err, i64 timeout_ns) {
  __shared__ int ok;
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

// Lookahead prefetch of a decode layer (strata/gpu/lookahead.py), beside its mixer. Grid (blocks, 3): y = part j.
// Every block picks the same K experts: the first distinct predicted ids (pred [n * A], each row's in descending
// weight, taken rank by rank across the rows) that the decode table reads over PCIe (where == -1). Then, pick by
// pick, best first, the blocks copy their share of the pick's part j from the arena into staging slot k
// (stage_j + k * stride_j); the block that completes a pick's last share (landed[k] counts them) points the
// table's entries (tab [3 * E], the layer's rows) at the copies, keeping the arena's addresses in saved [3 * K]
// and the pick in picked [k]. The main stream raises *stop once its router has run: every block then abandons
// what it copies, so the link is the experts' again; a pick that did not land is read zero-copy as before. An
// entry that flips while the experts' kernel reads the table gives it one of two copies of the same bytes.
__global__ void __launch_bounds__(256) prefetch(const int* __restrict__ pred, int n, int A, const int* __restrict__ where,
                                                i64* tab, int E, int K, i64 st0, i64 st1, i64 st2, i64 sd0, i64 sd1,
                                                i64 sd2, i64 nb0, i64 nb1, i64 nb2, int* __restrict__ picked,
                                                i64* __restrict__ saved, int* __restrict__ landed,
                                                volatile const int* stop) {
  __shared__ int pick[PF_MAX_K];
  __shared__ int halt, last;
  if (threadIdx.x == 0) {
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
  const int j = blockIdx.y;
  const i64 base = j == 0 ? st0 : j == 1 ? st1 : st2, stride = j == 0 ? sd0 : j == 1 ? sd1 : sd2;
  const i64 nb = j == 0 ? nb0 : j == 1 ? nb1 : nb2, n16 = nb >> 4, step = (i64)gridDim.x * blockDim.x;
  const int shares = gridDim.x * gridDim.y;
  for (int k = 0; k < K; k++) {
    __syncthreads();
    const int e = pick[k];
    if (e < 0) return;
    const uint4* s4 = (const uint4*)tab[(i64)j * E + e];
    uint4* d4 = (uint4*)(base + k * stride);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;; i += 4 * step) {
      if (threadIdx.x == 0) halt = *stop;
      __syncthreads();
      if (halt) return;
      if (i - threadIdx.x >= n16) break;  // the block's first thread is past the end: so is every thread
      uint4 v[4];  // four reads of pinned memory in flight a thread, as gather_rows
#pragma unroll
      for (int u = 0; u < 4; u++) if (i + u * step < n16) v[u] = s4[i + u * step];
#pragma unroll
      for (int u = 0; u < 4; u++) if (i + u * step < n16) d4[i + u * step] = v[u];
      __syncthreads();  // halt is read again only after every thread used it
    }
    if (blockIdx.x == 0)
      for (i64 q = (n16 << 4) + threadIdx.x; q < nb; q += blockDim.x)
        ((u8*)(base + k * stride))[q] = ((const u8*)tab[(i64)j * E + e])[q];
    __threadfence();  // this block's share is visible before the table can point at it
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(landed + k, 1) == shares - 1;
    __syncthreads();
    if (last && threadIdx.x < 3) {
      __threadfence();
      const int p = threadIdx.x;
      const i64 at = (i64)p * E + e;
      saved[k * 3 + p] = tab[at];
      tab[at] = (p == 0 ? st0 : p == 1 ? st1 : st2) + k * (p == 0 ? sd0 : p == 1 ? sd1 : sd2);
      if (p == 0) picked[k] = e;
    }
  }
}

// After the layer's experts ran and the prefetch branch joined (one block of >= K threads): the table's entries
// back to the arena, stats [4] += (landed, used, bytes of used, bytes of unused) against the routed ids [P], and
// picked, landed and stop cleared for the next layer.
__global__ void prefetch_restore(i64* tab, int E, int K, int* __restrict__ picked, const i64* __restrict__ saved,
                                 int* __restrict__ landed, int* __restrict__ stop, const int* __restrict__ ids, int P,
                                 i64 expert_bytes, u64* __restrict__ stats) {
  const int k = threadIdx.x;
  if (k == 0) *stop = 0;
  if (k >= K) return;
  landed[k] = 0;
  const int e = picked[k];
  if (e < 0) return;
  for (int p = 0; p < 3; p++) tab[(i64)p * E + e] = saved[k * 3 + p];
  bool used = false;
  for (int p = 0; p < P; p++) used |= ids[p] == e;
  atomicAdd(stats, 1ull);
  if (used) atomicAdd(stats + 1, 1ull);
  atomicAdd(stats + (used ? 2 : 3), (u64)expert_bytes);
  picked[k] = -1;
}
""".replace("MAILBOX_WORDS", "\n".join(f"#define {k} {v}" for k, v in
                                          dict(MB_REQ=MB_REQ, MB_LAYER=MB_LAYER, MB_ROWS=MB_ROWS, MB_DONE=MB_DONE).items()))
)

NAMES = ["tier_count", "gather_rows", "cpu_publish", "cpu_collect", "prefetch", "prefetch_restore"]
# what one layer's hand-off adds beyond the CPU's compute: the publish's writes and the ticket reaching the
# host, the collect's polls over PCIe seeing the answer. Measured on the H200 (80B shape, 24 GiB): a share of
# ~1% of the misses decoded at 69.2 tok/s against 72.5 without one, 14 us a layer; added to the CPU pool's
# probed fixed cost when choosing the split.
HANDOFF_S = 14e-6


def ref_tier_count(ids: np.ndarray, a: int, where: np.ndarray, expert_bytes: int, rows: int) -> np.ndarray:
    """What `tier_count` adds: [rows, 3] uint64 of (lookups, hits, miss bytes) for ids [P] (its `route` is a
    copy of ids)."""
    out = np.zeros((rows, 3), np.int64)
    for p, w in enumerate(where[ids]):
        out[p // a] += (1, int(w >= 0), expert_bytes if w == -1 else 0)
    return out.astype(np.uint64)


def ref_cpu_publish(h: np.ndarray, ids: np.ndarray, wts: np.ndarray, layer: int, ctl: np.ndarray,
                    mh: np.ndarray, mids: np.ndarray, mwts: np.ndarray, ticket: np.ndarray) -> None:
    """What `cpu_publish` writes: h [n, D], ids / wts [n * A] into the mailbox, then the next ticket."""
    n = h.shape[0]
    mh[:n] = h
    mids[: ids.size] = ids.reshape(-1)
    mwts[: wts.size] = wts.reshape(-1)
    ticket[0] += 1
    ctl[MB_LAYER], ctl[MB_ROWS] = layer, n
    ctl[MB_REQ] = ticket[0]


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
    """The experts `prefetch` picks [k] (-1 pads), and stages when stop stays down: predicted ids pred [n, A] (each row's best first) taken rank by
    rank across the rows, first distinct ones that the decode table reads over PCIe (where == -1)."""
    out: list[int] = []
    for e in pred.T.reshape(-1).tolist():
        if len(out) == k:
            break
        if where[e] == -1 and e not in out:
            out.append(e)
    return np.array(out + [-1] * (k - len(out)), np.int32)


def ref_prefetch_restore(picked: np.ndarray, ids: np.ndarray, expert_bytes: int) -> np.ndarray:
    """What `prefetch_restore` adds to its stats [4]: staged, used (routed in ids), bytes of used, of unused."""
    staged = picked[picked >= 0]
    used = int(np.isin(staged, ids).sum())
    return np.array([len(staged), used, used * expert_bytes, (len(staged) - used) * expert_bytes], np.uint64)

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

Numpy twins: `ref_tier_count`, `ref_gather_rows`, `ref_cpu_publish`, `ref_cpu_collect`.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.kernels.common import HEADER
from strata.jit.share import MB_DONE, MB_LAYER, MB_REQ, MB_ROWS

SOURCE = (
    HEADER
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
""".replace("MAILBOX_WORDS", "\n".join(f"#define {k} {v}" for k, v in
                                          dict(MB_REQ=MB_REQ, MB_LAYER=MB_LAYER, MB_ROWS=MB_ROWS, MB_DONE=MB_DONE).items()))
)

NAMES = ["tier_count", "gather_rows", "cpu_publish", "cpu_collect"]
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

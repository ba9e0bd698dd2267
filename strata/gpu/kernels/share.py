"""Kernels of the CPU share of the decode misses: `cpu_publish` / `cpu_collect`, the decode graph's side
(jit/share.py is the other).

The split is made per layer and token, on the device: publish counts the layer's m distinct PCIe misses and
the r riders it routes (tiers/ride.py: the GPU reads those whatever the split) and gives the CPU min(take[m +
r], m) of the misses (tiers/share.py's table, chosen so that both sides finish together), plus the experts
that are the CPU's in any case (`where == -2`). It points the taken experts' table entries at the slot of
zeros, copies the normed rows, the pairs' ids (-1 for the GPU's) and weights into the pinned mailbox and
raises its ticket; collect puts the entries back, waits (polling the mailbox over PCIe) until the CPU has
echoed that ticket and adds the CPU's sum into x. A layer that gives the CPU nothing publishes nothing and its
collect does not wait. One request is in flight at a time: the next layer publishes only after this one
collected. A CPU that does not answer within `timeout_ns` sets `err` and every later collect of the pass skips
its wait, so the host sees the error after the pass instead of a hung GPU.

A fragment of kernels/tiers.py's module (compiled with it, after its header and typedefs): `SOURCE` and
`NAMES` join that module's.

Numpy twins: `ref_cpu_pick`, `ref_cpu_publish`, `ref_cpu_collect`.
"""

from __future__ import annotations

import numpy as np

from strata.jit.share import MB_DONE, MB_LAYER, MB_REQ, MB_ROWS

SHARE_PAIRS = 256  # most routed pairs a decode pass hands the CPU share (GEMV rows x experts a token)
# what one layer's hand-off adds beyond the CPU's compute: the publish's writes and the ticket reaching the
# host, the collect's polls over PCIe seeing the answer. Measured on the H200 (80B shape, 24 GiB): a share of
# ~1% of the misses decoded at 69.2 tok/s against 72.5 without one, 14 us a layer; added to the CPU pool's
# probed fixed cost when choosing the split.
HANDOFF_S = 14e-6

SOURCE = (
    f"#define SHARE_PAIRS {SHARE_PAIRS}\n"
    # the mailbox's control words (int64, jit/share.py's MB_*): REQ, LAYER, ROWS; DONE on its own 64-byte line
    + f"#define MB_REQ {MB_REQ}\n#define MB_LAYER {MB_LAYER}\n"
    + f"#define MB_ROWS {MB_ROWS}\n#define MB_DONE {MB_DONE}\n"
    + r"""
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
"""
)

NAMES = ["cpu_publish", "cpu_collect"]


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

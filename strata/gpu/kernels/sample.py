"""Token choice on the GPU: greedy argmax (a kernel, so it sits inside the decode graph) and
top-k / top-p / min-p sampling (cupy array ops, mirroring strata.sampling step for step).

Sampling keeps the CPU sampler's contract: the same logits, parameters, seed and position give the
same token. The uniform draw comes from the same counter-based Philox (`strata.sampling.uniform`)
and the candidate set, order and probabilities are computed in float64 as on the CPU, so draws
agree except where a parallel float64 sum rounds differently right at a bucket edge.

Numpy twins: `ref_argmax` (np.argmax) and `ref_sample` (strata.sampling.sample).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from strata.gpu.kernels.common import HEADER
from strata.sampling import SamplingParams, sample, uniform

if TYPE_CHECKING:
    import cupy

SOURCE = HEADER + r"""
// out[b] = argmax(logits[b]); ties to the lowest index like np.argmax; grid B, block 1024
__global__ void __launch_bounds__(1024) argmax_rows(const float* __restrict__ logits, int V, i64* __restrict__ out,
                                                    int out_stride) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  const float* l = logits + (i64)blockIdx.x * V;
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
    if (threadIdx.x == 0) out[(i64)blockIdx.x * out_stride] = idx == 0x7fffffff ? 0 : idx;
  }
}

// After a graph step: each slot's next input is the token just chosen, one position later
__global__ void advance(i64* __restrict__ tab, int stride, int B) {
  const int b = threadIdx.x;
  if (b < B) { tab[b * stride + 3] += 1; }
}
"""


def ref_argmax(logits: np.ndarray) -> np.ndarray:
    return np.argmax(logits, axis=-1)


def ref_sample(logits: np.ndarray, history: Sequence[int], p: SamplingParams, seed: int, position: int) -> int:
    return sample(logits, history, p, seed, position)


def sample_gpu(logits: cupy.ndarray, history: Sequence[int], p: SamplingParams, seed: int, position: int) -> int:
    """strata.sampling.sample on a device row of logits [vocab]; only the chosen id comes back."""
    import cupy

    return sample_with(cupy, logits, history, p, seed, position)


def sample_with(xp: Any, logits: Any, history: Sequence[int], p: SamplingParams, seed: int, position: int) -> int:
    """The sampler written once over an array module: cupy on the GPU; numpy in CI, where it must
    agree with strata.sampling.sample token for token."""
    z = _penalised(xp, logits, history, p)
    if p.greedy:
        return int(xp.argmax(z))
    z = z.astype(xp.float64) / p.temperature
    order = xp.argsort(-z, kind="stable")  # the CPU's candidate order: descending, ties by id
    if 0 < p.top_k < z.size:
        order = order[: p.top_k]
    zs = z[order]
    probs = xp.exp(zs - zs[0])
    probs /= probs.sum()
    if p.top_p < 1.0:
        keep = int(xp.searchsorted(xp.cumsum(probs), p.top_p)) + 1
        order, probs = order[:keep], probs[:keep]
    if p.min_p > 0.0:
        mask = probs >= p.min_p * probs[0]
        order, probs = order[mask], probs[mask]
    probs = probs / probs.sum()
    cdf = xp.cumsum(probs)
    i = int(xp.searchsorted(cdf, uniform(seed, position) * cdf[-1], side="right"))
    return int(order[min(i, order.size - 1)])


def _penalised(xp: Any, logits: Any, history: Sequence[int], p: SamplingParams) -> Any:
    """strata.sampling.apply_penalties over an array module (the counted ids go up as a short list)."""
    if not history or (p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0):
        return logits
    window = history[-p.repeat_last_n :] if p.repeat_last_n > 0 else history
    ids_h, n_h = np.unique(np.asarray(window, np.int64), return_counts=True)
    ids, n = xp.asarray(ids_h), xp.asarray(n_h.astype(np.float32))
    out = logits.copy()
    sel = out[ids]
    if p.repeat_penalty != 1.0:
        sel = xp.where(sel > 0, sel / p.repeat_penalty, sel * p.repeat_penalty)
    out[ids] = sel - n * p.frequency_penalty - p.presence_penalty
    return out

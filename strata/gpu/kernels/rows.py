"""Per-row kernels: RMSNorm, the q/k/v epilogue of the attention projections, and two sigmoid gates
(gated attention's output gate, the shared expert's scale).

`qkv_post` takes the fused projection output [rows, (H + 2 KV) * HD] and, one warp per (row, head):
q heads get their RMSNorm (Qwen3) and RoPE and stay fp32 for attention; k heads get the same and
land in the fp16 cache at the row's position; v heads are copied to the cache. Rotary angles are
pos * inv_freq with inv_freq computed on the host exactly as `Rope.tables` does; n_rot < HD leaves
the tail dimensions as they are (partial rotary). NEOX rotates halves, NORM adjacent pairs.

Numpy twins: `ref_rmsnorm`, `ref_qkv_post`, `ref_gate_mul`, `ref_gated_add` (built from strata.blocks norms
and rope).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.blocks.norms import rms_norm, sigmoid
from strata.blocks.rope import Rope
from strata.gpu.kernels.common import HEADER
from strata.runtime.kvcache import quantize_rows

HEAD_POST = r"""
// One warp's q/k/v epilogue for one head of a fused q|k|v row (src: its HD values): q and k (kind 0, 1)
// get RMSNorm by nw (when given) and RoPE at pos, v (kind 2) is taken as is. v[i] = dim lane + 32 i.
// xs: HD floats of shared scratch for the rotation's partner lookups.
template <int HD>
__device__ __forceinline__ void head_post(const float* __restrict__ src, int kind,
                                          const float* __restrict__ nw, float eps,
                                          const float* __restrict__ inv_freq, int n_rot, int neox,
                                          float pos_scale, i64 pos, float* xs, float* v) {
  constexpr int PER = HD >= 32 ? HD / 32 : 1;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < PER; i++) { const int d = lane + 32 * i; v[i] = d < HD ? src[d] : 0.f; }
  if (kind < 2 && nw != nullptr) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) s += v[i] * v[i];
    const float den = sqrtf(warp_sum(s) / (float)HD + eps);
#pragma unroll
    for (int i = 0; i < PER; i++) { const int d = lane + 32 * i; if (d < HD) v[i] = (v[i] / den) * nw[d]; }
  }
  if (kind < 2) {
#pragma unroll
    for (int i = 0; i < PER; i++) { const int d = lane + 32 * i; if (d < HD) xs[d] = v[i]; }
    __syncwarp();
    const float p = (float)pos / pos_scale;
    const int half = n_rot / 2;
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int d = lane + 32 * i;
      if (d >= n_rot || d >= HD) continue;
      int f, ia, ib; bool first;
      if (neox) { f = d % half; ia = f; ib = f + half; first = d < half; }
      else { f = d / 2; ia = 2 * f; ib = 2 * f + 1; first = (d & 1) == 0; }
      const float ang = p * inv_freq[f];
      const float c = cosf(ang), s = sinf(ang), a = xs[ia], b = xs[ib];
      v[i] = first ? a * c - b * s : b * c + a * s;
    }
  }
}

// int8 KV cells (strata.runtime.kvcache.quantize_rows): a warp's head row v (dim lane + 32 i) as codes [HD]
// and one scale per 32 dims (the whole head below 32), max |x| / 127, codes rint(x / scale): group i is
// element i across the lanes.
template <int HD>
__device__ __forceinline__ void store_q8(const float* v, signed char* codes, float* scales) {
  constexpr int PER = HD >= 32 ? HD / 32 : 1;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < PER; i++) {
    const int d = lane + 32 * i;
    const float s = warp_max(d < HD ? fabsf(v[i]) : 0.f) / 127.f;
    if (d < HD)
      codes[d] = s > 0.f ? (signed char)fminf(fmaxf(rintf(v[i] / s), -127.f), 127.f) : (signed char)0;
    if (lane == 0) scales[i] = s;
  }
}
"""

SOURCE = (
    HEADER
    + HEAD_POST
    + r"""
__global__ void __launch_bounds__(256) rmsnorm(const float* __restrict__ x, int ldx,
                                               const float* __restrict__ w, float eps, int D,
                                               float* __restrict__ out, int ldo) {
  __shared__ float red[32];
  const float* r = x + (i64)blockIdx.x * ldx;
  float s = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) s += r[i] * r[i];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) red[0] = sqrtf(v / (float)D + eps);
  }
  __syncthreads();
  const float den = red[0];
  for (int i = threadIdx.x; i < D; i += blockDim.x) out[(i64)blockIdx.x * ldo + i] = (r[i] / den) * w[i];
}

// Gated attention's output gate: x[row, :cols] *= sigmoid(g[row, :cols]). grid (rows), block 256
__global__ void __launch_bounds__(256) gate_mul(float* __restrict__ x, int ldx, const float* __restrict__ g,
                                                int ldg, int cols) {
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    float* p = x + (i64)blockIdx.x * ldx + i;
    *p = *p * (1.0f / (1.0f + expf(-g[(i64)blockIdx.x * ldg + i])));
  }
}

// A shared expert behind a sigmoid gate: x[row, :cols] += sigmoid(s[row]) * y[row, :cols].
// grid (rows), block 256
__global__ void __launch_bounds__(256) gated_add(float* __restrict__ x, int ldx, const float* __restrict__ y,
                                                 int ldy, const float* __restrict__ s, int cols) {
  const float gate = 1.0f / (1.0f + expf(-s[blockIdx.x]));
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    x[(i64)blockIdx.x * ldx + i] += y[(i64)blockIdx.x * ldy + i] * gate;
}

// grid (rows, H + 2*KV), block 32. Q8: the cache holds int8 codes, with their scales at table columns 7 (k)
// and 8 (v)
template <int HD, int Q8>
__global__ void __launch_bounds__(32) qkv_post(
    const float* __restrict__ qkv, int H, int KV, const float* __restrict__ qn, const float* __restrict__ kn,
    float eps, const float* __restrict__ inv_freq, int n_rot, int neox, float pos_scale,
    const i64* __restrict__ tab, int tab_stride, int layer, float* __restrict__ qout) {
  constexpr int PER = HD >= 32 ? HD / 32 : 1;
  __shared__ float xs[HD];
  const int row = blockIdx.x, hh = blockIdx.y, lane = threadIdx.x;
  const int kind = hh < H ? 0 : (hh < H + KV ? 1 : 2);  // q, k, v
  const float* src = qkv + (i64)row * (H + 2 * KV) * HD + hh * HD;
  const i64* tr = tab + (i64)row * tab_stride;
  const i64 pos = tr[3];
  float v[PER];
  head_post<HD>(src, kind, kind == 0 ? qn : kn, eps, inv_freq, n_rot, neox, pos_scale, pos, xs, v);
  if (kind == 0) {
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int d = lane + 32 * i;
      if (d < HD) qout[(i64)row * H * HD + hh * HD + d] = v[i];
    }
    return;
  }
  const int head = kind == 1 ? hh - H : hh - H - KV;
  const i64 cell = ((i64)layer * KV + head) * tr[2] + pos;
  if (Q8) {
    store_q8<HD>(v, (signed char*)tr[kind == 1 ? 0 : 1] + cell * HD,
                 (float*)tr[kind == 1 ? 7 : 8] + cell * Q8_GROUPS(HD));
    return;
  }
  u16* cache = (u16*)tr[kind == 1 ? 0 : 1] + cell * HD;
#pragma unroll
  for (int i = 0; i < PER; i++) { const int d = lane + 32 * i; if (d < HD) cache[d] = f2h(v[i]); }
}
"""
)


def qkv_post_name(hd: int, q8: bool = False) -> str:
    return f"qkv_post<{hd}, {int(q8)}>"


def ref_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return rms_norm(x, w, eps)


def ref_qkv_post(
    qkv: np.ndarray,
    n_head: int,
    n_kv: int,
    hd: int,
    rope: Rope,
    positions: np.ndarray,
    q_norm: np.ndarray | None,
    k_norm: np.ndarray | None,
    eps: float,
    q8: bool = False,
) -> tuple[np.ndarray, Any, Any]:
    """qkv [N, (H + 2KV) * hd] -> q [N, H, hd] fp32, k and v [N, KV, hd] as stored: fp16, or with q8 each a
    pair (int8 codes [N, KV, hd], scales [N, KV, groups])."""
    n = qkv.shape[0]
    q = qkv[:, : n_head * hd].reshape(n, n_head, hd)
    k = qkv[:, n_head * hd : (n_head + n_kv) * hd].reshape(n, n_kv, hd)
    v = qkv[:, (n_head + n_kv) * hd :].reshape(n, n_kv, hd)
    if q_norm is not None and k_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    cos_sin = rope.tables(positions)
    k = rope.apply(k, *cos_sin)
    if q8:
        return rope.apply(q, *cos_sin), quantize_rows(k), quantize_rows(v)
    return rope.apply(q, *cos_sin), k.astype(np.float16), v.astype(np.float16)


def ref_gate_mul(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    return x * sigmoid(g)


def ref_gated_add(x: np.ndarray, y: np.ndarray, s: np.ndarray) -> np.ndarray:
    """x [N, D] + sigmoid(s [N]) * y [N, D]."""
    return x + y * sigmoid(s)[:, None]


def inv_freq(rope: Rope) -> np.ndarray:
    """The rotary frequencies exactly as `Rope.tables` computes them (float32)."""
    half = np.arange(0, rope.n_rot, 2, dtype=np.int64).astype(np.float32) / np.float32(rope.n_rot)
    return (np.float32(1.0) / (np.float32(rope.base) ** half)).astype(np.float32)

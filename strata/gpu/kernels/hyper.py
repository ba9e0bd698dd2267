"""Qwen4-Exp on the GPU: the hyper-connection mixers (strata.blocks.hyper) and the PLE term (blocks.ple).

The residual is S streams side by side, a row [S*D]; stream k of row r is columns k*D .. k*D+D-1. The
mixers' and the PLE's projections are ordinary products (ops.matvec / ops.matmul); these kernels are the
per-row arithmetic between them:

- `hc_norm`: grouped RMSNorm, one block per (row, stream), each stream by its own RMS, times its slice of
  the full-width weight. Serves the mixers' norm and the PLE's key, query and conv norms.
- `silu_scale`: silu(x * scale) in place on the bottleneck's output (scale = 1/S).
- `hc_read`: the mixed sublayer input h [n, D] = mean over streams of sigmoid(mix) * normed; on the way,
  the injection logits [n, S] become their weights 2 sigmoid(logit / S) in place, and a [n, D] buffer the
  sublayer accumulates into is cleared, so a mixer costs no extra launches.
- `hc_inject`: streams += inject[k] * y, one thread per column reading y once for every stream.
- `ple_gate`: per (row, stream) the signed-sqrt gate of <key, query> / sqrt(D), times the value row.
- `ple_conv`: the PLE's dilated causal depthwise conv over its window (found through the row table like
  the DeltaNet state), fused with the add: streams += gated + silu(conv). Its window [(W-1)*dil, C] is the
  last (W-1)*dil conv inputs of the sequence, oldest first (PLEState.conv).

Numpy twins: `ref_hc_norm`, `ref_silu_scale`, `ref_hc_read`, `ref_hc_inject`, `ref_ple_gate`, `ref_ple_conv`
(built from strata.blocks.hyper, ple, deltanet and norms).

Legend: n = rows, S = streams (hc_count), D = hidden size, C = S*D conv channels, W = conv width.
"""

from __future__ import annotations

import numpy as np

from strata.blocks.deltanet import causal_conv1d
from strata.blocks.hyper import grouped_rms_norm, hc_inject
from strata.blocks.norms import sigmoid, silu
from strata.gpu.kernels.common import HEADER

CONV_T = 16  # tokens per ple_conv thread, at least: the launcher raises it to the window length
CONV_WIDTHS = (2, 3, 4)

SOURCE = (
    HEADER
    + r"""
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float red[32];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = warp_sum(threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

// grid (n, S), block 256: out[r, k*D ..] = x[r, k*D ..] / rms(x[r, k*D ..]) * w[k*D ..]
__global__ void __launch_bounds__(256) hc_norm(const float* __restrict__ x, const float* __restrict__ w,
                                               float eps, int S, int D, float* __restrict__ out) {
  const i64 off = ((i64)blockIdx.x * S + blockIdx.y) * D;
  const float* xr = x + off;
  const float* wk = w + (i64)blockIdx.y * D;
  float s = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) s += xr[i] * xr[i];
  const float den = sqrtf(block_sum(s) / (float)D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) out[off + i] = (xr[i] / den) * wk[i];
}

// grid (ceil(count / 256)), block 256: x[i] = silu(x[i] * scale) for the count values of x
__global__ void __launch_bounds__(256) silu_scale(float* __restrict__ x, i64 count, float scale) {
  const i64 i = (i64)blockIdx.x * 256 + threadIdx.x;
  if (i < count) x[i] = silu(x[i] * scale);
}

// grid (n, ceil(D / 256)), block 256: h[r, c] = mean_k sigmoid(mix[r, k*D + c]) * normed[r, k*D + c].
// inj (or null): the row's S injection logits, turned into 2 sigmoid(logit / S) in place by the row's first
// block. zero (or null): [n, D], cleared.
__global__ void __launch_bounds__(256) hc_read(const float* __restrict__ mix,
                                               const float* __restrict__ normed, int S, int D,
                                               float* __restrict__ h, float* __restrict__ inj,
                                               float* __restrict__ zero) {
  const int c = blockIdx.y * 256 + threadIdx.x;
  if (inj != nullptr && blockIdx.y == 0 && threadIdx.x < S) {
    float* p = inj + (i64)blockIdx.x * S + threadIdx.x;
    *p = 2.0f * sigmoid(*p / (float)S);
  }
  if (c >= D) return;
  const i64 row = (i64)blockIdx.x * S * D + c;
  float acc = 0.f;
  for (int k = 0; k < S; k++) acc += sigmoid(mix[row + (i64)k * D]) * normed[row + (i64)k * D];
  h[(i64)blockIdx.x * D + c] = acc / (float)S;
  if (zero != nullptr) zero[(i64)blockIdx.x * D + c] = 0.f;
}

// grid (n, ceil(D / 256)), block 256: streams[r, k*D + c] += inj[r, k] * y[r, c]
__global__ void __launch_bounds__(256) hc_inject(float* __restrict__ streams, const float* __restrict__ y,
                                                 const float* __restrict__ inj, int S, int D) {
  const int c = blockIdx.y * 256 + threadIdx.x;
  if (c >= D) return;
  const float v = y[(i64)blockIdx.x * D + c];
  float* row = streams + (i64)blockIdx.x * S * D + c;
  for (int k = 0; k < S; k++) row[(i64)k * D] += inj[(i64)blockIdx.x * S + k] * v;
}

// grid (n, S), block 256: g = <key, query> / sqrt(D) of stream k, g = sign(g) sqrt(max(|g|, 1e-6)),
// out[r, k*D + c] = sigmoid(g) * value[r, c]
__global__ void __launch_bounds__(256) ple_gate(const float* __restrict__ key,
                                                const float* __restrict__ query,
                                                const float* __restrict__ value, int S, int D,
                                                float* __restrict__ out) {
  const i64 off = ((i64)blockIdx.x * S + blockIdx.y) * D;
  float s = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) s += key[off + i] * query[off + i];
  const float g = block_sum(s) / sqrtf((float)D);
  const float sign = (float)((g > 0.f) - (g < 0.f));  // numpy's sign: 0 at 0
  const float gate = sigmoid(sqrtf(fmaxf(fabsf(g), 1e-6f)) * sign);
  const float* v = value + (i64)blockIdx.x * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) out[off + i] = gate * v[i];
}

// grid (ceil(C / 128), ceil(T / ct), segments), block 128. Segment z is rows z*T .. z*T+T-1 of x, gated
// and streams (rows of C); its window [P = (W-1)*dil, C] is at the float address in column tab_col of the
// table row of its first row, plus state_off floats. w: the conv kernel [C, W], tap j on the input
// (W-1-j)*dil rows back (tap W-1 on the newest). Thread (channel c, token chunk) adds gated + silu(conv) of
// tokens t0 .. t0+ct-1 into streams; x stays untouched, so chunks run in parallel. ct >= P, so only chunk 0
// reaches back into the window, and it alone writes the new one, after its reads.
template <int W>
__global__ void __launch_bounds__(128) ple_conv(const float* __restrict__ x, int C, int T, int dil, int ct,
                                                const i64* __restrict__ tab, int tab_stride, int tab_col,
                                                i64 state_off, const float* __restrict__ w,
                                                const float* __restrict__ gated,
                                                float* __restrict__ streams) {
  const int c = blockIdx.x * 128 + threadIdx.x, t0 = blockIdx.y * ct;
  if (c >= C || t0 >= T) return;
  const int P = (W - 1) * dil;
  const i64 row0 = (i64)blockIdx.z * T;
  float* st = (float*)tab[row0 * tab_stride + tab_col] + state_off;
  const float* xc = x + row0 * C + c;
  float wt[W];
#pragma unroll
  for (int j = 0; j < W; j++) wt[j] = w[(i64)c * W + j];
  const int t1 = min(T, t0 + ct);
  for (int t = t0; t < t1; t++) {
    float y = 0.f;
#pragma unroll
    for (int j = 0; j < W; j++) {
      const int u = t - (W - 1 - j) * dil;  // times -P .. -1 are rows 0 .. P-1 of the window
      y = fmaf(u >= 0 ? xc[(i64)u * C] : st[(i64)(u + P) * C + c], wt[j], y);
    }
    const i64 o = (row0 + t) * C + c;
    streams[o] += gated[o] + silu(y);
  }
  if (blockIdx.y == 0) {
    // new row j is time T-P+j: a row of x, or old row T+j > j; ascending j reads each old row before it is
    // overwritten, and no other thread touches column c of the window
    for (int j = 0; j < P; j++) {
      const int u = T - P + j;
      st[(i64)j * C + c] = u >= 0 ? xc[(i64)u * C] : st[(i64)(u + P) * C + c];
    }
  }
}
"""
)


def conv_name(width: int) -> str:
    return f"ple_conv<{width}>"


NAMES = ["hc_norm", "silu_scale", "hc_read", "hc_inject", "ple_gate"] + [conv_name(w) for w in CONV_WIDTHS]


def conv_chunk(width: int, dilation: int) -> int:
    """Tokens per ple_conv thread: at least the window, so only the first chunk reads the old window."""
    return max(CONV_T, (width - 1) * dilation)


def ref_hc_norm(x: np.ndarray, w: np.ndarray, s: int, eps: float) -> np.ndarray:
    return grouped_rms_norm(x, w, s, eps)


def ref_silu_scale(x: np.ndarray, scale: float) -> np.ndarray:
    return silu(x * np.float32(scale))


def ref_hc_read(
    mix: np.ndarray, normed: np.ndarray, s: int, inj: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """mix logits and normed streams [n, S*D] -> h [n, D], and the injection weights [n, S] from their logits
    `inj` (None without), as strata.blocks.hyper's _read and hc_mix compute them."""
    n, sd = normed.shape
    h = np.mean(sigmoid(mix).reshape(n, s, sd // s) * normed.reshape(n, s, sd // s), axis=1)  # [n, D]
    return h, None if inj is None else np.float32(2.0) * sigmoid(inj / np.float32(s))


def ref_hc_inject(streams: np.ndarray, y: np.ndarray, inj: np.ndarray) -> np.ndarray:
    return hc_inject(streams, y, inj)


def ref_ple_gate(key: np.ndarray, query: np.ndarray, value: np.ndarray, s: int) -> np.ndarray:
    """key, query [n, S*D] (normed), value [n, D] -> the gated values [n, S*D], as strata.blocks.ple.ple."""
    n, d = value.shape
    gate = np.sum(key.reshape(n, s, d) * query.reshape(n, s, d), axis=-1) / np.float32(np.sqrt(d))  # [n, S]
    gate = np.sqrt(np.maximum(np.abs(gate), np.float32(1e-6))) * np.sign(gate)
    return (sigmoid(gate)[:, :, None] * value[:, None, :]).reshape(n, s * d)


def ref_ple_conv(
    x: np.ndarray,
    gated: np.ndarray,
    streams: np.ndarray,
    windows: list[np.ndarray],
    weight: np.ndarray,
    dilation: int,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """`ple_conv` over len(windows) segments of equal length: x, gated, streams [n, C]; windows
    [(W-1)*dilation, C] each; weight [C, W]. Returns streams + gated + silu(conv) and the new windows."""
    t = x.shape[0] // len(windows)
    out, new = streams.copy(), []
    for i, window in enumerate(windows):
        rows = slice(i * t, (i + 1) * t)
        conv, after = causal_conv1d(x[rows], window, weight, dilation=dilation)  # [t, C]
        out[rows] = streams[rows] + (gated[rows] + silu(conv))
        new.append(after)
    return out, new

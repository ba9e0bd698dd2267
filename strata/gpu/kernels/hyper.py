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
- `hc_mix_in`, `hc_mix_out`: a whole mixer on decode rows in two launches (norm, down, silu, inject, up and
  read), the weights in any GPU type; longer passes take the products' GEMMs and the kernels above.
- `ple_gate`: per (row, stream) the signed-sqrt gate of <key, query> / sqrt(D), times the value row.
- `ple_conv`: the PLE's dilated causal depthwise conv over its window (found through the row table like
  the DeltaNet state), fused with the add: streams += gated + silu(conv). Its window [(W-1)*dil, C] is the
  last (W-1)*dil conv inputs of the sequence, oldest first (PLEState.conv).

Numpy twins: `ref_hc_norm`, `ref_silu_scale`, `ref_hc_read`, `ref_hc_mix`, `ref_hc_inject`, `ref_ple_gate`,
`ref_ple_conv`
(built from strata.blocks.hyper, ple, deltanet and norms).

Legend: n = rows, S = streams (hc_count), D = hidden size, C = S*D conv channels, W = conv width.
"""

from __future__ import annotations

from collections.abc import Iterable

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

// A mixer on decode rows in two launches (the products' inputs are too short for a GEMM to pay): hc_mix_in
// is hc_norm, the down and inject products, silu_scale and the injection weights of hc_read; hc_mix_out the
// up product and the rest of hc_read. The normed streams are never stored: each block recomputes the S
// per-stream RMS (hc_norm's sums, in its order), hc_mix_in leaves them in den [n, S] for hc_mix_out.
// hc_mix_in: grid (n, R + J), block 256, J = S with an inject matrix (0 without). Block (r, j < R) writes
// low[r, j] = silu(<normed_r, down_j> * scale); block (r, R + k) writes inj[r, k] = 2 sigmoid(<normed_r,
// inject_k> / S). Weight rows in any GPU type (Q<QT>::deq8 chunks of 8 over the S*D columns).
template <int QD, int QI>
__global__ void __launch_bounds__(256) hc_mix_in(const float* __restrict__ x, const float* __restrict__ w,
                                                 float eps, int S, int D, const u8* __restrict__ down,
                                                 i64 down_row_bytes, int R, const u8* __restrict__ inject,
                                                 i64 inject_row_bytes, float scale, float* __restrict__ low,
                                                 float* __restrict__ inj, float* __restrict__ den_out) {
  __shared__ float den[8];
  const int r = blockIdx.x, j = blockIdx.y;
  const float* xr = x + (i64)r * S * D;
  for (int k = 0; k < S; k++) {
    float s = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) s += xr[(i64)k * D + i] * xr[(i64)k * D + i];
    const float t = block_sum(s);
    if (threadIdx.x == 0) den[k] = sqrtf(t / (float)D + eps);
    __syncthreads();  // block_sum's scratch is reused by the next stream's sum
  }
  if (j == 0 && threadIdx.x < S) den_out[(i64)r * S + threadIdx.x] = den[threadIdx.x];
  const bool is_inj = j >= R;
  const u8* row = is_inj ? inject + (i64)(j - R) * inject_row_bytes : down + (i64)j * down_row_bytes;
  float acc = 0.f;
  for (int c = threadIdx.x; c < S * D / 8; c += blockDim.x) {
    float v[8];
    if (is_inj) Q<QI>::deq8(row, c, v); else Q<QD>::deq8(row, c, v);
    const int e0 = 8 * c;
    const float dk = den[e0 / D];
#pragma unroll
    for (int q = 0; q < 8; q++) acc += v[q] * ((xr[e0 + q] / dk) * w[e0 + q]);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    if (is_inj) inj[(i64)r * S + (j - R)] = 2.0f * sigmoid(acc / (float)S);
    else low[(i64)r * R + j] = silu(acc * scale);
  }
}

// hc_mix_out: grid (n, ceil(D / 8)), block 256: h[r, c] = mean_k sigmoid(<up_{k*D+c}, low_r>) *
// normed[r, k*D+c], the normed value rebuilt from x, w and den; zero (or null): [n, D], cleared. up rows [R]
// in any GPU type; R a multiple of 8 (the padded rank), at most 512 (the seeds' rank is 320). A warp takes
// one column c and its lanes share each up row, 8 values a lane a step, so a row is read by adjacent lanes
// (a thread a column gave the flagship's D = 2048 eight blocks, each thread reading a row of its own).
template <int QU>
__global__ void __launch_bounds__(256) hc_mix_out(const float* __restrict__ x, const float* __restrict__ w,
                                                  const float* __restrict__ den, int S, int D,
                                                  const u8* __restrict__ up, i64 up_row_bytes, int R,
                                                  const float* __restrict__ low, float* __restrict__ h,
                                                  float* __restrict__ zero) {
  __shared__ float lw[512];
  const int r = blockIdx.x, lane = threadIdx.x & 31, c = blockIdx.y * 8 + (threadIdx.x >> 5);
  for (int i = threadIdx.x; i < R; i += blockDim.x) lw[i] = low[(i64)r * R + i];
  __syncthreads();
  if (c >= D) return;
  const float* xr = x + (i64)r * S * D;
  float acc = 0.f;
  for (int k = 0; k < S; k++) {
    const i64 e = (i64)k * D + c;
    const u8* row = up + e * up_row_bytes;
    float m = 0.f;
    for (int q = lane; q < R / 8; q += 32) {
      float v[8];
      Q<QU>::deq8(row, q, v);
#pragma unroll
      for (int i = 0; i < 8; i++) m += v[i] * lw[8 * q + i];
    }
    m = warp_sum(m);
    acc += sigmoid(m) * ((xr[e] / den[(i64)r * S + k]) * w[e]);
  }
  if (lane != 0) return;
  h[(i64)r * D + c] = acc / (float)S;
  if (zero != nullptr) zero[(i64)r * D + c] = 0.f;
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


def mix_in_name(down: int, inject: int) -> str:
    return f"hc_mix_in<{down}, {inject}>"


def mix_out_name(up: int) -> str:
    return f"hc_mix_out<{up}>"


def mix_names(types: Iterable[tuple[int, int, int]]) -> list[str]:
    """The fused mixers' instances for (down, inject, up) weight types (inject: down's for the final
    mixer)."""
    t = sorted(set(types))
    return sorted({mix_in_name(d, i) for d, i, _ in t} | {mix_out_name(u) for _, _, u in t})


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


def ref_hc_mix(
    streams: np.ndarray,
    norm: np.ndarray,
    eps: float,
    s: int,
    down: np.ndarray,
    up: np.ndarray,
    inject: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """`hc_mix_in` then `hc_mix_out` (a mixer on decode rows): streams [n, S*D], the float weights down [R,
    S*D], up [S*D, R], inject [S, S*D] or None -> h [n, D] and the injection weights [n, S] (None without),
    as hc_norm, the products, silu_scale and hc_read compute them."""
    normed = ref_hc_norm(streams, norm, s, eps)
    low = ref_silu_scale(normed @ down.T, 1.0 / s)
    return ref_hc_read(low @ up.T, normed, s, None if inject is None else normed @ inject.T)


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

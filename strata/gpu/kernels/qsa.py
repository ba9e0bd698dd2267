"""QSA sparse attention (Qwen4-Exp, strata/blocks/qsa.py) on the GPU: the indexer's compressed block keys,
block scoring and exact top-k selection, and attention over the selected keys.

State: each sequence has one float32 buffer whose address is the table's column `QSA_COL`; QSA layer j's
record starts at j * stride floats (`qsa_stride`): the compressed keys of complete blocks [max_blocks, d],
then a ring of raw index keys [ratio, d], position p's at slot p % ratio (the incomplete block's keys, and
the completed one's until this pass's rows overwrite them). After row r, (pos_r + 1) // ratio blocks are
complete; positions must stay below max_blocks * ratio.

- `qsa_compress` + `qsa_ring` (two launches, in that order, so a block's mean reads ring slots before this
  pass overwrites them): a row whose position p ends a block averages the raw keys of p - ratio + 1 .. p
  (this pass's rows, found by walking back in the row's own sequence, else the ring), RMSNorms and rotates
  the mean at the block's first position (rows.py's head_post) and stores it as block (p + 1) / ratio - 1;
  then every row's raw key goes to its ring slot (the last of a sequence's rows that share a slot).
- `qsa_query`: the indexer query heads' RMSNorm and RoPE in place, a warp per (row, head).
- `qsa_score` + `qsa_pick` (kernels/qsa_select.py, compiled with this source): block scores and their exact
  top-k, each row's selected blocks ascending.
- `qsa_attend`: cells.py's `attend_keys` (a block per (head, row, split), 4 warps, a lane per
  key, online softmax, the attn_merge partials for split-K) over the key list `QsaKeys`: the selected
  blocks' positions, then the incomplete block's complete * ratio .. p. Serves prefill rows and decode rows
  alike; K/V cells (fp16, or int8 codes * scale, host cells past a --kv-resident window) read through Cells.

Numpy twins: `ref_qsa_keys` (runs blocks.qsa._compress itself), `ref_qsa_query`, `ref_qsa_mask`,
`ref_qsa_attend` (gated_attn.attend_masked); the selection's in qsa_select.py.

Legend: T = rows, B = complete blocks, Hi = indexer heads, d = indexer head dim, K = top_blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np

from strata.blocks.gated_attn import attend_masked
from strata.blocks.norms import rms_norm
from strata.blocks.qsa import QSAParams, QSAState, _compress
from strata.blocks.rope import Rope
from strata.gpu.kernels import cells, qsa_select
from strata.gpu.kernels.common import HEADER
from strata.gpu.kernels.rows import HEAD_POST
from strata.runtime.weights import WeightStore

QSA_COL = 9  # the table column holding a row's QSA state address


def qsa_stride(max_blocks: int, ratio: int, d: int) -> int:
    """Floats of one layer's record: compressed keys [max_blocks, d], then the raw-key ring [ratio, d]."""
    return max_blocks * d + ratio * d


SOURCE = (
    HEADER
    + HEAD_POST
    + cells.SOURCE
    + f"#define QSA_COL {QSA_COL}\n"
    + r"""

// ---- compressed keys ----
// grid (rows), block 32. raw [rows, D]: this pass's index-key projections, a sequence's rows contiguous at
// consecutive positions.
template <int D>
__global__ void __launch_bounds__(32) qsa_compress(
    const float* __restrict__ raw, const i64* __restrict__ tab, int tab_stride, int j, int stride, int ratio,
    const float* __restrict__ kn, float eps, const float* __restrict__ inv_freq, int n_rot, int neox,
    float pos_scale) {
  constexpr int PER = D >= 32 ? D / 32 : 1;
  __shared__ float mean[D], xs[D];
  const int row = blockIdx.x, lane = threadIdx.x;
  const i64* tr = tab + (i64)row * tab_stride;
  const i64 p = tr[3];
  if ((p + 1) % ratio != 0) return;
  float* rec = (float*)tr[QSA_COL] + (i64)j * stride;
  const float* ring = rec + stride - ratio * D;
  const i64 first = p - ratio + 1;
#pragma unroll
  for (int i = 0; i < PER; i++) {
    const int d = lane + 32 * i;
    if (d >= D) continue;
    float sum = 0.f;  // in position order, as numpy's mean over the block axis adds
    for (int k = 0; k < ratio; k++) {
      const int r = row - (ratio - 1 - k);  // position first + k is row r's, if r is of this sequence
      const i64* t2 = tab + (i64)r * tab_stride;
      const bool here = r >= 0 && t2[QSA_COL] == tr[QSA_COL] && t2[3] == first + k;
      sum += here ? raw[(i64)r * D + d] : ring[((first + k) % ratio) * D + d];
    }
    mean[d] = sum / (float)ratio;
  }
  __syncwarp();
  float v[PER];
  head_post<D>(mean, 1, kn, eps, inv_freq, n_rot, neox, pos_scale, first, xs, v);
  float* out = rec + ((p + 1) / ratio - 1) * D;
#pragma unroll
  for (int i = 0; i < PER; i++) { const int d = lane + 32 * i; if (d < D) out[d] = v[i]; }
}

// grid (rows), block 32: every row's raw key to ring slot p % ratio (after qsa_compress has read the ring).
// A row whose sequence has a row ratio positions later in this pass leaves the slot to it: blocks run in no
// set order, so two writers of one slot would race (a sequence's rows are contiguous, positions consecutive).
__global__ void __launch_bounds__(32) qsa_ring(const float* __restrict__ raw, int D,
                                               const i64* __restrict__ tab, int tab_stride, int j, int stride,
                                               int ratio) {
  const i64* tr = tab + (i64)blockIdx.x * tab_stride;
  if (blockIdx.x + ratio < gridDim.x) {
    const i64* later = tab + (i64)(blockIdx.x + ratio) * tab_stride;
    if (later[QSA_COL] == tr[QSA_COL] && later[3] == tr[3] + ratio) return;
  }
  float* slot = (float*)tr[QSA_COL] + (i64)j * stride + stride - ratio * D + (tr[3] % ratio) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) slot[d] = raw[(i64)blockIdx.x * D + d];
}

// ---- indexer queries: q [rows, Hi * D] in place; grid (rows, Hi), block 32 ----
template <int D>
__global__ void __launch_bounds__(32) qsa_query(float* __restrict__ q, int hi, const float* __restrict__ qn,
                                                float eps, const float* __restrict__ inv_freq, int n_rot,
                                                int neox, float pos_scale, const i64* __restrict__ tab,
                                                int tab_stride) {
  constexpr int PER = D >= 32 ? D / 32 : 1;
  __shared__ float xs[D];
  const int row = blockIdx.x, lane = threadIdx.x;
  float* head = q + ((i64)row * hi + blockIdx.y) * D;
  float v[PER];
  head_post<D>(head, 0, qn, eps, inv_freq, n_rot, neox, pos_scale, tab[(i64)row * tab_stride + 3], xs, v);
#pragma unroll
  for (int i = 0; i < PER; i++) { const int d = lane + 32 * i; if (d < D) head[d] = v[i]; }
}

"""
    + qsa_select.SOURCE
    + r"""
// ---- attention over the selected keys: q, out [rows, H * HD] ----
// Key i of a row's list: the nb = nsel * ratio positions of its selected blocks in order, then the
// incomplete block's from tail0 (cells.py's attend_keys runs over it; lanes share their positions).
struct QsaKeys {
  const int* sel;
  int nb, ratio, tail0;
  __device__ int pos(int i) const { return i < nb ? sel[i / ratio] * ratio + i % ratio : tail0 + i - nb; }
  __device__ int at(int, int jj, int kp) const { return __shfl_sync(0xffffffffu, kp, jj); }
};

// grid (H, rows, splits), block 128; with splits > 1, part as attn_decode's (attn_merge writes out)
template <int HD, int Q8>
__global__ void __launch_bounds__(128) qsa_attend(
    const float* __restrict__ q, const i64* __restrict__ tab, int tab_stride, int layer, int H, int KV,
    float scale, const int* __restrict__ sel, const int* __restrict__ nsel, int top, int ratio,
    float* __restrict__ out, float* __restrict__ part, int splits) {
  __shared__ float qs[HD];
  const int h = blockIdx.x, row = blockIdx.y, kvh = h / (H / KV);
  const i64* tr = tab + (i64)row * tab_stride;
  const int pos = (int)tr[3], tail0 = (pos + 1) / ratio * ratio;
  const int nb = nsel[row] * ratio, S = nb + pos - tail0 + 1;  // the keys this row sees
  int lo, hi;
  float* partial = splits > 1 ? part_of<HD>(part, H, splits) : nullptr;
  if (!split_range(S, splits, lo, hi)) { if (threadIdx.x == 0) partial[HD + 1] = 0.f; return; }
  const Cells<HD, Q8> c(tr, layer, KV, kvh);
  for (int d = threadIdx.x; d < HD; d += blockDim.x) qs[d] = q[(i64)row * H * HD + h * HD + d];
  __syncthreads();
  const QsaKeys keys{sel + (i64)row * top, nb, ratio, tail0};
  float* o = partial != nullptr ? partial : out + (i64)row * H * HD + h * HD;
  attend_keys<HD, Q8>(qs, c, keys, lo, hi, scale, o, partial != nullptr ? partial + HD : nullptr);
}
"""
)


def compress_name(d: int) -> str:
    return f"qsa_compress<{d}>"


def query_name(d: int) -> str:
    return f"qsa_query<{d}>"


def attend_name(hd: int, q8: bool = False) -> str:
    return f"qsa_attend<{hd}, {int(q8)}>"


def kernel_names(head_dims: Iterable[int]) -> list[str]:
    """Every instance for these head dims (the indexer's and attention's alike), both KV cell types."""
    dims = list(head_dims)
    return (
        ["qsa_ring"]
        + [f(d) for f in (compress_name, query_name) for d in dims]
        + qsa_select.kernel_names(dims)
        + [attend_name(d, q8) for d in dims for q8 in (False, True)]
    )


# ---- numpy twins ----
def record_views(record: np.ndarray, max_blocks: int, ratio: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """One layer's record [stride] as (compressed keys [max_blocks, d], ring [ratio, d]), views."""
    n = max_blocks * d
    return record[:n].reshape(max_blocks, d), record[n : n + ratio * d].reshape(ratio, d)


class _GivenKeys:
    """The two weight calls _compress makes, answered with the kernel's inputs (the index-key projection's
    output itself, and the key norm), so the twin runs the CPU's code unchanged."""

    def __init__(self, k_norm: np.ndarray) -> None:
        self.k_norm = k_norm

    def matmul(self, x: np.ndarray, name: str) -> np.ndarray:
        return x

    def vector(self, name: str) -> np.ndarray:
        return self.k_norm


def ref_qsa_keys(
    raw: np.ndarray,
    positions: np.ndarray,
    record: np.ndarray,
    max_blocks: int,
    ratio: int,
    k_norm: np.ndarray,
    eps: float,
    rope: Rope,
) -> np.ndarray:
    """One sequence's record of one layer after a pass of raw keys [T, d] at consecutive positions: the
    blocks they complete (blocks.qsa._compress on the state the record holds), each row's key in its ring
    slot."""
    d = raw.shape[1]
    out = record.copy()
    blocks, ring = record_views(out, max_blocks, ratio, d)
    s0 = int(positions[0])
    done = s0 // ratio
    tail = np.stack([ring[q % ratio] for q in range(done * ratio, s0)]) if s0 > done * ratio else blocks[:0]
    st = QSAState(blocks[:done].copy(), tail.copy())
    p = QSAParams(n_heads=1, head_dim=d, budget=ratio, ratio=ratio, eps=eps)
    _compress(raw, cast(WeightStore, _GivenKeys(k_norm)), 0, p, rope, rope.tables, st)
    blocks[: st.blocks.shape[0]] = st.blocks
    for r, q in enumerate(positions):
        ring[int(q) % ratio] = raw[r]
    return out


def ref_qsa_query(
    q: np.ndarray, positions: np.ndarray, q_norm: np.ndarray, eps: float, rope: Rope
) -> np.ndarray:
    """Indexer queries [T, Hi, d] normed and rotated at their positions, as qsa_select makes them."""
    return rope.apply(rms_norm(q, q_norm, eps), *rope.tables(positions))


def ref_qsa_mask(sel: np.ndarray, nsel: np.ndarray, positions: np.ndarray, ratio: int, s: int) -> np.ndarray:
    """The keys [T, S] each row attends to: its selected blocks' positions and the incomplete block's."""
    mask = np.zeros((sel.shape[0], s), dtype=bool)
    for r in range(sel.shape[0]):
        for b in sel[r, : nsel[r]]:
            mask[r, b * ratio : (b + 1) * ratio] = True
        mask[r, (positions[r] + 1) // ratio * ratio : positions[r] + 1] = True
    return mask


def ref_qsa_attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    positions: np.ndarray,
    sel: np.ndarray,
    nsel: np.ndarray,
    ratio: int,
    scale: float,
    q8: bool = False,
) -> np.ndarray:
    """q [T, H, hd] of one sequence's rows against its keys and values [S, KV, hd] as cached (fp16 or int8
    cells, cells.ref_cells), restricted to the selection: attend_masked."""
    mask = ref_qsa_mask(sel, nsel, positions, ratio, k.shape[0])
    return attend_masked(q, cells.ref_cells(k, q8), cells.ref_cells(v, q8), scale, mask)

"""Write a synthetic qwen4exp GGUF with random weights: real Qwen3.8-Flash-Next widths, few layers.

Widths follow transformers' Qwen4ExpTextConfig defaults (hidden 2048, 16 q / 2 kv heads of 256,
DeltaNet 16 k / 32 v heads of 128, hc_count 4 with rank 320, MoE experts of 512 with top-10 and a
512 shared expert, vocab 248320, PLE 3-gram with 8 heads per order). What is cut down, to keep the
file and its f32 weight cache within a laptop: the layer count, the number of experts, and the PLE
table's rows (its row width and the rows read per token are the real ones). Large matrices are F16.
Tensor names, shapes and keys are those llama.cpp's converter writes (see tests/oracle/flagship.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np

from strata.gguf.names import Keys, T, X, tensor

ARCH = "qwen4exp"


@dataclass(frozen=True)
class Synth:
    layers: int = 4  # linear, linear, linear, QSA attention
    experts: int = 64
    ple_vocab_base: int = 250_000  # rows per head ~ this; the real table is ~20M per head
    d: int = 2048
    vocab: int = 248_320
    heads: int = 16
    kv_heads: int = 2
    head_dim: int = 256
    rot: int = 64
    lin_k_heads: int = 16
    lin_v_heads: int = 32
    lin_dim: int = 128
    conv: int = 4
    hc: int = 4
    hc_rank: int = 320
    top_k: int = 10
    ffn: int = 512
    shared_ffn: int = 512
    idx_heads: int = 16
    idx_dim: int = 128
    idx_budget: int = 1024
    idx_ratio: int = 4
    ngram: int = 3
    heads_per_ngram: int = 8
    ple_kernel: int = 4
    eos: int = 248_046

    def tag(self) -> str:
        return f"L{self.layers}-E{self.experts}-P{self.ple_vocab_base}"


class _Random:
    """Random values from one pre-drawn pool (drawing 3e9 fresh normals would dominate the build)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.standard_normal(1 << 24, dtype=np.float32)

    def normal(self, shape: tuple[int, ...], scale: float, dtype: type = np.float16) -> np.ndarray:
        n = math.prod(shape)
        reps = -(-n // self.pool.size)
        start = int(self.rng.integers(0, self.pool.size))
        flat = np.tile(np.roll(self.pool, start), reps)[:n]
        return (flat * np.float32(scale)).astype(dtype).reshape(shape)


def _primes_from(start: int, count: int) -> list[int]:
    out, p = [], start - 1
    while len(out) < count:
        p += 1
        if p > 1 and all(p % f for f in range(2, math.isqrt(p) + 1)):
            out.append(p)
    return out


def write(path: Path, s: Synth, seed: int = 0) -> Path:
    """Write the synthetic model to `path` (atomically) and return it."""
    r = _Random(seed)
    w = gguf.GGUFWriter(str(path) + ".tmp", arch=ARCH)
    k = lambda suffix: f"{ARCH}.{suffix}"
    n_d, c = s.hc * s.d, 2 * s.lin_k_heads * s.lin_dim + s.lin_v_heads * s.lin_dim
    linear = [i != s.layers - 1 for i in range(s.layers)]
    for key, val in (
        (Keys.BLOCK_COUNT, s.layers),
        (Keys.CONTEXT_LENGTH, 262144),
        (Keys.EMBEDDING_LENGTH, s.d),
        (Keys.HEAD_COUNT, s.heads),
        (Keys.HEAD_COUNT_KV, s.kv_heads),
        (Keys.KEY_LENGTH, s.head_dim),
        (Keys.VALUE_LENGTH, s.head_dim),
        (Keys.ROPE_DIMENSION_COUNT, s.rot),
        (Keys.EXPERT_COUNT, s.experts),
        (Keys.EXPERT_USED_COUNT, s.top_k),
        (Keys.EXPERT_FEED_FORWARD_LENGTH, s.ffn),
        (Keys.EXPERT_SHARED_FEED_FORWARD_LENGTH, s.shared_ffn),
        (Keys.SSM_CONV_KERNEL, s.conv),
        (Keys.SSM_STATE_SIZE, s.lin_dim),
        (Keys.SSM_GROUP_COUNT, s.lin_k_heads),
        (Keys.SSM_TIME_STEP_RANK, s.lin_v_heads),
        (Keys.SSM_INNER_SIZE, s.lin_v_heads * s.lin_dim),
        (Keys.HC_COUNT, s.hc),
        (Keys.HC_LOW_RANK, s.hc_rank),
        (Keys.INDEXER_HEAD_COUNT, s.idx_heads),
        (Keys.INDEXER_KEY_LENGTH, s.idx_dim),
        (Keys.INDEXER_TOP_K, s.idx_budget),
        (Keys.PLE_NGRAM_SIZE, s.ngram),
        (Keys.PLE_HEADS_PER_NGRAM, s.heads_per_ngram),
        (Keys.PLE_CONV_KERNEL, s.ple_kernel),
        (Keys.PLE_EOS_TOKEN_ID, s.eos),
    ):
        w.add_uint32(k(key), val)
    w.add_float32(k(Keys.ROPE_FREQ_BASE), 1e7)
    w.add_float32(k(Keys.RMS_EPS), 1e-6)
    w.add_array(k(Keys.ROPE_DIMENSION_SECTIONS), [11, 11, 10, 0])
    w.add_array(k(Keys.RECURRENT_LAYERS), linear)
    w.add_array(k(Keys.COMPRESS_RATIOS), [0 if lin else s.idx_ratio for lin in linear])
    w.add_array(k(Keys.PLE_LAYERS), [0])
    n_heads = (s.ngram - 1) * s.heads_per_ngram
    vocab = _primes_from(s.ple_vocab_base, n_heads)
    u64 = gguf.GGUFValueType.UINT64
    mult = [2 * int(m) + 1 for m in r.rng.integers(1, (2**63 - 1) // s.vocab // 2, s.ngram)]
    w.add_key_value(k(Keys.PLE_LAYER_MULTIPLIERS), mult, gguf.GGUFValueType.ARRAY, sub_type=u64)
    w.add_key_value(
        k(Keys.PLE_HEAD_OFFSETS),
        [int(x) for x in np.cumsum([0, *vocab[:-1]])],
        gguf.GGUFValueType.ARRAY,
        sub_type=u64,
    )
    w.add_key_value(k(Keys.PLE_HEAD_VOCAB_SIZES), vocab, gguf.GGUFValueType.ARRAY, sub_type=u64)

    def mat(name: str, rows: int, cols: int, dtype: type = np.float16) -> None:
        w.add_tensor(name, r.normal((rows, cols), cols**-0.5, dtype))

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * r.normal((n,), 1.0, np.float32)).astype(np.float32))

    def hc(nm: X, dn: X, up: X, inj: X | None, layer: int | None) -> None:
        norm(tensor(nm, layer), n_d)
        mat(tensor(dn, layer), s.hc_rank, n_d, np.float32)
        mat(tensor(up, layer), n_d, s.hc_rank, np.float32)
        if inj is not None:
            mat(tensor(inj, layer), s.hc, n_d, np.float32)

    mat(tensor(T.TOKEN_EMBD), s.vocab, s.d)
    mat(tensor(T.OUTPUT), s.vocab, s.d)
    hc(X.HC_HEAD_NORM, X.HC_HEAD_DOWN, X.HC_HEAD_UP, None, None)
    rows_per_head = s.d // n_heads
    table_rows = -(-sum(vocab) // 128) * 128
    w.add_tensor(tensor(T.PER_LAYER_TOKEN_EMBD), r.normal((table_rows, rows_per_head), 1.0))
    for i in range(s.layers):
        hc(X.HC_ATTN_NORM, X.HC_ATTN_DOWN, X.HC_ATTN_UP, X.HC_ATTN_INJECT, i)
        hc(X.HC_FFN_NORM, X.HC_FFN_DOWN, X.HC_FFN_UP, X.HC_FFN_INJECT, i)
        mat(tensor(T.FFN_GATE_INP, i), s.experts, s.d, np.float32)
        w.add_tensor(tensor(T.FFN_GATE_EXP, i), r.normal((s.experts, s.ffn, s.d), s.d**-0.5))
        w.add_tensor(tensor(T.FFN_UP_EXP, i), r.normal((s.experts, s.ffn, s.d), s.d**-0.5))
        w.add_tensor(tensor(T.FFN_DOWN_EXP, i), r.normal((s.experts, s.d, s.ffn), s.ffn**-0.5))
        mat(tensor(T.FFN_GATE_SHEXP, i), s.shared_ffn, s.d)
        mat(tensor(T.FFN_UP_SHEXP, i), s.shared_ffn, s.d)
        mat(tensor(T.FFN_DOWN_SHEXP, i), s.d, s.shared_ffn)
        mat(tensor(T.FFN_GATE_INP_SHEXP, i), 1, s.d, np.float32)
        if linear[i]:
            v = s.lin_v_heads
            w.add_tensor(tensor(T.SSM_A, i, ""), -np.exp(r.normal((v,), 0.5, np.float32)))
            w.add_tensor(tensor(T.SSM_DT, i, "bias"), r.normal((v,), 1.0, np.float32))
            mat(tensor(T.SSM_CONV1D, i), c, s.conv, np.float32)
            mat(tensor(T.ATTN_QKV, i), c, s.d)
            mat(tensor(T.ATTN_GATE, i), v * s.lin_dim, s.d)
            mat(tensor(T.SSM_ALPHA, i), v, s.d, np.float32)
            mat(tensor(T.SSM_BETA, i), v, s.d, np.float32)
            norm(tensor(T.SSM_NORM, i), s.lin_dim)
            mat(tensor(T.SSM_OUT, i), s.d, v * s.lin_dim)
        else:
            mat(tensor(T.ATTN_Q, i), 2 * s.heads * s.head_dim, s.d)
            mat(tensor(T.ATTN_K, i), s.kv_heads * s.head_dim, s.d)
            mat(tensor(T.ATTN_V, i), s.kv_heads * s.head_dim, s.d)
            mat(tensor(T.ATTN_OUT, i), s.d, s.heads * s.head_dim)
            norm(tensor(T.ATTN_Q_NORM, i), s.head_dim)
            norm(tensor(T.ATTN_K_NORM, i), s.head_dim)
            mat(tensor(X.INDEXER_Q_PROJ, i), s.idx_heads * s.idx_dim, s.d)
            mat(tensor(X.INDEXER_K_PROJ, i), s.idx_dim, s.d)
            norm(tensor(X.INDEXER_Q_NORM, i), s.idx_dim)
            norm(tensor(X.INDEXER_K_NORM, i), s.idx_dim)
        if i == 0:  # PLE rides on the first DeltaNet layer
            mat(tensor(X.PLE_KEY, i), n_d, s.d)
            mat(tensor(X.PLE_VALUE, i), s.d, s.d)
            for nm in (X.PLE_NORM_KEY, X.PLE_NORM_QUERY, X.PLE_NORM_CONV):
                norm(tensor(nm, i), n_d)
            mat(tensor(X.PLE_CONV1D, i), n_d, s.ple_kernel, np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(path) + ".tmp", path)
    return path


def synth_path(root: Path, s: Synth) -> Path:
    """Cached synthetic file for these settings; written on first use."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"synth-qwen4exp-{s.tag()}.gguf"
    stamp = path.with_suffix(".json")
    if not (path.is_file() and stamp.is_file() and stamp.read_text() == repr(asdict(s))):
        write(path, s)
        stamp.write_text(repr(asdict(s)))
    return path

"""Write a synthetic qwen4exp (Qwen3.8-Flash-Next) GGUF with random weights at the real widths.

    python perf/synth_qwen4exp.py --preset seeds --output F     # the seeds' model, GPU bench: 44.96 GiB
    python perf/synth_qwen4exp.py --layers 4 --experts 16 --ple-base 250000 --output F    # 1.36 GiB, a check
        [--preset seeds|mid] [--quant q4_k] [--output-quant q6_k] [--tokenizer DIR] [--seed 0]

Widths follow transformers' Qwen4ExpTextConfig defaults (hidden 2048, 16 q / 2 kv heads of 256, DeltaNet
16 k / 32 v heads of 128, hc_count 4 with rank 320, MoE experts of 512 with top-10 and a 512 shared expert,
vocab 248320, PLE 3-gram with 8 heads per order; QSA indexer 16 heads of 128, budget 1024, ratio 4). Layers
are DeltaNet x3 then one QSA attention layer, repeating (Qwen3-Next's full_attention_interval 4); PLE rides on
layer 0. Tensor names, shapes and keys are those llama.cpp's converter writes (see tests/oracle/flagship.py).

`Synth()` is perf/bench_flagship.py's mid-size CPU model (through `synth_path`): F16 matrices, 4 layers,
64 experts and a 4M-row PLE table, so the file and its f32 weight cache fit a laptop. `PRESETS["seeds"]` is
the model of ../shared/seeds/: 48 layers (36 DeltaNet, 12 QSA), 48 x 512 experts, the PLE table's real row
width (160 values, 16 rows a token), quantized like llama-quantize's Q4_K_M:
- experts, attention / DeltaNet / shared-expert / PLE projections and token_embd Q4_K, output Q6_K
  (Q4_K_M also lifts some layers' attn_v and ffn_down to Q6_K; like `strata synth`, this file does not);
- the PLE table (rows of 160, not a multiple of 256) Q5_0, llama-quantize's fallback for Q4_K;
- F16, as the converter writes them: the indexer projections (llama-quantize skips "indexer.q_proj" by
  name) and the hyper-connection down / up / inject matrices (the residual streams' mixers; llama-quantize
  leaves "hc_" tensors alone for GLM5-Next, not yet for qwen4exp, and Strata reads them as float32 anyway);
- F32: norms, routers, ffn_gate_inp_shexp, conv kernels, ssm_a / dt / alpha / beta.
The seeds' file is IQ3_XXS (76.7 GB), a type Strata's GPU kernels do not read (gpu/kernels/common.py
GPU_QTYPES), so the experts are Q4_K, as in the `strata synth` files the GPU benchmarks run.

What is scaled down, to fit a 64 GiB disk beside the repo (<= ~45 GiB): only the PLE table's rows, 1/20 of
them (~1M a head, 16,001,920 rows, 1.64 GiB; the real table has ~20M a head, 320,001,536 rows: 35.2 GB as
Q5_0; the seeds' 28.8 GB is 90 bytes a row, IQ4_NL, the fallback for IQ3_XXS). The rows a token reads and
their bytes are the real ones; only the hit rate of a page cache or RAM copy of the table is higher.

Weights are random but valid blocks, written fast as strata/synth/writer.py does: the header through gguf's
GGUFWriter, then every tensor streamed with pwrite as slices of a pool of calibrated random blocks
(strata/synth/blocks.py), std 1/sqrt(columns) so activations keep their scale through the layers.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType as Q

from strata.cli.synth import ENV_FIXTURES, TOKENIZER_SUBDIR
from strata.gguf.names import Keys, T, X, tensor
from strata.synth.blocks import SUPPORTED, pool
from strata.synth.plan import FILE_TYPE, Fill, TensorSpec, dense_values, fitting_type
from strata.synth.vocab import QWEN3_CONFIG, add_qwen3_tokenizer, missing_files

# writer.py's streaming helpers (the pool slicer, preallocation, space check), shared rather than copied
from strata.synth.writer import (
    ALIGNMENT,
    HEADER_BUDGET,
    _check_space,
    _preallocate,
    _pwrite_all,
    _stream_pool,
)

ARCH = "qwen4exp"
TABLE = tensor(T.PER_LAYER_TOKEN_EMBD)
TABLE_STD = 1.0  # unit rows: the key / value projections (std 1/sqrt(P)) then give unit activations


@dataclass(frozen=True)
class Synth:
    layers: int = 4  # linear, linear, linear, QSA attention
    experts: int = 64
    ple_vocab_base: int = 250_000  # rows per head ~ this; the real table has ~20M per head
    ple_dim: int = 2048  # P, the 16 heads' rows side by side (HF ple_embed_dim; defaults to the hidden size)
    quant: Q = Q.F16  # the large matrices (the experts included); a K-quant makes a Q4_K_M-like mix
    output_quant: Q = Q.F16
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
    attn_interval: int = 4  # every 4th layer is QSA attention, the others DeltaNet
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
        return f"L{self.layers}-E{self.experts}-P{self.ple_vocab_base}-{self.quant.name.lower()}"

    def linear(self, i: int) -> bool:
        return (i + 1) % self.attn_interval != 0

    @property
    def ple_heads(self) -> int:
        return (self.ngram - 1) * self.heads_per_ngram


PRESETS: dict[str, Synth] = {
    "mid": Synth(),
    "seeds": Synth(
        layers=48,
        experts=512,
        ple_vocab_base=1_000_000,  # 20,000,000 in the real table: 1/20 keeps the file under 45 GiB
        ple_dim=2560,  # rows of 160 (the seeds' "320,001,536 行 × 160 维")
        quant=Q.Q4_K,
        output_quant=Q.Q6_K,
        eos=QWEN3_CONFIG["eos_token_id"],  # <|im_end|> of the Qwen3 tokenizer the file carries
    ),
}


def _primes_from(start: int, count: int) -> list[int]:
    out, p = [], start - 1
    while len(out) < count:
        p += 1
        if p > 1 and all(p % f for f in range(2, math.isqrt(p) + 1)):
            out.append(p)
    return out


def ple_vocab(s: Synth) -> list[int]:
    """Rows of each n-gram head's vocabulary: distinct primes from ple_vocab_base, as HF derives them."""
    return _primes_from(s.ple_vocab_base, s.ple_heads)


def _mat(name: str, *shape: int, qtype: Q) -> TensorSpec:
    """Random blocks of `qtype`, or of llama-quantize's fallback where its block does not divide a row."""
    return TensorSpec(name, shape, fitting_type(qtype, shape[-1]), Fill.WEIGHT)


def _f32(name: str, *shape: int, fill: Fill = Fill.WEIGHT) -> TensorSpec:
    return TensorSpec(name, shape, Q.F32, fill)


def _mixer(s: Synth, nm: X, dn: X, up: X, inj: X | None, layer: int | None) -> list[TensorSpec]:
    """A hyper-connection mixer: norm, low-rank down / up matrices, inject weights (in a layer)."""
    n_d = s.hc * s.d
    mats = [(dn, s.hc_rank, n_d), (up, n_d, s.hc_rank)] + ([(inj, s.hc, n_d)] if inj is not None else [])
    out = [_f32(tensor(nm, layer), n_d, fill=Fill.NORM)]
    return out + [_mat(tensor(x, layer), rows, cols, qtype=Q.F16) for x, rows, cols in mats]


def _deltanet(s: Synth, i: int) -> list[TensorSpec]:
    v, c = s.lin_v_heads, 2 * s.lin_k_heads * s.lin_dim + s.lin_v_heads * s.lin_dim
    return [
        _f32(tensor(T.SSM_A, i, ""), v, fill=Fill.SSM_A),
        _f32(tensor(T.SSM_DT, i, "bias"), v, fill=Fill.SSM_DT),
        _f32(tensor(T.SSM_CONV1D, i), c, s.conv, fill=Fill.CONV),
        _mat(tensor(T.ATTN_QKV, i), c, s.d, qtype=s.quant),
        _mat(tensor(T.ATTN_GATE, i), v * s.lin_dim, s.d, qtype=s.quant),
        _f32(tensor(T.SSM_ALPHA, i), v, s.d),
        _f32(tensor(T.SSM_BETA, i), v, s.d),
        _f32(tensor(T.SSM_NORM, i), s.lin_dim, fill=Fill.NORM),
        _mat(tensor(T.SSM_OUT, i), s.d, v * s.lin_dim, qtype=s.quant),
    ]


def _qsa(s: Synth, i: int) -> list[TensorSpec]:
    return [
        _mat(tensor(T.ATTN_Q, i), 2 * s.heads * s.head_dim, s.d, qtype=s.quant),  # [query | gate]
        _mat(tensor(T.ATTN_K, i), s.kv_heads * s.head_dim, s.d, qtype=s.quant),
        _mat(tensor(T.ATTN_V, i), s.kv_heads * s.head_dim, s.d, qtype=s.quant),
        _mat(tensor(T.ATTN_OUT, i), s.d, s.heads * s.head_dim, qtype=s.quant),
        _f32(tensor(T.ATTN_Q_NORM, i), s.head_dim, fill=Fill.NORM),
        _f32(tensor(T.ATTN_K_NORM, i), s.head_dim, fill=Fill.NORM),
        _mat(tensor(X.INDEXER_Q_PROJ, i), s.idx_heads * s.idx_dim, s.d, qtype=Q.F16),
        _mat(tensor(X.INDEXER_K_PROJ, i), s.idx_dim, s.d, qtype=Q.F16),
        _f32(tensor(X.INDEXER_Q_NORM, i), s.idx_dim, fill=Fill.NORM),
        _f32(tensor(X.INDEXER_K_NORM, i), s.idx_dim, fill=Fill.NORM),
    ]


def _ple(s: Synth, i: int) -> list[TensorSpec]:
    n_d = s.hc * s.d
    norms = (X.PLE_NORM_KEY, X.PLE_NORM_QUERY, X.PLE_NORM_CONV)
    return [
        _mat(tensor(X.PLE_KEY, i), n_d, s.ple_dim, qtype=s.quant),
        _mat(tensor(X.PLE_VALUE, i), s.d, s.ple_dim, qtype=s.quant),
        *(_f32(tensor(nm, i), n_d, fill=Fill.NORM) for nm in norms),
        _f32(tensor(X.PLE_CONV1D, i), n_d, s.ple_kernel, fill=Fill.CONV),
    ]


def plan(s: Synth) -> list[TensorSpec]:
    """Every tensor of the file, in writing order (numpy shapes: [rows, cols], experts [E, rows, cols])."""
    table_rows = -(-sum(ple_vocab(s)) // 128) * 128  # the converter's make_ngram_vocab_size_divisible_by
    out = [
        _mat(tensor(T.TOKEN_EMBD), s.vocab, s.d, qtype=s.quant),
        _mat(tensor(T.OUTPUT), s.vocab, s.d, qtype=s.output_quant),
        *_mixer(s, X.HC_HEAD_NORM, X.HC_HEAD_DOWN, X.HC_HEAD_UP, None, None),
        _mat(TABLE, table_rows, s.ple_dim // s.ple_heads, qtype=s.quant),
    ]
    for i in range(s.layers):
        out += _mixer(s, X.HC_ATTN_NORM, X.HC_ATTN_DOWN, X.HC_ATTN_UP, X.HC_ATTN_INJECT, i)
        out += _mixer(s, X.HC_FFN_NORM, X.HC_FFN_DOWN, X.HC_FFN_UP, X.HC_FFN_INJECT, i)
        out += [
            _f32(tensor(T.FFN_GATE_INP, i), s.experts, s.d),
            _mat(tensor(T.FFN_GATE_EXP, i), s.experts, s.ffn, s.d, qtype=s.quant),
            _mat(tensor(T.FFN_UP_EXP, i), s.experts, s.ffn, s.d, qtype=s.quant),
            _mat(tensor(T.FFN_DOWN_EXP, i), s.experts, s.d, s.ffn, qtype=s.quant),
            _mat(tensor(T.FFN_GATE_SHEXP, i), s.shared_ffn, s.d, qtype=s.quant),
            _mat(tensor(T.FFN_UP_SHEXP, i), s.shared_ffn, s.d, qtype=s.quant),
            _mat(tensor(T.FFN_DOWN_SHEXP, i), s.d, s.shared_ffn, qtype=s.quant),
            _f32(tensor(T.FFN_GATE_INP_SHEXP, i), 1, s.d, fill=Fill.SMALL),
        ]
        out += _deltanet(s, i) if s.linear(i) else _qsa(s, i)
        if i == 0:  # PLE rides on the first DeltaNet layer
            out += _ple(s, i)
    return out


def _metadata(w: gguf.GGUFWriter, s: Synth, rng: np.random.Generator) -> None:
    k = lambda suffix: f"{ARCH}.{suffix}"
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
    w.add_name(f"strata-synth-{ARCH}-{s.tag()}")
    w.add_file_type(FILE_TYPE[s.quant])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_embedding_length_per_layer_input(s.ple_dim // s.ple_heads)  # the converter's PLE row width
    w.add_float32(k(Keys.ROPE_FREQ_BASE), 1e7)
    w.add_float32(k(Keys.RMS_EPS), 1e-6)
    w.add_array(k(Keys.ROPE_DIMENSION_SECTIONS), [11, 11, 10, 0])
    linear = [s.linear(i) for i in range(s.layers)]
    w.add_array(k(Keys.RECURRENT_LAYERS), linear)
    w.add_array(k(Keys.COMPRESS_RATIOS), [0 if lin else s.idx_ratio for lin in linear])
    w.add_array(k(Keys.PLE_LAYERS), [0])
    vocab = ple_vocab(s)
    u64 = gguf.GGUFValueType.UINT64
    mult = [2 * int(m) + 1 for m in rng.integers(1, (2**63 - 1) // s.vocab // 2, s.ngram)]
    w.add_key_value(k(Keys.PLE_LAYER_MULTIPLIERS), mult, gguf.GGUFValueType.ARRAY, sub_type=u64)
    offsets = [int(x) for x in np.cumsum([0, *vocab[:-1]])]
    w.add_key_value(k(Keys.PLE_HEAD_OFFSETS), offsets, gguf.GGUFValueType.ARRAY, sub_type=u64)
    w.add_key_value(k(Keys.PLE_HEAD_VOCAB_SIZES), vocab, gguf.GGUFValueType.ARRAY, sub_type=u64)


def _pad(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _write_tensor(fd: int, spec: TensorSpec, pos: int, rng: np.random.Generator) -> None:
    if spec.fill is Fill.WEIGHT:
        std = TABLE_STD if spec.name == TABLE else spec.shape[-1] ** -0.5
        _stream_pool(fd, pool(spec.qtype, std), pos, spec.nbytes, rng)
    else:
        _pwrite_all(fd, dense_values(spec, rng).reshape(-1).view(np.uint8).data, pos)


def write(path: Path, s: Synth, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """Write the synthetic model to `path` (atomically) and return it; with `tokenizer_dir`, the Qwen3
    tokenizer padded to the vocabulary goes in (so `strata generate --prompt` works), else none."""
    if s.quant not in SUPPORTED or s.output_quant not in SUPPORTED:
        raise ValueError(f"no synthetic blocks for {s.quant.name} / {s.output_quant.name}")
    specs = plan(s)
    data_bytes = sum(_pad(t.nbytes) for t in specs)
    _check_space(path, data_bytes + HEADER_BUDGET)
    tmp = path.with_name(path.name + ".tmp")
    try:
        w = gguf.GGUFWriter(tmp, arch=ARCH)
        _metadata(w, s, np.random.default_rng(seed))
        if tokenizer_dir is not None:
            add_qwen3_tokenizer(w, tokenizer_dir, s.vocab)
        for t in specs:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        pos = _pad(tmp.stat().st_size)
        fd = os.open(tmp, os.O_RDWR)
        try:
            _preallocate(fd, pos + data_bytes, path)
            for i, spec in enumerate(specs):
                _write_tensor(fd, spec, pos, np.random.default_rng([seed, i]))
                pos += _pad(spec.nbytes)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
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


def _qtype(ap: argparse.ArgumentParser, flag: str, name: str) -> Q:
    q = getattr(Q, name.upper(), None)
    if q not in SUPPORTED:
        choices = ", ".join(sorted(t.name.lower() for t in SUPPORTED))
        ap.error(f"{flag} {name!r}: not a type with synthetic blocks; choose from {choices}")
    return q


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="seeds")
    ap.add_argument("--output", "-o", type=Path, required=True)
    ap.add_argument("--layers", type=int, help="layer count (the preset's otherwise)")
    ap.add_argument("--experts", type=int, help="experts per layer")
    ap.add_argument("--ple-base", type=int, help="PLE rows per n-gram head, about (real: 20,000,000)")
    ap.add_argument(
        "--ple-dim",
        type=int,
        help="the PLE heads' rows side by side (seeds: 2,560, rows of 160); llama.cpp's qwen4exp loads only "
        "the hidden size (2,048, rows of 128)",
    )
    ap.add_argument("--quant", help="the large matrices' type (seeds: q4_k)")
    ap.add_argument("--output-quant", help="output.weight's type (seeds: q6_k)")
    ap.add_argument(
        "--tokenizer", type=Path, help=f"Qwen3 tokenizer dir (${ENV_FIXTURES}/{TOKENIZER_SUBDIR})"
    )
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    s = PRESETS[a.preset]
    changes = {"layers": a.layers, "experts": a.experts, "ple_vocab_base": a.ple_base, "ple_dim": a.ple_dim}
    s = replace(s, **{key: val for key, val in changes.items() if val is not None})
    if s.experts < s.top_k:
        ap.error(f"--experts {s.experts}: a token picks {s.top_k}, so at least that many")
    if a.quant:
        s = replace(s, quant=_qtype(ap, "--quant", a.quant))
    if a.output_quant:
        s = replace(s, output_quant=_qtype(ap, "--output-quant", a.output_quant))
    # where tests/oracle/fetch.py unpacks the npm Qwen3 tokenizer (perf/device_setup.sh sets STRATA_FIXTURES)
    fixtures = Path(os.environ.get(ENV_FIXTURES) or "~/.cache/strata/fixtures").expanduser()
    tokenizer = a.tokenizer or fixtures / TOKENIZER_SUBDIR
    if missing := missing_files(tokenizer):
        ap.error(f"--tokenizer {tokenizer}: missing {', '.join(missing)}")
    t0 = time.perf_counter()
    write(a.output, s, a.seed, tokenizer)
    seconds = time.perf_counter() - t0
    size = a.output.stat().st_size
    print(
        f"{a.output}: {s.tag()} ({s.quant.name}, output {s.output_quant.name}), {size / 2**30:.2f} GiB "
        f"({size / 1e9:.2f} GB) in {seconds:.1f} s = {size / seconds / 1e9:.2f} GB/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

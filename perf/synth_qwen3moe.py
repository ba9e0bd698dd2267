"""Write a random qwen3moe-shaped Q4_K GGUF (~1.2B parameters) for CPU benchmarks, in seconds.

Weights are random but valid Q4_K blocks written directly (no quantizer run): in each block every
sub-block shares one 6-bit scale v with its min, and dmin = 7.5 d, so the weights d * v * (q - 7.5)
are zero-mean with std ~ 1/sqrt(cols). The output head is Q6_K as in llama.cpp's Q4_K_M mixes.
The router rows get Zipf-like norms, so some experts win far more often than others (a skew like
real routers'). The tokenizer (Qwen3's, with its vocabulary size) is copied from the tiny qwen3moe
oracle fixture, so llama.cpp loads the same file.

    python perf/synth_qwen3moe.py [--layers 8] [--out DIR]    (default ~/.cache/strata/bench)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType as Q

from strata.gguf.names import Keys, T, tensor

ARCH = "qwen3moe"
WRITER_VERSION = 2  # part of the cache stamp: bump when the bytes written change


@dataclass(frozen=True)
class Shape:
    layers: int = 8
    d: int = 1024
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 128
    experts: int = 64
    top_k: int = 8
    ffn: int = 512  # expert FFN width: a multiple of 256, as Q4_K rows need

    def tag(self) -> str:
        return f"L{self.layers}-D{self.d}-E{self.experts}x{self.ffn}"


def q4_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 256 * 144] of random Q4_K blocks with std ~ 1/sqrt(cols)."""
    n = rows * cols // 256
    blk = rng.integers(0, 256, (n, 144), dtype=np.uint8)
    v = rng.integers(16, 64, n, dtype=np.uint8)
    d = (cols**-0.5 / (v.astype(np.float32) * 4.6)).astype(np.float16)  # std of q in 0..15 is 4.6
    blk[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    blk[:, 2:4] = (d.astype(np.float32) * 7.5).astype(np.float16).view(np.uint8).reshape(n, 2)
    # scale == min == v for all 8 sub-blocks (see get_scale_min_k4 for the packing)
    blk[:, 4:12] = (v | ((v >> 4) << 6))[:, None]
    blk[:, 12:16] = ((v & 15) | ((v & 15) << 4))[:, None]
    return blk.reshape(rows, -1)


def q6_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 256 * 210] of random Q6_K blocks (codes -32..31, scales 16..63)."""
    n = rows * cols // 256
    blk = rng.integers(0, 256, (n, 210), dtype=np.uint8)
    blk[:, 192:208] = rng.integers(16, 64, (n, 16), dtype=np.uint8)
    blk[:, 208:210] = np.full(n, cols**-0.5 / (40 * 18.5), np.float16).view(np.uint8).reshape(n, 2)
    return blk.reshape(rows, -1)


def _copy_tokenizer(w: gguf.GGUFWriter, src: Path) -> int:
    """Copy every tokenizer.* key from `src`; returns the vocabulary size."""
    r = gguf.GGUFReader(src)
    n = 0
    for f in r.fields.values():
        if f.name.startswith("tokenizer."):
            vtype = f.types[0]
            sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
            if f.name == "tokenizer.ggml.tokens":
                n = len(f.data)
    return n


def write(path: Path, s: Shape, tokenizer_src: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path) + ".tmp", arch=ARCH)
    vocab = _copy_tokenizer(w, tokenizer_src)
    k = lambda suffix: f"{ARCH}.{suffix}"
    for key, val in ((Keys.BLOCK_COUNT, s.layers), (Keys.CONTEXT_LENGTH, 32768), (Keys.EMBEDDING_LENGTH, s.d),
                     (Keys.FEED_FORWARD_LENGTH, s.ffn * s.top_k), (Keys.HEAD_COUNT, s.heads),
                     (Keys.HEAD_COUNT_KV, s.kv_heads), (Keys.KEY_LENGTH, s.head_dim),
                     (Keys.VALUE_LENGTH, s.head_dim), (Keys.EXPERT_COUNT, s.experts),
                     (Keys.EXPERT_USED_COUNT, s.top_k), (Keys.EXPERT_FEED_FORWARD_LENGTH, s.ffn)):
        w.add_uint32(k(key), val)
    w.add_float32(k(Keys.ROPE_FREQ_BASE), 1e6)
    w.add_float32(k(Keys.RMS_EPS), 1e-6)
    w.add_uint32("general.file_type", 15)  # MOSTLY_Q4_K_M

    def quant(name: str, blocks: np.ndarray, qt: Q) -> None:
        w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qt)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    quant(tensor(T.TOKEN_EMBD), q4_k(rng, vocab, s.d), Q.Q4_K)
    quant(tensor(T.OUTPUT), q6_k(rng, vocab, s.d), Q.Q6_K)
    norm(tensor(T.OUTPUT_NORM), s.d)
    zipf = 1.0 + 3.0 * 0.85 ** np.arange(s.experts, dtype=np.float32)  # router row norms: the skew
    q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        for t, rows, cols in ((T.ATTN_Q, q_dim, s.d), (T.ATTN_K, kv_dim, s.d), (T.ATTN_V, kv_dim, s.d),
                              (T.ATTN_OUT, s.d, q_dim)):
            quant(tensor(t, i), q4_k(rng, rows, cols), Q.Q4_K)
        for t, n in ((T.ATTN_NORM, s.d), (T.FFN_NORM, s.d), (T.ATTN_Q_NORM, s.head_dim), (T.ATTN_K_NORM, s.head_dim)):
            norm(tensor(t, i), n)
        router = (rng.standard_normal((s.experts, s.d)) * (zipf[:, None] / np.sqrt(s.d))).astype(np.float32)
        w.add_tensor(tensor(T.FFN_GATE_INP, i), router)
        for t, rows, cols in ((T.FFN_GATE_EXP, s.ffn, s.d), (T.FFN_UP_EXP, s.ffn, s.d),
                              (T.FFN_DOWN_EXP, s.d, s.ffn)):
            blocks = q4_k(rng, s.experts * rows, cols).reshape(s.experts, rows, -1)
            quant(tensor(t, i), blocks, Q.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(path) + ".tmp", path)
    return path


def synth_path(root: Path, s: Shape, tokenizer_src: Path) -> Path:
    """The cached file for these settings, written on first use."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"synth-qwen3moe-q4k-{s.tag()}.gguf"
    stamp = path.with_suffix(".json")
    want = repr((WRITER_VERSION, asdict(s)))
    if not (path.is_file() and stamp.is_file() and stamp.read_text() == want):
        write(path, s, tokenizer_src)
        stamp.write_text(want)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=Shape.layers)
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache/strata/bench")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from oracle import assets

    print(synth_path(a.out, Shape(layers=a.layers), assets.tiny_qwen3moe()["q8_0"]))


if __name__ == "__main__":
    main()

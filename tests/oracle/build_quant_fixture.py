"""Build tests/data/llama_quantize_tensors.gguf: tensors encoded by llama.cpp's own quantizers.

The random-block tests prove we decode like gguf-py for arbitrary bytes; this fixture adds blocks as
llama.cpp really writes them (real scale/min searches, imatrix-weighted IQ codebooks, ...). Steps:

1. write a tiny f32 `llama` GGUF whose 2-D weights are 256 or 512 wide (K-quants need 256);
2. write an importance matrix in llama.cpp's imatrix GGUF format (`<tensor>.in_sum2`,
   `<tensor>.counts`, `imatrix.*` keys): IQ1/IQ2/IQ3_XXS refuse to quantize without one;
3. run llama-quantize with `--pure` plus one `--tensor-type <tensor>=<type>` per weight, so every
   wanted type lands on its own tensor in a single run; once with the imatrix (all types) and once
   without (the types that allow it: llama.cpp uses different search code on that path);
4. copy the first rows of each wanted tensor, bytes untouched, into one small GGUF.

Usage: python tests/oracle/build_quant_fixture.py [--llama-quantize PATH] [--out PATH]
The result is committed; rerun only to refresh it (it is deterministic for a given llama.cpp).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from strata.gguf.reader import GGUFFile  # noqa: E402 (run as a script: needs the repo on sys.path first)

DEFAULT_BIN = Path.home() / ".cache/strata-peer/build/bin/llama-quantize"
DEFAULT_OUT = REPO / "tests/data/llama_quantize_tensors.gguf"

# Types to produce; the ones marked True need an importance matrix.
WANTED: dict[T, bool] = {
    T.F32: False,
    T.F16: False,
    T.BF16: False,
    T.Q8_0: False,
    T.Q4_0: False,
    T.Q4_1: False,
    T.Q5_0: False,
    T.Q5_1: False,
    T.Q2_K: False,
    T.Q3_K: False,
    T.Q4_K: False,
    T.Q5_K: False,
    T.Q6_K: False,
    T.IQ4_NL: False,
    T.IQ4_XS: False,
    T.IQ3_S: False,
    T.MXFP4: False,
    T.TQ1_0: False,
    T.TQ2_0: False,
    T.IQ3_XXS: True,
    T.IQ2_XXS: True,
    T.IQ2_XS: True,
    T.IQ2_S: True,
    T.IQ1_S: True,
    T.IQ1_M: True,
}

N_EMBD, N_FF, N_VOCAB = 256, 512, 256
LAYER_WEIGHTS = {  # name -> numpy shape [rows, cols]
    "attn_q": (N_EMBD, N_EMBD),
    "attn_k": (N_EMBD, N_EMBD),
    "attn_v": (N_EMBD, N_EMBD),
    "attn_output": (N_EMBD, N_EMBD),
    "ffn_gate": (N_FF, N_EMBD),
    "ffn_up": (N_FF, N_EMBD),
    "ffn_down": (N_EMBD, N_FF),
}
N_LAYER = -(-len(WANTED) // len(LAYER_WEIGHTS))  # enough weights for one type each
ROWS_KEPT = 64  # rows copied per tensor: 64 x 256 or 64 x 512 values keeps the file ~0.5 MB


def weight_names() -> list[str]:
    return [f"blk.{i}.{w}.weight" for i in range(N_LAYER) for w in LAYER_WEIGHTS]


def fake_weights(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Weight-like data: per-row scales, heavy tails, a few outliers and one all-zero row."""
    rows = shape[0]
    w = rng.standard_t(5, size=shape) * 0.02 * np.exp(rng.normal(0, 0.5, (rows, 1)))
    hot = rng.random(shape) < 0.002
    w[hot] *= 20
    w[5] = 0.0  # (a kept row) exercises the all-zero-block paths (d = 0) in every quantizer
    return w.astype(np.float32)


def write_model(path: Path, rng: np.random.Generator) -> None:
    wr = GGUFWriter(str(path), "llama")
    wr.add_name("strata quant fixture")
    wr.add_block_count(N_LAYER)
    wr.add_context_length(256)
    wr.add_embedding_length(N_EMBD)
    wr.add_feed_forward_length(N_FF)
    wr.add_head_count(2)
    wr.add_head_count_kv(2)
    wr.add_rope_dimension_count(N_EMBD // 2)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_file_type(0)  # ALL_F32
    wr.add_tokenizer_model("llama")
    wr.add_token_list([f"<t{i}>" for i in range(N_VOCAB)])
    wr.add_token_scores([0.0] * N_VOCAB)
    wr.add_token_types([1] * N_VOCAB)
    wr.add_tensor("token_embd.weight", fake_weights(rng, (N_VOCAB, N_EMBD)))
    wr.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    wr.add_tensor("output.weight", fake_weights(rng, (N_VOCAB, N_EMBD)))
    for i in range(N_LAYER):
        wr.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        wr.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
        for w, shape in LAYER_WEIGHTS.items():
            wr.add_tensor(f"blk.{i}.{w}.weight", fake_weights(rng, shape))
    _finish(wr)


def write_imatrix(path: Path, rng: np.random.Generator) -> None:
    """llama.cpp GGUF imatrix: per weight, sum of squared activations per input column + counts."""
    wr = GGUFWriter(str(path), "imatrix")  # llama-imatrix writes general.type = imatrix likewise
    wr.add_type("imatrix")
    wr.add_array("imatrix.datasets", ["synthetic"])
    wr.add_uint32("imatrix.chunk_count", 10)
    wr.add_uint32("imatrix.chunk_size", 512)
    for name in weight_names():
        cols = LAYER_WEIGHTS[name.split(".")[2]][1]
        sums = (rng.gamma(2.0, 1.0, cols) * 5120).astype(np.float32)
        wr.add_tensor(f"{name}.in_sum2", sums)
        wr.add_tensor(f"{name}.counts", np.array([5120.0], np.float32))
    _finish(wr)


def _finish(wr: GGUFWriter) -> None:
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def quantize(binary: Path, src: Path, dst: Path, assign: dict[str, T], imatrix: Path | None) -> str:
    """One llama-quantize run with a per-tensor type override for every assigned weight."""
    cmd = [str(binary), "--pure"]
    if imatrix is not None:
        cmd += ["--imatrix", str(imatrix)]
    for name, qt in assign.items():
        cmd += ["--tensor-type", f"^{re.escape(name)}$={qt.name.lower()}"]
    cmd += [str(src), str(dst), "Q8_0", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"llama-quantize failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_bin = Path(os.environ.get("LLAMA_QUANTIZE", DEFAULT_BIN))
    ap.add_argument("--llama-quantize", type=Path, default=default_bin)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    rng = np.random.default_rng(20240607)
    names = weight_names()
    runs = {  # run tag -> (types, with imatrix?)
        "imatrix": (list(WANTED), True),
        "plain": ([t for t, needs in WANTED.items() if not needs], False),
    }
    out = GGUFWriter(str(args.out), "strata-quant-fixture")
    out.add_string("strata.fixture.generator", "tests/oracle/build_quant_fixture.py")
    made: dict[str, list[str]] = {}
    builds: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        src, imx = Path(tmp, "model-f32.gguf"), Path(tmp, "imatrix.gguf")
        write_model(src, rng)
        write_imatrix(imx, rng)
        for tag, (types, use_imatrix) in runs.items():
            assign = dict(zip(names, types, strict=False))
            dst = Path(tmp, f"model-{tag}.gguf")
            log = quantize(args.llama_quantize, src, dst, assign, imx if use_imatrix else None)
            build = re.search(r"^version: (.+)$", log, re.MULTILINE)
            builds.add(build.group(1).strip() if build else "unknown build")
            got = GGUFFile(dst)
            for name, want in assign.items():
                info = got.tensors[name]
                if info.qtype != want:
                    print(f"  {tag}: {name} asked {want.name}, llama-quantize wrote {info.qtype.name}")
                    continue
                rows = got.raw(name).reshape(info.n_rows, info.row_bytes)[:ROWS_KEPT]
                out.add_tensor(f"{want.name}.{tag}", rows.copy(), raw_dtype=want)  # copy: the mmap goes away
                out.add_string(f"strata.fixture.source.{want.name}.{tag}", name)
                made.setdefault(want.name, []).append(tag)
    out.add_string("strata.fixture.llama_cpp_build", ", ".join(sorted(builds)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _finish(out)
    missing = [t.name for t in WANTED if t.name not in made]
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): {len(made)} types")
    for name, tags in made.items():
        print(f"  {name:8s} {', '.join(tags)}")
    if missing:
        print(f"NOT produced: {', '.join(missing)}")


if __name__ == "__main__":
    main()

"""Kernel micro-benchmark: fused JIT matmul vs numpy (f32 weights already dequantized) per quant
type and token count, one thread. Not a test; prints GMAC/s, and the weights' GB/s beside the int8-input
product (qdot_ir.py, the CPU share's) where the type has one. Tile shapes can be tried with --tiling.

    python perf/bench_jit.py [--types Q4_1,Q4_K,...] [--rows 6144] [--cols 1280] [--tiling 16,2,8 ...]

On this project's 2-core AVX2 machine (2026-12-05, `--rows 512 --cols 2048 --tokens 1,4`: an 80B expert's
gate, L2-warm), one token, GB/s of weights, float -> int8 inputs: Q4_K 3.6 -> 9.6, Q5_K 3.0 -> 7.4,
Q6_K 4.2 -> 11.3, IQ4_XS 3.7 -> 7.4, Q8_0 6.5 -> 12.7 (perf/README.md has four tokens too).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from quant_blocks import random_blocks

from strata.jit.kernels import Kernels
from strata.jit.matmul_ir import Tiling
from strata.quants import dequantize


def best(f, reps: int = 10) -> float:  # type: ignore[no-untyped-def]
    f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_1,Q5_0,Q4_K,Q5_K,Q6_K,IQ4_XS")
    ap.add_argument("--rows", type=int, default=6144)
    ap.add_argument("--cols", type=int, default=1280)
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--tiling", action="append", default=None, help="acc,rows,toks (repeatable)")
    a = ap.parse_args()
    tilings = [Tiling(*map(int, t.split(","))) for t in a.tiling] if a.tiling else [None]
    print(f"{a.rows} x {a.cols}, GMAC/s on one thread (numpy: x @ W.T with W already float32)")
    for name in a.types.split(","):
        qt = T[name]
        raw = random_blocks(qt, a.rows, a.cols, seed=1)
        w = dequantize(raw, qt)
        for n in map(int, a.tokens.split(",")):
            x = np.random.default_rng(0).standard_normal((n, a.cols)).astype(np.float32)
            macs = a.rows * a.cols * n / 1e9
            line = f"{name:<8} N={n:<3} numpy {macs / best(lambda x=x, w=w: x @ w.T):6.1f}"
            for tl in tilings:
                k = Kernels(None, tiling=tl)
                rate = macs / best(lambda k=k, raw=raw, qt=qt, x=x: k.matmul(raw, qt, x))
                line += f" | jit {k.tiling.key} {rate:6.1f} ({rate / macs * raw.nbytes / 1e9:5.1f} GB/s)"
            if k.dot_fn(qt) is not None and a.cols % 256 == 0:
                xq = k.quantize(x)
                rate = macs / best(lambda k=k, raw=raw, qt=qt, xq=xq: k.dot(raw, qt, xq))
                line += f" | int8 inputs {rate:6.1f} ({rate / macs * raw.nbytes / 1e9:5.1f} GB/s)"
            print(line, flush=True)


if __name__ == "__main__":
    main()

"""Kernel micro-benchmark: fused JIT matmul vs numpy (f32 weights already dequantized) per quant
type and token count, one thread. Not a test; prints GMAC/s. Tile shapes can be tried with --tiling.

    python perf/bench_jit.py [--types Q4_1,Q4_K,...] [--rows 6144] [--cols 1152] [--tiling 16,2,8 ...]
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
                line += f" | jit {k.tiling.key} {rate:6.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()

"""CPU prefill/decode throughput: Strata (numpy) beside llama.cpp's llama-bench, same GGUF, same
thread count, measured in one run. Not a test: prints a table and the Strata/llama.cpp ratios.

    python perf/bench_cpu.py [--model PATH] [--threads N] [--prompt 128] [--gen 32]
                             [--llama-bench PATH]  (default ~/.cache/strata-peer/build/bin/llama-bench)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def strata_speed(model: Path, n_prompt: int, n_gen: int, reps: int) -> tuple[float, float]:
    from strata.engine import Engine

    eng = Engine.load(model)
    rng = np.random.default_rng(0)
    ids = rng.integers(100, eng.model.params.vocab - 100, size=n_prompt).tolist()
    eng.logits(ids[:8])  # warm the weight cache so both engines are measured hot
    pp, tg = [], []
    for _ in range(reps):
        state = eng.new_state()
        t0 = time.perf_counter()
        eng.prefill(state, ids)
        pp.append(n_prompt / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for i in range(n_gen):
            eng.model.forward(np.array([ids[i % n_prompt]]), state, all_logits=False)
        tg.append(n_gen / (time.perf_counter() - t0))
    return float(np.median(pp)), float(np.median(tg))


def llama_speed(bench: Path, model: Path, threads: int, n_prompt: int, n_gen: int) -> tuple[float, float]:
    out = subprocess.run(
        [str(bench), "-m", str(model), "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen),
         "-r", "3", "-o", "json"],
        capture_output=True, text=True, check=True,
    )
    rows = json.loads(out.stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] == n_prompt and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] == n_gen and r["n_prompt"] == 0)
    return float(pp), float(tg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2-135M-Instruct Q4_1)")
    # numpy's BLAS uses every CPU we may run on; llama.cpp gets the same count
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-bench", type=Path,
                    default=Path.home() / ".cache/strata-peer/build/bin/llama-bench")
    a = ap.parse_args()
    if a.model is None:
        from oracle import assets

        a.model = assets.smollm2_gguf()
    s_pp, s_tg = strata_speed(a.model, a.prompt, a.gen, a.reps)
    print(f"model {a.model.name}, threads {a.threads}, pp{a.prompt} / tg{a.gen}")
    print(f"{'engine':<22}{'prefill tok/s':>15}{'decode tok/s':>15}")
    print(f"{'strata (numpy)':<22}{s_pp:>15.1f}{s_tg:>15.1f}")
    bench = a.llama_bench if a.llama_bench.exists() else shutil.which("llama-bench")
    if not bench:
        print("llama-bench not found: build it with shared/peer/build-cpu.sh for the ratio")
        return
    l_pp, l_tg = llama_speed(Path(bench), a.model, a.threads, a.prompt, a.gen)
    print(f"{'llama.cpp llama-bench':<22}{l_pp:>15.1f}{l_tg:>15.1f}")
    print(f"{'ratio strata/llama':<22}{s_pp / l_pp:>15.2f}{s_tg / l_tg:>15.2f}")


if __name__ == "__main__":
    main()

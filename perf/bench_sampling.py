"""Host sampling cost per token at Qwen3's 151,936-token vocabulary (strata.sampling.sampler.sample), per
parameter set: the engine samples every decode token on the host, so this adds to each GPU step.

    python perf/bench_sampling.py [--reps 200]

Logits are N(0, sigma) for a peaked (sigma 12), a typical (3) and a flat (0.3) distribution.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from strata.sampling.params import SamplingParams
from strata.sampling.sampler import sample

SETS = {
    "greedy": SamplingParams(temperature=0.0),
    "server defaults (k40 p0.95 min_p0.05)": SamplingParams(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05
    ),
    "Qwen recommended (T0.7 k20 p0.8)": SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
    "top_p 0.9 only": SamplingParams(temperature=1.0, top_p=0.9),
    "min_p 0.05 only": SamplingParams(temperature=0.8, min_p=0.05),
    "temperature only": SamplingParams(temperature=1.0),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    history = list(range(300))
    print(f"{'parameters':<40}" + "".join(f"{f'sigma {s} (ms)':>16}" for s in (12, 3, 0.3)))
    for name, p in SETS.items():
        cells = []
        for sigma in (12.0, 3.0, 0.3):
            logits = (rng.standard_normal(151_936) * sigma).astype(np.float32)
            reps = a.reps if p.top_k or p.top_p < 1 or p.min_p or p.greedy else max(5, a.reps // 20)
            t = time.perf_counter()
            for pos in range(reps):
                sample(logits, history, p, 1, pos)
            cells.append((time.perf_counter() - t) / reps * 1e3)
        print(f"{name:<40}" + "".join(f"{c:>16.3f}" for c in cells), flush=True)


if __name__ == "__main__":
    main()

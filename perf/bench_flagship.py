"""CPU throughput of the flagship architectures (not a test): the tiny qwen3next / qwen4exp oracle
models, and a mid-size synthetic qwen4exp with real widths (perf/synth_qwen4exp.py). Reports
prefill and decode tok/s, the per-sequence state size, and the PLE table traffic per token.

    python perf/bench_flagship.py [--prompt 128] [--gen 16] [--layers 4] [--experts 64]
                                  [--ple-base 250000] [--skip-mid] [--cache-mib 12000]
                                  [--backend numpy|jit|both] [--workers 2]

Small GEMMs with a multi-threaded BLAS collapse when other processes hold the cores (threads spin
on each other): on a shared machine run with OPENBLAS_NUM_THREADS=1 for stable numbers.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from strata.gguf import GGUFFile
from strata.models import model_class
from strata.runtime.weights import WeightStore


def bench(
    path: Path, n_prompt: int, n_gen: int, cache_mib: int, backend: str, workers: int
) -> dict[str, float]:
    g = GGUFFile(path)
    t0 = time.perf_counter()
    weights = WeightStore(g, cache_mib << 20)
    if backend == "jit":  # fused kernels for the projections, routed experts on the CPU pool
        from strata.jit.backend import start

        weights.jit = start(g, None, workers, "auto")
    model = model_class(g)(g, weights)
    rng = np.random.default_rng(0)
    ids = rng.integers(100, min(model.params.vocab, 150_000), size=n_prompt)
    model.forward(ids[:4], model.new_state(), all_logits=False)  # dequantize weights into the cache first
    warm = time.perf_counter() - t0
    stats = getattr(model, "ple_stats", None)
    base = (stats.tokens, stats.rows, stats.bytes) if stats else (0, 0, 0)
    state = model.new_state()
    t0 = time.perf_counter()
    logits = model.forward(ids, state, all_logits=False)
    pp = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n_gen):
        logits = model.forward(np.array([int(logits[-1].argmax())]), state, all_logits=False)
    tg = time.perf_counter() - t0
    out = {
        "load_warm_s": warm,
        "prefill_tok_s": n_prompt / pp,
        "decode_tok_s": n_gen / tg,
        "state_kib": state.nbytes() / 1024,
    }
    if stats:
        n = stats.tokens - base[0]
        out["ple_rows_per_tok"] = (stats.rows - base[1]) / n
        out["ple_bytes_per_tok"] = (stats.bytes - base[2]) / n
        out["ple_table_mib"] = g.tensors["per_layer_token_embd.weight"].nbytes / 2**20
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--ple-base", type=int, default=250_000)
    ap.add_argument("--cache-mib", type=int, default=12_000)
    ap.add_argument("--skip-mid", action="store_true")
    ap.add_argument("--backend", choices=["numpy", "jit", "both"], default="both")
    ap.add_argument("--workers", type=int, default=2, help="jit expert-pool workers")
    args = ap.parse_args()

    from oracle import flagship
    from oracle.fetch import cache_root

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = {
            "tiny qwen3next": flagship.tiny_qwen3next()["f32"],
            "tiny qwen4exp": flagship.tiny_qwen4exp()["f32"],
        }
    if not args.skip_mid:
        from synth_qwen4exp import Synth, synth_path

        s = Synth(layers=args.layers, experts=args.experts, ple_vocab_base=args.ple_base)
        t0 = time.perf_counter()
        models[f"mid qwen4exp {s.tag()}"] = synth_path(cache_root() / "bench", s)
        print(f"synthetic file ready in {time.perf_counter() - t0:.1f}s: {models[f'mid qwen4exp {s.tag()}']}")
    backends = ["numpy", "jit"] if args.backend == "both" else [args.backend]
    for (name, path), backend in ((m, b) for m in models.items() for b in backends):
        r = bench(Path(path), args.prompt, args.gen, args.cache_mib, backend, args.workers)
        line = (
            f"{name + ' ' + backend:<40} prefill {r['prefill_tok_s']:8.1f} tok/s  decode "
            f"{r['decode_tok_s']:7.2f} tok/s  state {r['state_kib']:8.1f} KiB  (load+warm "
            f"{r['load_warm_s']:.1f}s)"
        )
        if "ple_bytes_per_tok" in r:
            line += (
                f"  PLE {r['ple_rows_per_tok']:.0f} rows = {r['ple_bytes_per_tok']:,.0f} B/token"
                f" of a {r['ple_table_mib']:,.1f} MiB table"
            )
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

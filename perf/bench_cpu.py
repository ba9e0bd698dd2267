"""CPU prefill/decode throughput: Strata's numpy and JIT paths beside llama.cpp's llama-bench, on the
same GGUF with the same thread count, measured in one run. Not a test: prints a table and the
Strata/llama.cpp ratios, with the load average before and after (the machine may be shared).

Models: SmolLM2-135M-Instruct Q4_1 (dense) and a random ~1.2B qwen3moe-shaped Q4_K model (Q6_K head)
written by the `strata synth` writer at the BENCH_MOE shape (cached under ~/.cache/strata/bench).
The table and the --json file are in `strata bench`'s shape (strata.bench.report): one scenario,
`throughput`, a row per model and engine.

    python perf/bench_cpu.py [--model PATH ...] [--threads N] [--prompt 128] [--gen 32] [--reps 3]
                             [--engines numpy,jit,llama] [--llama-bench PATH] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from strata.bench import peer
from strata.bench.report import engine_result, engine_tables, run_meta, write_json
from strata.console.logs import configure_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def strata_speed(model: Path, n_prompt: int, n_gen: int, reps: int, **options: object) -> tuple[float, float]:
    """Median prefill and decode tok/s of Engine.load(model, **options), measured hot."""
    from strata.engine import Engine

    eng = Engine.load(model, **options)
    rng = np.random.default_rng(0)
    ids = rng.integers(100, eng.model.params.vocab - 100, size=n_prompt).tolist()
    eng.logits(ids[:8])  # compile kernels / warm the weight cache so every engine is measured hot
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
    jit = eng.model.w.jit
    if jit is not None:
        jit.close()
    return float(np.median(pp)), float(np.median(tg))


def llama_speed(
    bench: Path, model: Path, threads: int, n_prompt: int, n_gen: int, reps: int
) -> tuple[float, float]:
    flags = ["-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps)]
    speeds = peer.bench_speeds(bench, model, flags)
    return speeds[f"pp{n_prompt}"], speeds[f"tg{n_gen}_b1"]


def bench_moe(root: Path) -> Path:
    """The ~1.2B qwen3moe benchmark file: Qwen3-30B-A3B's layout at half its width and 8 layers, 64
    experts, written on first use by the synthetic writer (valid random blocks, router skew 1)."""
    from gguf.constants import GGMLQuantizationType as Q
    from oracle import assets

    from strata.synth.shapes import QWEN3MOE, Shape
    from strata.synth.writer import write_synth

    shape = Shape(
        QWEN3MOE,
        "bench-1b",
        n_layer=8,
        d_model=1024,
        n_head=16,
        n_kv=4,
        head_dim=128,
        n_expert=64,
        top_k=8,
        expert_ff=512,
        dense_ff=4096,
        n_ctx=32768,
        rope_base=1e6,
    )
    path = root / "synth-qwen3moe-bench-1b-q4_k.gguf"
    if not path.is_file():  # the writer renames a finished file into place
        root.mkdir(parents=True, exist_ok=True)
        write_synth(path, shape, Q.Q4_K, Q.Q6_K, 1.0, assets.qwen3_tokenizer_dir())
    return path


def default_models() -> list[Path]:
    from oracle import assets

    return [assets.smollm2_gguf(), bench_moe(Path.home() / ".cache/strata/bench")]


def _load() -> list[float]:
    """The load average (1, 5, 15 min): the machine may be shared."""
    return [round(v, 2) for v in os.getloadavg()]


def row(
    model: Path, engine: str, speed: tuple[float, float], ref: tuple[float, float] | None
) -> dict[str, Any]:
    pp, tg = speed
    return {
        "model": model.name,
        "engine": engine,
        "prefill_tok_s": pp,
        "decode_tok_s": tg,
        "prefill_vs_llama": pp / ref[0] if ref else None,
        "decode_vs_llama": tg / ref[1] if ref else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, action="append", default=None, help="GGUF (repeatable)")
    # numpy's BLAS and the JIT pool use every CPU we may run on; llama.cpp gets the same count
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engines", default="numpy,jit,llama")
    ap.add_argument(
        "--llama-bench", type=Path, default=Path.home() / ".cache/strata-peer/build/bin/llama-bench"
    )
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    a = ap.parse_args()
    configure_logging()  # the engine's start-up lines (tiers, PLE table) on stderr, as the CLI's
    engines = a.engines.split(",")
    models = a.model or default_models()
    bench = a.llama_bench if a.llama_bench.exists() else shutil.which("llama-bench")
    meta = run_meta(
        bench="perf/bench_cpu.py",
        models=[str(m) for m in models],
        engines=engines,
        threads=a.threads,
        prompt=a.prompt,
        gen=a.gen,
        reps=a.reps,
        llama_bench=str(bench) if bench else None,
        load_before=_load(),
    )
    # Engine by engine, not model by model: the JIT backend holds numpy's BLAS to one thread for
    # the rest of the process (jit/blas.py), so every numpy measurement must come before it.
    speeds: dict[Path, dict[str, tuple[float, float]]] = {m: {} for m in models}
    for model in models:
        if "llama" in engines and bench:
            speeds[model]["llama.cpp"] = llama_speed(Path(bench), model, a.threads, a.prompt, a.gen, a.reps)
    for model in models:
        if "numpy" in engines:
            speeds[model]["strata numpy"] = strata_speed(model, a.prompt, a.gen, a.reps)
    for model in models:
        if "jit" in engines:
            speeds[model]["strata jit"] = strata_speed(
                model, a.prompt, a.gen, a.reps, backend="jit", pool_workers=a.threads
            )
    rows = [row(m, name, v, speeds[m].get("llama.cpp")) for m in models for name, v in speeds[m].items()]
    meta["load_after"] = _load()
    result = engine_result(meta, {"throughput": rows})
    print(
        engine_tables(
            f"bench_cpu: threads {a.threads}, pp{a.prompt} / tg{a.gen}, load average before "
            f"{meta['load_before']}, after {meta['load_after']}",
            result,
        ),
        flush=True,
    )
    if "llama" in engines and not bench:
        print("llama-bench not found: build it with shared/peer/build-cpu.sh for the ratios")
    if a.json:
        write_json(result, a.json)
        print(f"json: {a.json}")


if __name__ == "__main__":
    main()

"""Long context on the GPU (issue 18): TTFT and decode at each context length, VRAM and RSS, in one process.
Not a test: prints a table and writes the numbers as JSON (strata bench's envelope).

    python perf/bench_long.py --model F.gguf [--contexts 4096,32768,131072,262144] [--gen 64]
                              [--vram-budget-mib 22528] [--kv-type int8] [--splits 32,1] [--n-ctx N]
                              [--pcie-frac 1] [--prompt-rows N] [--profile] [--json OUT.json] [--plot OUT.png]
    python perf/bench_long.py --replot OUT.json [...] --plot OUT.png     # saved runs, no GPU

The JSON is written after every length, so a run cut short keeps what it measured. `--plot` draws TTFT and
tok/s (prefill and decode) against the context, one series per setting.

For each context length a fresh sequence reads that many random tokens (the TTFT; passes of `--chunk` rows, or
under tiers the model's wide passes, `--prompt-rows` to cap them) and
then decodes `--gen` greedy tokens by graph replay from there (decode tok/s at that length). `--splits` runs
the lengths once per split-K setting of decode attention (strata.gpu.kernels.attention.SPLITS; 1 = one block a
head, the kernel before split-K), each with its own model load and graphs.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from strata.bench.gpu_profile import Profile, print_table
from strata.bench.report import engine_result, engine_tables, run_meta, write_json
from strata.console.logs import configure_logging
from strata.gpu.kernels import attention


def run(
    path: Path, a: argparse.Namespace, splits: int, save: Callable[[list[dict[str, Any]]], None]
) -> list[dict[str, Any]]:
    import cupy as cp
    import psutil

    from strata.gguf import GGUFFile
    from strata.gpu.model import GpuModel, GpuOptions
    from strata.gpu.tiers import TierOptions
    from strata.models import model_class
    from strata.runtime.kvcache import KVType
    from strata.runtime.weights import WeightStore
    from strata.tiers.share import parse_pcie_frac

    attention.SPLITS = splits  # read at each launch and by the buffers' sizes, so set before the model exists
    # the context exists now: what follows is Strata's, as bench_gpu counts it and as the default budget (free
    # VRAM at start-up, less the reserve) leaves the context out
    free0 = cp.cuda.runtime.memGetInfo()[0]
    g = GGUFFile(path)
    cpu = model_class(g)(g, WeightStore(g, 0))
    t0 = time.perf_counter()
    n_ctx = a.n_ctx or max(a.contexts) + a.gen + 64
    gpu = GpuModel(
        cpu,
        GpuOptions(
            chunk=a.chunk,
            n_ctx=n_ctx,
            max_batch=1,
            budget_mib=a.vram_budget_mib,
            kv_type=KVType(a.kv_type),
            tiers=TierOptions(parse_pcie_frac(a.pcie_frac), kv_grow=a.kv_grow),
            kv_resident=a.kv_resident,
            kv_grow=a.kv_grow,
        ),
    )
    if a.prompt_rows:  # a lone prompt's pass: the chunk's, say, against the wide passes of the tiers
        gpu.prompt_rows = min(a.prompt_rows, gpu.prompt_rows)
    grown = ", kv-grow" if a.kv_grow else ""
    how = (
        f"splits {splits}, KV {a.kv_type}, resident {a.kv_resident or 'all'}{grown}, prompt passes of "
        f"{gpu.prompt_rows:,} rows"
    )
    print(f"  loaded in {time.perf_counter() - t0:.1f} s ({how})", flush=True)
    rng = np.random.default_rng(0)
    vocab = gpu.params.vocab
    gpu.graphs.greedy_loop([1], [gpu.new_state()], 4)  # the b=1 graph, captured once
    # a first prefill builds the prefill kernels and fills the memory pool: the 4k row's TTFT measured 19.8 s
    # without it, 0.72 s with
    gpu.forward(rng.integers(0, vocab, 600), gpu.new_state(), all_logits=False)
    rows = []
    for n in a.contexts:
        s = gpu.new_state()
        tokens = rng.integers(0, vocab, n)
        profiled = a.profile and n == max(a.contexts) and n > a.chunk
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        if not profiled:
            gpu.forward(tokens, s, all_logits=False)
        else:  # the last chunk, the one that reads the most cells, kernel by kernel (its events in the TTFT)
            gpu.forward(tokens[: -a.chunk], s, all_logits=False)
            prof = Profile(cp)
            t_last = time.perf_counter()
            with prof.running():
                gpu.forward(tokens[-a.chunk :], s, all_logits=False)
            last_s = time.perf_counter() - t_last
        ttft = time.perf_counter() - t
        if profiled:  # the wall time beside the GPU's: what the host (pinned allocations, copies) adds
            title = f"ctx {n:,}: the last {a.chunk:,}-token chunk, {1e3 * last_s:,.1f} ms wall"
            print_table(prof.table(), title)
        gpu.graphs.greedy_loop([1], [s], 2)  # the first steps at this length (any KV growth happens here)
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        gpu.graphs.greedy_loop([1], [s], a.gen)
        tg = a.gen / (time.perf_counter() - t)
        if profiled:  # two decode steps at this length, launched eagerly: the same kernels as the graph's
            gpu.graphs.use_graphs = False
            with prof.running():
                gpu.graphs.greedy_loop([1], [s], 2)
            gpu.graphs.use_graphs = True
            print_table(prof.table(), f"ctx {n:,}: two decode steps, eager")
        free = cp.cuda.runtime.memGetInfo()[0]
        row = {
            "context": n,
            "splits": splits,
            "kv_type": a.kv_type,
            "kv_resident": a.kv_resident,
            "kv_grow": a.kv_grow,
            "prompt_rows": gpu.prompt_rows,
            "expert_slots": None if gpu.expert_cache is None else gpu.expert_cache.n_slots,
            "ttft_s": ttft,
            "pp_tok_s": n / ttft,
            "tg_tok_s": tg,
            "vram_used_mib": (free0 - free) / 2**20,
            "pool_mib": cp.get_default_memory_pool().total_bytes() / 2**20,
            "rss_mib": psutil.Process().memory_info().rss / 2**20,
        }
        rows.append(row)
        save(rows)
        print(
            f"strata ctx {n:,}: TTFT {ttft:.2f} s ({n / ttft:,.0f} tok/s), decode {tg:.1f} tok/s, "
            f"VRAM {row['vram_used_mib']:,.0f} MiB, RSS {row['rss_mib']:,.0f} MiB",
            flush=True,
        )
        del s
    gpu.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument(
        "--contexts", type=lambda s: [int(v) for v in s.split(",")], default=[4096, 32768, 131072, 262144]
    )
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=4096, help="prefill rows per pass")
    ap.add_argument("--vram-budget-mib", type=int, default=0)
    ap.add_argument("--kv-type", default="int8", choices=["f16", "int8"])
    ap.add_argument("--splits", type=lambda s: [int(v) for v in s.split(",")], default=[attention.SPLITS])
    ap.add_argument(
        "--n-ctx",
        type=int,
        default=0,
        help="the plan's context (0: the longest length + gen); give "
        "runs the same one to compare them on the same plan",
    )
    ap.add_argument(
        "--pcie-frac",
        default="1",
        help="Strata's --pcie-frac (default 1: every miss over PCIe, so "
        "the lengths differ only in attention)",
    )
    ap.add_argument("--kv-resident", type=int, default=0, help="Strata's --kv-resident (0: all in VRAM)")
    ap.add_argument("--kv-grow", action="store_true", help="Strata's --kv-grow")
    ap.add_argument(
        "--prompt-rows",
        type=int,
        default=0,
        help="rows a prompt's pass reads, at most the model's own (0: its own, under tiers the wide passes)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="GPU time per kernel of the longest context's last chunk and of two decode steps after it",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None, help="a PNG of TTFT and tok/s against the context")
    ap.add_argument("--replot", type=Path, nargs="+", default=None, help="saved JSON runs to plot (no GPU)")
    a = ap.parse_args()
    if a.replot:
        rows = [r for f in a.replot for r in json.loads(f.read_text())["scenarios"]["long_context"]["rows"]]
        plot(rows, a.plot or a.replot[0].with_suffix(".png"))
        return
    if a.model is None:
        ap.error("--model is needed (or --replot saved runs)")
    configure_logging("text")
    meta = run_meta(
        bench="bench_long",
        model=str(a.model),
        vram_budget_mib=a.vram_budget_mib,
        gen=a.gen,
        kv_type=a.kv_type,
        kv_resident=a.kv_resident,
        kv_grow=a.kv_grow,
        n_ctx=a.n_ctx,
        pcie_frac=a.pcie_frac,
    )
    done: list[dict[str, Any]] = []

    def save(rows: list[dict[str, Any]]) -> None:
        """After every length: a run cut short keeps what it measured."""
        if a.json:
            write_json(engine_result(meta, {"long_context": done + rows}), a.json)

    for sp in a.splits:
        done += run(a.model, a, sp, save)
    out = engine_result(meta, {"long_context": done})
    print(engine_tables(f"bench_long: {a.model.name}, budget {a.vram_budget_mib} MiB, KV {a.kv_type}", out))
    if a.json:
        write_json(out, a.json)
    if a.plot:
        plot(done, a.plot)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """TTFT, and prefill and decode tok/s, against the context length: a series per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        label = f"KV {r['kv_type']}, splits {r['splits']}"
        label += f", resident {r['kv_resident']}" if r.get("kv_resident") else ""
        label += ", kv-grow" if r.get("kv_grow") else ""
        series.setdefault(label, []).append(r)
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (label, rs) in enumerate(series.items()):
        rs = sorted(rs, key=lambda r: r["context"])
        x = [r["context"] for r in rs]
        color = f"C{i}"
        ax_t.plot(x, [r["ttft_s"] for r in rs], "o-", color=color, label=label)
        ax_s.plot(x, [r["tg_tok_s"] for r in rs], "o-", color=color, label=f"decode, {label}")
        ax_s.plot(x, [r["pp_tok_s"] / 100 for r in rs], "s--", color=color, label=f"prefill / 100, {label}")
    for ax in (ax_t, ax_s):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.grid(True, alpha=0.3)
    ax_t.set_ylabel("TTFT (s)")
    ax_s.set_ylabel("tok/s (prefill / 100)")
    ax_t.legend(fontsize=7)
    ax_s.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

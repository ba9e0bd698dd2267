"""GPU throughput: Strata (cupy, all-resident) beside llama.cpp CUDA on the same GGUF, in one run.
Not a test: prints a table with the Strata/llama.cpp ratios and writes the numbers as JSON.

    python perf/bench_gpu.py --model F.gguf [--llama-bin DIR] [--prompts 512,4096,16384] [--gen 128]
                             [--batches 1,4] [--chunk 4096] [--profile] [--json OUT.json]

Decode replays the captured graph step by step, each step fed the next token of a seeded random stream
(`--feed random`, as llama-bench's tg feeds `rand() % n_vocab`; llama-batched-bench's S_TG for several
sequences): a random-weight model's greedy text soon repeats one token, whose routing never changes, and a
cache that learns would count that as hits (`--feed greedy` passes the draws on instead); prefill is
forward() over a fresh sequence in `--chunk`-token passes. Bytes of weights read per decode step
are counted from the resident tensors (B sequences touch E(1 - (1 - A/E)^B) experts per layer
under uniform routing) and set against the device-to-device copy bandwidth measured here.
See perf/README.md for the command that produced the recorded table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from strata.bench import peer
from strata.bench.gpu_measure import (
    ahead_rates,
    copy_bandwidth,
    prompt_paths,
    prompt_seconds,
    step_bytes,
    sweep,
)
from strata.bench.gpu_profile import Profile, graph_profile
from strata.bench.report import args_config, engine_result, engine_tables, run_meta, write_json
from strata.console.logs import configure_logging
from strata.tiers.lookahead import PREFETCH_DEFAULT

# llama.cpp CUDA on the same machine kind and file, from perf/README.md (2026-11-30, H200): --llama-published
LLAMA_PUBLISHED = {
    "pp512": 10152.9,
    "pp4096": 10746.4,
    "pp16384": 9031.0,
    "tg128_b1": 314.3,
    "batched_tg128_b4": 672.7,
    "batched_tg128_b1": 296.1,
    "published": True,
}


def strata(path: Path, a: argparse.Namespace) -> dict[str, Any]:
    import cupy as cp

    from strata.gguf import GGUFFile
    from strata.gpu.model import GpuModel, GpuOptions
    from strata.gpu.tiers import TierOptions
    from strata.models import model_class
    from strata.runtime.weights import WeightStore
    from strata.tiers import profile as rp
    from strata.tiers.layout import ExpertLayout
    from strata.tiers.share import parse_pcie_frac

    g = GGUFFile(path)
    cpu = model_class(g)(g, WeightStore(g, 0))
    filled = None
    if a.routing_profile_in:  # fill the cache from a profile an earlier run counted
        lay = ExpertLayout.from_gguf(g)
        assert lay is not None
        filled = rp.load_file(a.routing_profile_in, (len(lay.layers), lay.n_expert))
        assert filled is not None, f"{a.routing_profile_in}: no profile of this model's shape"
    free0 = cp.cuda.runtime.memGetInfo()[0]  # the context exists now: what follows is Strata's
    t0 = time.perf_counter()
    gpu = GpuModel(
        cpu,
        GpuOptions(
            chunk=a.chunk,
            n_ctx=max(a.prompts) + a.gen + 64,
            max_batch=max(a.batches),
            split=not a.v1,
            q8=not a.no_q8,
            budget_mib=a.vram_budget_mib,
            expert_cache=a.expert_cache,
            seqs=max(a.batches),
            tiers=TierOptions(
                parse_pcie_frac(a.pcie_frac),
                a.probe,
                a.pool_workers,
                cache_policy=a.cache_policy,
                swap_budget=a.swap_budget_mib << 20,
                profile=filled,
                prefetch=a.prefetch,
                ram_budget_mib=a.ram_budget_mib,
            ),
        ),
    )
    res: dict[str, Any] = {
        "load_s": time.perf_counter() - t0,
        "chunk": a.chunk,
        "kernels": "v1" if a.v1 else ("split" if a.no_q8 else "split+q8"),
    }
    cache = gpu.expert_cache
    if cache is not None and a.record_routes:  # every pass, prompts and warm decode included; saved at exit
        gpu.tiers.record_routes(a.record_routes)
    if (
        cache is not None and a.routing_profile_out
    ):  # count every pass's routing (the learning passes see each)
        cache.profile = rp.Profile(np.zeros(cache.where.shape))
    if cache is not None:
        res["tiers"] = {
            "slots": cache.n_slots,
            "experts": cache.layout.n_total,
            "slot_bytes": cache.layout.slot_bytes,
            "budget_mib": a.vram_budget_mib,
            "pcie": gpu.tiers.probe(),
            "layers": len(cache.layout.layers),
            "expert_bytes": cache.layout.total_bytes,
            "pcie_frac": cache.pcie_frac,
            "pageable": gpu.tiers.pageable,
            "policy": a.cache_policy,
            "ram_budget_mib": a.ram_budget_mib,
            "swap_budget_mib": a.swap_budget_mib,
            "prefetch": a.prefetch,
            "rates": None if gpu.tiers.rates is None else dataclasses.asdict(gpu.tiers.rates),
        }
        print(
            f"  PCIe: zero-copy {res['tiers']['pcie']['zero_copy'] / 1e9:.1f} GB/s, copy engine "
            f"{res['tiers']['pcie']['copy_engine'] / 1e9:.1f} GB/s",
            flush=True,
        )
    rng = np.random.default_rng(0)
    vocab = gpu.params.vocab

    def feed(steps: int, b: int) -> np.ndarray | None:
        """--feed random: the next [steps, b] tokens of the stream (a new stretch each call); greedy: none."""
        return rng.integers(0, vocab, (steps, b)) if a.feed == "random" else None

    gpu.forward(rng.integers(0, vocab, 600), gpu.new_state(), all_logits=False)  # warm: modules, pool
    for p in a.prompts:
        ids = rng.integers(0, vocab, p)
        res[f"pp{p}"] = p / prompt_seconds(gpu, ids, 2 if p > 8192 else 3)
        print(f"strata pp{p}: {res[f'pp{p}']:.0f} tok/s", flush=True)
        for path, rate in prompt_paths(gpu, ids).items():
            res[f"pp{p}_{path}"] = rate
            print(f"strata pp{p} {path.replace('_', ' ')}: {rate:.0f} tok/s", flush=True)
    if cache is not None and a.warm_decode:  # a cache that learns: let it follow the routing first
        t, s0, b0 = time.perf_counter(), cache.swaps, cache.swap_bytes
        gpu.graphs.greedy_loop([1], [gpu.new_state()], a.warm_decode, feed(a.warm_decode, 1))
        res["warm_decode"] = {
            "tokens": a.warm_decode,
            "s": time.perf_counter() - t,
            "swaps": cache.swaps - s0,
            "swap_bytes": cache.swap_bytes - b0,
        }
        print(
            f"  warm decode: {a.warm_decode} tokens in {res['warm_decode']['s']:.1f} s, {cache.swaps - s0:,} "
            f"swaps ({(cache.swap_bytes - b0) / 1e9:.2f} GB)",
            flush=True,
        )
    for b in a.batches:
        warm = [gpu.new_state() for _ in range(b)]
        gpu.graphs.greedy_loop(list(range(1, b + 1)), warm, 4)  # captures the graph for b
        del warm  # their KV and state go back to the ledger (the plan keeps room for b sequences)
        states = [gpu.new_state() for _ in range(b)]
        cp.cuda.Device().synchronize()
        share = None if gpu.tiers is None else gpu.tiers.share
        r0, s0 = (share.requests, share.busy_s) if share is not None else (0, 0.0)
        w0 = (cache.swaps, cache.swap_bytes, cache.rides, cache.ride_bytes) if cache is not None else (0,) * 4
        pf0 = dataclasses.replace(cache.prefetch) if cache is not None else None
        parts0 = dict(gpu.hc.host_parts) if gpu.hc is not None else {}
        t = time.perf_counter()
        gpu.graphs.greedy_loop(list(range(1, b + 1)), states, a.gen, feed(a.gen, b))
        dt = time.perf_counter() - t
        res[f"tg{a.gen}_b{b}"] = b * a.gen / dt
        if gpu.hc is not None and gpu.hc.dims.ple is not None:  # the PLE rows' hash, gather and upload
            host = gpu.hc.host_s - sum(parts0.values())
            res[f"ple_host_share_b{b}"] = host / dt
            split = ", ".join(
                f"{k} {(v - parts0[k]) / a.gen * 1e3:.3f}" for k, v in gpu.hc.host_parts.items()
            )
            step_ms = host / a.gen * 1e3
            print(f"  PLE rows on the host: {step_ms:.3f} ms a step ({split}), {host / dt:.1%} of decode")
        if cache is not None and cache.policy is not None:
            # rides: swaps that landed from the decode pass's own read of the miss, no copy over the link
            rides, ride_bytes = cache.rides - w0[2], cache.ride_bytes - w0[3]
            res[f"swaps_b{b}"] = {
                "swaps": cache.swaps - w0[0],
                "bytes": cache.swap_bytes - w0[1],
                "rides": rides,
                "ride_bytes": ride_bytes,
            }
            print(
                f"  swaps during tg: {cache.swaps - w0[0]:,} ({(cache.swap_bytes - w0[1]) / 1e6:,.0f} MB), "
                f"{rides:,} of them riding a miss's read ({ride_bytes / 1e6:,.0f} MB not copied)",
                flush=True,
            )
        if share is not None:
            n_req = max(1, share.requests - r0)
            res[f"cpu_share_us_b{b}"] = (share.busy_s - s0) / n_req * 1e6
            print(
                f"  CPU share: {res[f'cpu_share_us_b{b}']:.0f} us a layer on the CPU ({n_req} requests)",
                flush=True,
            )
        res[f"bytes_b{b}"] = step_bytes(gpu, b)
        print(f"strata tg{a.gen} b={b}: {res[f'tg{a.gen}_b{b}']:.1f} tok/s", flush=True)
        if cache is not None:
            d = [s.experts.decode for s in states]
            lk, hits, nb, cc = (
                sum(getattr(c, k) for c in d) for k in ("lookups", "hits", "pcie_bytes", "cpu_calls")
            )
            per_call = cache.layout.total_bytes / cache.layout.n_total
            res[f"tiers_b{b}"] = {
                "lookups": lk,
                "hits": hits,
                "hit_rate": hits / max(lk, 1),
                "pcie_bytes_per_token": nb / (b * a.gen),
                "cpu_calls": cc,
                "cpu_bytes_per_token": cc * per_call / (b * a.gen),
            }
            print(
                f"  decode expert cache hit rate {hits / max(lk, 1):.1%}, {nb / (b * a.gen) / 1e6:.0f} "
                f"MB/token over PCIe, {cc * per_call / (b * a.gen) / 1e6:.0f} MB/token on the CPU (pcie_frac "
                f"{cache.pcie_frac:.2f})",
                flush=True,
            )
            pf = cache.prefetch
            if pf.copy_ns > pf0.copy_ns:
                got = {
                    k: getattr(pf, k) - getattr(pf0, k)
                    for k in ("staged", "used", "used_bytes", "wasted_bytes", "copied_bytes", "copy_ns")
                }
                forks = a.gen * len(cache.layout.layers)  # a branch per MoE layer and step
                res[f"prefetch_b{b}"] = {
                    **got,
                    "accuracy": got["used"] / max(got["staged"], 1),
                    "saved_bytes_per_token": got["used_bytes"] / (b * a.gen),
                    "copy_us_per_layer": got["copy_ns"] / forks / 1e3,
                }
                print(
                    f"  lookahead: {got['used']:,} of {got['staged']:,} staged parts used "
                    f"({got['used'] / max(got['staged'], 1):.1%}), "
                    f"{got['used_bytes'] / (b * a.gen) / 1e6:.0f} MB/token read ahead, "
                    f"{got['wasted_bytes'] / (b * a.gen) / 1e6:.0f} wasted; copies ran "
                    f"{got['copy_ns'] / forks / 1e3:.1f} us a layer at "
                    f"{got['copied_bytes'] / max(got['copy_ns'], 1):.1f} GB/s",
                    flush=True,
                )
    states = []  # the last batch's states back to the ledger: at a tight budget the profile needs the room
    s = gpu.new_state()
    gpu.forward(np.array([1]), s, all_logits=False)
    t = time.perf_counter()
    for i in range(64):  # the engine's own path: logits come back to the host every step
        gpu.forward_batch([np.array([i + 2])], [s])
    res["tg_api_b1"] = 64 / (time.perf_counter() - t)
    del s  # its KV and DeltaNet state back to the ledger: at a tight budget the pipeline's states need it
    if a.ahead:
        res["ahead"] = ahead_rates(gpu, a.batches, a.gen)
    if a.sweep:
        res["sweep"] = sweep(gpu, a.batches)
    if a.profile:
        try:
            res["graph_profile_b1"] = graph_profile(gpu)
        except Exception as e:
            print(f"graph profile failed: {e!r}", flush=True)
        gpu.graphs.use_graphs = False
        prof = Profile(cp)
        with prof.running():
            gpu.graphs.greedy_loop([1], [gpu.new_state()], 8)
        res["profile_decode_b1_8steps"] = prof.table()
        with prof.running():
            gpu.forward(rng.integers(0, vocab, 512), gpu.new_state(), all_logits=False)
        res["profile_pp512"] = prof.table()
        gpu.graphs.use_graphs = True
    cp.cuda.Device().synchronize()
    # the pool keeps what it handed out, so this is the run's peak (pinned host memory is not VRAM)
    res["vram_used_mib"] = (free0 - cp.cuda.runtime.memGetInfo()[0]) / 2**20
    pool = cp.get_default_memory_pool()
    res["vram_pool_mib"], res["vram_pool_used_mib"] = pool.total_bytes() / 2**20, pool.used_bytes() / 2**20
    print(
        f"  VRAM used by Strata: {res['vram_used_mib']:,.0f} MiB (budget {a.vram_budget_mib or '-'} MiB; the "
        f"pool holds {res['vram_pool_mib']:,.0f} MiB, {res['vram_pool_used_mib']:,.0f} in use; the rest: "
        "modules, graphs, driver)",
        flush=True,
    )
    if cache is not None and cache.profile is not None:
        rp.save_file(a.routing_profile_out, cache.profile)
    pool.set_limit(size=0)  # the copy-rate buffers below are the bench's, not Strata's: outside its budget
    res["copy_bw"] = copy_bandwidth(cp)
    return res


def llama(path: Path, a: argparse.Namespace) -> dict[str, Any]:
    bin_ = Path(a.llama_bin)
    flags = ["-ngl", "99", "-p", ",".join(map(str, a.prompts)), "-n", str(a.gen), "-r", "3"]
    res: dict[str, Any] = peer.bench_speeds(bin_ / "llama-bench", path, flags)
    res.update(peer.batched_speeds(bin_ / "llama-batched-bench", path, a.gen, a.batches, ["-ngl", "99"]))
    return res


Rows = list[dict[str, Any]]


def scenarios(s: dict[str, Any], ll: dict[str, Any], a: argparse.Namespace) -> dict[str, Rows]:
    """The comparison's rows: prefill per prompt length; decode per batch, with the weight bytes a token reads
    and that traffic's share of the measured copy bandwidth."""

    def ratio(mine: float | None, theirs: float | None) -> float | None:
        return mine / theirs if mine and theirs else None

    prefill = [
        {
            "test": f"pp{p}",
            "strata_tok_s": s.get(f"pp{p}"),
            "llama_tok_s": ll.get(f"pp{p}"),
            "ratio": ratio(s.get(f"pp{p}"), ll.get(f"pp{p}")),
        }
        for p in a.prompts
    ]
    decode = []
    for b in a.batches:
        key = f"tg{a.gen}_b{b}"
        mine, theirs = s.get(key), ll.get(key if b == 1 else f"batched_{key}")  # llama-bench's tg is b=1
        per_tok = s[f"bytes_b{b}"] / b if f"bytes_b{b}" in s else None
        decode.append(
            {
                "test": f"tg{a.gen} b={b}",
                "strata_tok_s": mine,
                "llama_tok_s": theirs,
                "ratio": ratio(mine, theirs),
                "gb_per_token": per_tok / 1e9 if per_tok else None,
                "pct_of_copy_bw": 100 * per_tok * mine / s["copy_bw"] if per_tok and mine else None,
            }
        )
    return {"prefill": prefill, "decode": decode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument(
        "--llama-bin", default=None, help="folder with llama-bench and llama-batched-bench (CUDA build)"
    )
    ap.add_argument("--prompts", type=lambda s: [int(v) for v in s.split(",")], default=[512, 4096, 16384])
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4])
    ap.add_argument("--chunk", type=int, default=4096, help="Strata prefill rows per pass")
    ap.add_argument("--v1", action="store_true", help="the first kernel versions (GpuOptions(split=False))")
    ap.add_argument("--profile", action="store_true", help="GPU time per kernel (eager decode and pp512)")
    ap.add_argument(
        "--sweep", action="store_true", help="decode tok/s per decode-kernel setting (fp32 / int8 inputs)"
    )
    ap.add_argument(
        "--no-q8", action="store_true", help="decode products on fp32 inputs (GpuOptions(q8=False))"
    )
    ap.add_argument(
        "--llama-published",
        action="store_true",
        help="no llama.cpp run: compare with the H200 numbers recorded in perf/README.md",
    )
    ap.add_argument(
        "--strata-json",
        type=Path,
        default=None,
        help="take Strata's numbers from this earlier --json output instead of measuring (llama.cpp only)",
    )
    ap.add_argument(
        "--ahead", action="store_true", help="decode through the server's pipeline too (greedy and sampled)"
    )
    ap.add_argument("--no-table", action="store_true", help="measure and save, but print no comparison table")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--vram-budget-mib", type=int, default=0, help="Strata's VRAM budget (0: free memory)")
    ap.add_argument("--expert-cache", default="auto", help="Strata's --expert-cache")
    ap.add_argument("--pcie-frac", default="auto", help="Strata's --pcie-frac (auto: from the probe)")
    ap.add_argument(
        "--pool-workers", type=int, default=0, help="Strata's --pool-workers (the CPU share's threads)"
    )
    ap.add_argument("--probe", action="store_true", help="Strata's --probe: measure the split's rates again")
    ap.add_argument(
        "--cache-policy", default="static", help="Strata's --cache-policy (static, lru, adaptive)"
    )
    ap.add_argument("--swap-budget-mib", type=int, default=64, help="Strata's --swap-budget-mib")
    ap.add_argument("--ram-budget-mib", type=float, default=0, help="Strata's --ram-budget-mib (0: none)")
    ap.add_argument("--prefetch", type=int, default=PREFETCH_DEFAULT, help="Strata's --prefetch (0: off)")
    ap.add_argument(
        "--routing-profile-out",
        type=Path,
        default=None,
        help="count the run's routing into this profile file (.npz)",
    )
    ap.add_argument(
        "--routing-profile-in", type=Path, default=None, help="fill the cache from this profile file"
    )
    ap.add_argument(
        "--record-routes",
        type=Path,
        default=None,
        help="Strata's --record-routes: every pass's routed experts, for `strata tiers simulate --recorded`",
    )
    ap.add_argument(
        "--feed",
        choices=("random", "greedy"),
        default="random",
        help="decode's next tokens: a seeded random stream (as llama-bench's tg) or the greedy draws",
    )
    ap.add_argument(
        "--warm-decode",
        type=int,
        default=0,
        help="decode this many tokens before measuring decode (a learning cache follows the routing first)",
    )
    a = ap.parse_args()
    configure_logging()  # the engine's start-up lines (VRAM plan, tiers, probe) on stderr, as the CLI's
    earlier = json.loads(a.strata_json.read_text())["strata"] if a.strata_json else None
    ll = llama(a.model, a) if a.llama_bin else (dict(LLAMA_PUBLISHED) if a.llama_published else {})
    meta = run_meta(
        bench="perf/bench_gpu.py",
        model=str(a.model),
        config=args_config(a),
    )
    # "strata" and "llama.cpp" as they were: bench_tiers.py and --strata-json read them
    out = engine_result(meta, {}, model=str(a.model), **{"llama.cpp": ll})
    print(f"llama.cpp: {ll}", flush=True)
    if a.json:
        write_json(out, a.json)
    s = out["strata"] = earlier if earlier is not None else strata(a.model, a)
    out["scenarios"] = engine_result(meta, scenarios(s, ll, a))["scenarios"]
    if a.json:
        write_json(out, a.json)
    if "graph_profile_b1" in s and earlier is None:
        print("\ngraph_profile_b1 (in-graph, batch 1): kernel, launches per step, us per launch, us per step")
        for name, n, us in s["graph_profile_b1"]:
            if name == "(whole step)":
                print(f"  {name:<60}{n:>6}{us * 1e3:>10.1f}")
            else:
                print(f"  {name[:60]:<60}{n:>6}{us:>10.2f}{us * n:>10.1f}")
    for key in ("profile_decode_b1_8steps", "profile_pp512"):
        if key in s and earlier is None:
            print(f"\n{key}: kernel, launches, ms")
            for name, n, ms in s[key][:14]:
                print(f"  {name[:60]:<60}{n:>6}{ms:>10.3f}")
    if a.no_table:
        return
    print(
        "\n"
        + engine_tables(
            f"bench_gpu: model {a.model.name}; Strata loaded in {s['load_s']:.1f} s; copy "
            f"bandwidth {s['copy_bw'] / 1e12:.2f} TB/s",
            out,
        )
    )
    if "batched_tg" + str(a.gen) + "_b1" in ll:
        print(f"llama-batched-bench b=1 (after a 128-token prompt): {ll[f'batched_tg{a.gen}_b1']:.1f} tok/s")
    print(
        f"strata decode through forward_batch (logits to the host each step), b=1: {s['tg_api_b1']:.1f} tok/s"
    )


if __name__ == "__main__":
    main()

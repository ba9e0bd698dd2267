"""Experts that do not fit in VRAM: Strata at several VRAM caps beside llama.cpp's best `--n-cpu-moe` on the
same GGUF, with the bandwidth bound and the planner's prediction. Not a test.

    python perf/bench_tiers.py --model F.gguf --caps 22528,11264,7168 [--llama-bin DIR | --llama-json F]
                               [--prompts 512,4096] [--gen 64] [--batches 1,4]
                               [--policies static,lru,adaptive] --out DIR

The table on stdout and tiers.json are in `strata bench`'s shape (strata.bench.report: meta, the `tiers`
scenario's rows, and every run's numbers under `runs`); tiers.md keeps the markdown table.

`--policies` runs each cap once per cache policy and `--pcie-fracs` value, lru and adaptive after
`--warm-decode` tokens of learning (issue 17's comparison, on a file whose router has locality:
`strata synth --router-mode locality`). The bound counts each run's measured misses and swaps; the
planner assumes uniform routing's hit rate, so it is given (and the plot draws the bounds) for static runs
only.

Each cap runs `perf/bench_gpu.py --vram-budget-mib CAP` in its own process (each pins every expert, so one at
a time). The bound of one decode token: the bytes it reads from VRAM (dense weights and hits) at the measured
device copy rate (as bench_gpu.py's pct_of_copy_bw) plus its misses at the measured zero-copy rate
(`GpuTiers.probe`); the share of it is measured / bound. The prediction is `strata plan` with those two rates.
llama.cpp either runs here (`--llama-bin`: for each cap the fewest `-ncmoe` layers that fit and two more, each
with its default, `-lm none`, and `-lm none -ub 2048 -b 4096`, best per column kept) or comes from a JSON of
earlier measurements (`--llama-json`, which the table marks). Writes tiers.json, tiers.md and tiers.png
(decode tok/s against the cap, bound drawn) under --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from strata.bench import peer
from strata.bench.report import args_config, engine_result, engine_tables, run_meta, write_json

HERE = Path(__file__).resolve().parent
LLAMA_FLAGS = ([], ["-lm", "none"], ["-lm", "none", "-ub", "2048", "-b", "4096"])
# --llama-quick: only each column's winner of the full sweep on the 80B file (../shared/peer/README.md,
# 2026-12-02): decode with the default mmap, prefill with -lm none -ub 2048 -b 4096 (its default-flag prefill
# runs at ~150 tok/s offloaded, minutes a run at 4k)
LLAMA_QUICK = (([], "decode"), (["-lm", "none", "-ub", "2048", "-b", "4096"], "prefill"))


def variants(a: argparse.Namespace) -> list[tuple[str, str]]:
    """(cache policy, --pcie-frac) per run at a cap: every policy at each --pcie-fracs value (the CPU share's
    per-token split follows a learning policy's swaps)."""
    return [(p, f) for p in a.policies.split(",") for f in a.pcie_fracs.split(",")]


def strata_at(a: argparse.Namespace, cap: int, policy: str, frac: str, out: Path) -> dict[str, Any]:
    js = out / f"strata_{cap}_{policy}_{frac}.json"
    cmd = [
        sys.executable,
        str(HERE / "bench_gpu.py"),
        "--model",
        str(a.model),
        "--vram-budget-mib",
        str(cap),
        "--prompts",
        ",".join(map(str, a.prompts)),
        "--gen",
        str(a.gen),
        "--batches",
        ",".join(map(str, a.batches)),
        "--chunk",
        str(a.chunk),
        "--pcie-frac",
        frac,
        "--cache-policy",
        policy,
        "--no-table",
        "--json",
        str(js),
    ]
    if policy != "static":  # it learns the routing first, as a server does over its first requests
        cmd += ["--warm-decode", str(a.warm_decode), "--swap-budget-mib", str(a.swap_budget_mib)]
    subprocess.run(cmd, check=True)
    return json.loads(js.read_text())["strata"]


def plan_at(
    a: argparse.Namespace, cap: int, hbm: float, pcie: float, cpu_gbps: float, fixed_s: float, frac: float
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "strata",
        "plan",
        str(a.model),
        "--vram-gib",
        str(cap / 1024),
        "--hbm-gbps",
        str(hbm / 1e9),
        "--pcie-gbps",
        str(pcie / 1e9),
        "--ctx-size",
        str(max(a.prompts) + a.gen + 64),
        "--parallel",
        str(max(a.batches)),
        "--prefill",
        str(a.chunk),
        "--cpu-gbps",
        str(cpu_gbps),
        "--cpu-fixed-us",
        str(fixed_s * 1e6),
        "--pcie-frac",
        str(frac) if cpu_gbps else "1",
        "--json",
    ]
    # from outside the checkout: `-m` puts the cwd first on sys.path, and the checkout's folders are not the
    # package
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd="/").stdout)


def llama_at(
    a: argparse.Namespace, cap: int, layer_bytes: float, dense_bytes: float, n_layer: int
) -> dict[str, Any]:
    """llama.cpp's best per column at this cap: -ncmoe from the fewest layers that fit, and two more."""
    fit = next(n for n in range(n_layer + 1) if dense_bytes + (n_layer - n) * layer_bytes <= cap * 2**20)
    best: dict[str, Any] = {}
    sweep = LLAMA_QUICK if a.llama_quick else [(f, "both") for f in LLAMA_FLAGS]
    for n in (fit, min(n_layer, fit + 2)):
        for flags, part in sweep:
            flags_ = ["-ngl", "99", "-ncmoe", str(n), "-r", "2", *flags]
            flags_ += ["-p", ",".join(map(str, a.prompts)) if part != "decode" else "0"]
            flags_ += ["-n", str(a.gen) if part != "prefill" else "0"]
            try:
                speeds = peer.bench_speeds(Path(a.llama_bin) / "llama-bench", a.model, flags_)
            except peer.PeerError as e:  # out of memory at this cap, or a file it cannot read: no candidate
                print(f"llama.cpp -ncmoe {n} {' '.join(flags)}: {e}", flush=True)
                continue
            for key, tok_s in speeds.items():
                if tok_s > best.get(key, 0.0):
                    best[key], best[key + "_flags"] = tok_s, f"-ncmoe {n} {' '.join(flags)}".strip()
    return best


def bound(s: dict[str, Any], b: int, gen: int, cpu_too: bool = True) -> float:
    """Decode tok/s if every byte moved at its measured rate: VRAM bytes at the copy rate, then the misses
    over PCIe at the probed zero-copy rate, with cpu_too beside the CPU pool at its probed rate, the misses
    split between the two at their best (each side's share in proportion to its rate). A learning policy's
    copied swaps (bytes copied into slots during the `gen` measured steps, riders not) run on a side stream,
    so they may overlap anything but the link: the token takes at least its misses and swaps over the link
    (the CPU's side taking more of the misses) and its swaps over PCIe. The CPU pool's rate is that of the
    probe, which was run when the split is auto or given (a run without a share has none)."""
    t = s[f"tiers_b{b}"]
    miss = t["pcie_bytes_per_token"] + t.get("cpu_bytes_per_token", 0.0)
    vram = (
        s[f"bytes_b{b}"] / b - miss
    )  # bytes_b: the step's weight bytes as if resident, per step of b tokens
    sw = s.get(f"swaps_b{b}") or {}  # riders crossed the link as the misses they were: only copies count
    swap = max(0, sw.get("bytes", 0) - sw.get("ride_bytes", 0)) / (b * gen)
    rates = s["tiers"].get("rates") or {}
    pcie = s["tiers"]["pcie"]["zero_copy"]
    link = pcie + (rates.get("cpu", 0.0) if cpu_too else 0.0)
    return 1 / max(vram / s["copy_bw"] + miss / link, (miss + swap) / link, swap / pcie)


def table_rows(rows: list[dict[str, Any]], a: argparse.Namespace) -> list[dict[str, Any]]:
    """A row per cap, run (policy, pcie_frac) and test: Strata's and llama.cpp's tok/s; for decode, the bound
    and the planner's (whose hit rate is uniform routing's: static runs only)."""
    out = []
    for r in rows:
        s, peer = r["strata"], r["llama"]
        for key in [f"pp{p}" for p in a.prompts] + [f"tg{a.gen}_b{b}" for b in a.batches]:
            mine, theirs = s.get(key, 0.0), peer.get(key, 0.0)
            b = int(key.rsplit("b", 1)[1]) if key.startswith("tg") else 0
            bd = bound(s, b, a.gen) if b else None
            bd_link = bound(s, b, a.gen, cpu_too=False) if b else None
            hit = s[f"tiers_b{a.batches[0]}"]["hit_rate"]
            out.append(
                {
                    "cap_mib": r["cap"],
                    "policy": r["policy"],
                    "pcie_frac": s["tiers"]["pcie_frac"],
                    "hit_rate": hit,
                    "test": key,
                    "strata_tok_s": mine,
                    "llama_tok_s": theirs or None,
                    "ratio": mine / theirs if theirs else None,
                    "bound_tok_s": bd,
                    "of_bound": mine / bd if bd else None,
                    "bound_pcie_tok_s": bd_link,
                    "of_bound_pcie": mine / bd_link if bd_link else None,
                    "planner_tok_s": r["plan"]["decode_tok_s"]
                    if b == 1 and r["policy"] == "static"
                    else None,
                }
            )
    return out


def table(rows: list[dict[str, Any]], a: argparse.Namespace) -> str:
    src = "measured here" if a.llama_bin else f"from {a.llama_json}"
    out = [
        f"llama.cpp: {src}",
        (
            "| cap MiB | policy | pcie_frac | hit rate | test | Strata | llama.cpp | ratio "
            "| bound PCIe + CPU | % of bound | bound PCIe alone | % of it | planner |"
        ),
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in table_rows(rows, a):
        peer, ratio = (f"{t['llama_tok_s']:,.1f}", f"{t['ratio']:.2f}") if t["llama_tok_s"] else ("-", "-")
        extra = ["", "", "", "", ""]
        if t["bound_tok_s"] is not None:
            planner = "" if t["planner_tok_s"] is None else f"{t['planner_tok_s']:,.1f}"
            extra = [f"{t['bound_tok_s']:,.1f}", f"{t['of_bound']:.0%}"]
            extra += [f"{t['bound_pcie_tok_s']:,.1f}", f"{t['of_bound_pcie']:.0%}", planner]
        out.append(
            f"| {t['cap_mib']:,} | {t['policy']} | {t['pcie_frac']:.2f} | {t['hit_rate']:.1%} | "
            f"{t['test']} | {t['strata_tok_s']:,.1f} | {peer} | {ratio} | " + " | ".join(extra) + " |"
        )
    for r in rows:
        s = r["strata"]
        out.append(
            f"cap {r['cap']:,} MiB, {r['policy']}, pcie_frac {s['tiers']['pcie_frac']:.2f} "
            f"(asked {r['frac']}): rates {s['tiers'].get('rates')}; Strata used "
            f"{s['vram_used_mib']:,.0f} MiB of VRAM; PCIe probe "
            f"zero-copy {s['tiers']['pcie']['zero_copy'] / 1e9:.1f} GB/s, copy engine "
            f"{s['tiers']['pcie']['copy_engine'] / 1e9:.1f} GB/s; planner "
            f"{r['plan']['decode_tok_s']:,.1f} tok/s"
        )
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], a: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = f"tg{a.gen}_b1"
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for run in dict.fromkeys((r["policy"], r["frac"]) for r in rows):
        mine = [r for r in rows if (r["policy"], r["frac"]) == run]
        caps = [r["cap"] / 1024 for r in mine]
        tag = f" ({run[0]}, --pcie-frac {run[1]})"
        ax.plot(caps, [r["strata"][key] for r in mine], "o-", label="Strata" + tag)
        if run[0] != "static":  # the plan assumes uniform routing's hit rate; one set of bounds reads best
            continue
        for cpu_too, style, what in ((True, "--", "PCIe + CPU pool"), (False, ":", "PCIe alone")):
            bounds = [bound(r["strata"], 1, a.gen, cpu_too) for r in mine]
            ax.plot(caps, bounds, style, label=f"bound, {what}{tag}")
        ax.plot(caps, [r["plan"]["decode_tok_s"] for r in mine], "x:", label="strata plan" + tag)
    rows = [r for r in rows if (r["policy"], r["frac"]) == (rows[0]["policy"], rows[0]["frac"])]
    caps = [r["cap"] / 1024 for r in rows]
    if any(r["llama"].get(key) for r in rows):
        ax.plot(
            caps,
            [r["llama"].get(key, float("nan")) for r in rows],
            "s-",
            label="llama.cpp best --n-cpu-moe" + ("" if a.llama_bin else " (earlier run)"),
        )
    ax.set_xlabel("VRAM budget (GiB)")
    ax.set_ylabel("decode tok/s, one sequence")
    ax.set_title(a.model.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--caps", type=lambda s: [int(v) for v in s.split(",")], default=[22528, 11264, 7168])
    ap.add_argument("--prompts", type=lambda s: [int(v) for v in s.split(",")], default=[512, 4096])
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4])
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--llama-bin", default=None, help="llama.cpp CUDA build's bin folder: sweep it here")
    ap.add_argument(
        "--llama-quick", action="store_true", help="run llama.cpp only with each column's known-best flags"
    )
    ap.add_argument(
        "--llama-json", type=Path, default=None, help="{cap MiB: {pp512: .., tg64_b1: ..}} measured before"
    )
    ap.add_argument(
        "--pcie-fracs", default="auto", help="Strata's --pcie-frac values to run at each cap (commas)"
    )
    ap.add_argument(
        "--policies",
        default="static",
        help="Strata's --cache-policy values to run at each cap (commas; a learning one over PCIe alone)",
    )
    ap.add_argument(
        "--warm-decode", type=int, default=256, help="tokens a learning policy decodes before it is measured"
    )
    ap.add_argument("--swap-budget-mib", type=int, default=64, help="Strata's --swap-budget-mib for those")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(a.llama_json.read_text()) if a.llama_json else {}
    meta = run_meta(
        bench="perf/bench_tiers.py",
        model=str(a.model),
        config=args_config(a),
    )
    rows = []
    peer: dict[int, dict[str, Any]] = {}
    for cap in a.caps:
        for policy, frac in variants(a):
            s = strata_at(a, cap, policy, frac, a.out)
            if "tiers" not in s:  # every expert fits: no tiers, so no bound or plan of misses to set beside
                print(f"cap {cap:,} MiB holds every expert: all-resident, see strata_{cap}_*.json")
                break
            rates = s["tiers"].get("rates") or {}
            plan = plan_at(
                a,
                cap,
                s["copy_bw"],
                s["tiers"]["pcie"]["zero_copy"],
                rates.get("cpu", 0.0) / 1e9,
                rates.get("cpu_fixed_s", 0.0),
                s["tiers"]["pcie_frac"],
            )
            if cap not in peer:
                if a.llama_bin:
                    n_layer = s["tiers"]["layers"]
                    peer[cap] = llama_at(
                        a, cap, s["tiers"]["expert_bytes"] / n_layer, plan["dense_bytes"], n_layer
                    )
                else:
                    peer[cap] = earlier.get(str(cap), {})
            rows.append(
                {"cap": cap, "policy": policy, "frac": frac, "strata": s, "plan": plan, "llama": peer[cap]}
            )
        result = engine_result(meta, {"tiers": table_rows(rows, a)}, runs=rows)  # runs: every run's numbers
        write_json(result, a.out / "tiers.json")
    if not rows:
        return
    md = table(rows, a)
    (a.out / "tiers.md").write_text(md + "\n")
    src = "measured here" if a.llama_bin else f"from {a.llama_json}"
    print(engine_tables(f"bench_tiers: {a.model.name}, llama.cpp {src}", result))
    print("\n".join(line for line in md.splitlines() if line.startswith("cap ")))  # each cap's rates and VRAM
    plot(rows, a, a.out / "tiers.png")


if __name__ == "__main__":
    main()

"""`strata tiers trace --synthetic ... -o F.npz` and
`strata tiers simulate TRACE --slots N --policy P [--sweep [--sizes S,..] [--plot PNG]] [--window T]
[--swap-budget E] [--admit copy|ride] [--prefetch K] [--json]`: routing traces and the policy simulator
(strata.tiers.trace, .sim) for tier-tuning experiments."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from strata.cli.output import dump_json
from strata.errors import ConfigError
from strata.tiers import policy, sim, trace
from strata.tiers.lookahead import check_prefetch
from strata.tiers.ride import ADMISSIONS


def add_tiers_flags(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="tiers_command", metavar="TIERS_COMMAND", required=True)
    t = sub.add_parser("trace", help="write a synthetic routing trace (skew and temporal locality)")
    t.add_argument(
        "--synthetic", action="store_true", required=True, help="the synthetic router (tiers/trace.py)"
    )
    t.add_argument("--tokens", type=int, default=2000)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--seed", type=int, default=0)
    for f in ("n_expert", "top_k", "skew", "reuse", "window", "drift"):
        default = getattr(trace.CALIBRATED, f)
        t.add_argument(
            f"--{f.replace('_', '-')}",
            type=type(default),
            default=default,
            help=f"(default {default}: calibrated to published LRU hit rates)",
        )
    t.add_argument("-o", "--output", type=Path, required=True)
    s = sub.add_parser("simulate", help="replay a trace through a cache policy")
    s.add_argument("trace", type=Path)
    s.add_argument("--slots", type=int, default=64, help="slots per layer")
    s.add_argument("--policy", default="adaptive", choices=policy.POLICIES)
    s.add_argument(
        "--sweep", action="store_true", help="every policy at each of --sizes: hit rate vs cache size"
    )
    s.add_argument("--sizes", default="32,64,128,256", help="--sweep's slots per layer (default %(default)s)")
    s.add_argument("--plot", type=Path, default=None, metavar="PNG", help="with --sweep: the curve as a PNG")
    s.add_argument(
        "--window",
        type=int,
        default=1,
        metavar="TOKENS",
        help="tokens between the policy's updates (default 1; the engine learns every 4 passes, 4 tokens at "
        "b=1)",
    )
    s.add_argument(
        "--swap-budget",
        type=int,
        default=None,
        metavar="EXPERTS",
        help="experts a window may copy into slots, over all layers (default: any; the engine's "
        "--swap-budget-mib M allows 4 M / the expert's MiB a window)",
    )
    s.add_argument(
        "--admit",
        default="copy",
        choices=ADMISSIONS,
        help="how newcomers come in: copied over the link between windows (the CPU stand-in, whose "
        "counters --recorded reproduces) or riding the read of their first use, as the GPU's decode does "
        "(tiers/ride.py; default %(default)s)",
    )
    s.add_argument(
        "--recorded",
        action="store_true",
        help="start from the placement the engine had when it recorded the trace (--record-routes) and "
        "swap between its policy windows, scoring the whole trace (or --score's part): the engine's own "
        "counters for the same policy",
    )
    s.add_argument(
        "--score",
        default=None,
        metavar="A:B",
        help="with --recorded: score tokens A to B only (the trace's rows, in order), the windows before A "
        "learning unscored as the engine's did, the rest of the trace cut off (e.g. a bench's tg64 b=1 "
        "after its warm decode)",
    )
    s.add_argument(
        "--prefetch",
        type=int,
        default=None,
        metavar="K",
        help="replay the lookahead with K "
        "experts a layer from the predictions a --prefetch run recorded (default: the run's K; "
        "0: off)",
    )
    s.add_argument(
        "--model",
        type=Path,
        default=None,
        help="the GGUF the trace came from: adds the planner's predicted decode tok/s at each result's hit "
        "rate (every miss over PCIe; the lookahead's read-ahead bytes off the critical path)",
    )
    s.add_argument("--hbm-gbps", type=float, default=900.0, help="VRAM bandwidth, GB/s (with --model)")
    s.add_argument("--pcie-gbps", type=float, default=25.0, help="PCIe bandwidth, GB/s (with --model)")
    s.add_argument(
        "--layer-us",
        type=float,
        default=None,
        help="the all-resident decode step a layer, us (with --model; default: as strata plan)",
    )
    s.add_argument("--json", action="store_true")


def run_tiers(args: argparse.Namespace) -> int:
    if args.tiers_command == "trace":
        if args.tokens < 2 or args.layers < 1:
            raise ConfigError("--tokens", args.tokens, "a trace needs at least 2 tokens and 1 layer")
        spec = dataclasses.replace(
            trace.CALIBRATED,
            layers=args.layers,
            n_expert=args.n_expert,
            top_k=args.top_k,
            skew=args.skew,
            reuse=args.reuse,
            window=args.window,
            drift=args.drift,
        )
        trace.save(args.output, trace.synthetic(spec, args.tokens, args.seed), spec.n_expert)
        print(args.output)
        return 0
    ids, n_expert = trace.load(args.trace)
    if args.slots < 0:
        raise ConfigError("--slots", args.slots, "must be >= 0")
    if args.plot is not None and not args.sweep:
        raise ConfigError("--plot", args.plot, "draws the --sweep curve: add --sweep")
    ahead = _ahead(args)
    if args.window < 1:
        raise ConfigError("--window", args.window, "tokens a window: at least 1")
    if args.swap_budget is not None and args.swap_budget < 0:
        raise ConfigError("--swap-budget", args.swap_budget, "experts a window: at least 0")
    t = len(ids)
    windows = np.array([args.window] * (t // args.window) + ([t % args.window] if t % args.window else []))
    budget, resident = args.swap_budget, None
    if args.recorded:
        if args.window != 1 or budget is not None:
            flag, value = ("--window", args.window) if args.window != 1 else ("--swap-budget", budget)
            raise ConfigError(flag, value, "--recorded replays the run's own windows and swap budget")
        resident, windows, budget = trace.load_recorded(args.trace)
        if resident is None:
            raise ConfigError("--recorded", args.trace, "needs a trace written by --record-routes")
    scored = None
    if args.score is not None:
        ids, windows, scored = _score_range(args.score, args.recorded, ids, windows)
    if args.sweep and resident is None:
        sizes = _sizes(args.sizes, n_expert)
        results = sim.sweep(ids, n_expert, sizes, windows=windows, budget=budget, admit=args.admit)
    else:  # --recorded starts from the run's placement: its slots, not --slots
        slots = 0 if resident is not None else args.slots
        results = [
            sim.simulate(
                ids,
                n_expert,
                slots,
                args.policy,
                resident=resident,
                windows=windows,
                budget=budget,
                ahead=ahead,
                admit=args.admit,
                scored=scored,
            )
        ]
    rows = [r.json() for r in results]
    # what crosses PCIe a token: a miss reads an expert, a copied swap copies one (a rider crosses as a miss)
    for row, r in zip(rows, results):
        scored = _scored_tokens(r, ids.shape)
        row["misses_per_token"] = (r.lookups - r.hits) / scored if scored else 0.0
        row["swaps_per_token"] = r.swaps / scored if scored else 0.0
        row["copies_per_token"] = r.copies / scored if scored else 0.0
    if args.model is not None:
        for row, r in zip(rows, results):
            row["predicted_decode_tok_s"] = _predicted(args, ids, n_expert, r)
    if args.plot is not None:
        _plot(results, ids.shape, n_expert, args.trace.name, args.plot)
    if args.json:
        dump_json(rows)
        return 0
    pred = args.model is not None
    if args.sweep:
        _print_sweep(rows, ids.shape, n_expert, pred)
        if args.plot is not None:
            print(f"curve: {args.plot}")
        return 0
    print(
        f"{'slots/layer':>11}  {'policy':<9} {'hit rate':>8} {'swaps':>8} {'miss/tok':>8} {'copy/tok':>8}"
        + ("  pred tok/s" if pred else "")
    )
    for row, r in zip(rows, results):
        tail = f"  {row['predicted_decode_tok_s']:>10.1f}" if pred else ""
        print(
            f"{r.slots:>11}  {r.policy:<9} {r.hit_rate:>8.1%} {r.swaps:>8,} {row['misses_per_token']:>8.1f} "
            f"{row['copies_per_token']:>8.1f}{tail}"
        )
        if r.prefetch is not None:
            pf = r.prefetch
            print(
                f"{'':>11}  lookahead: {pf['used_parts']:,} of {pf['staged_parts']:,} staged parts used "
                f"({pf['accuracy']:.1%}); {pf['saved_bytes']:,} bytes read ahead, "
                f"{pf['wasted_bytes']:,} wasted"
            )
    return 0


def _score_range(
    text: str, recorded: bool, ids: np.ndarray, windows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """--score A:B: the trace cut after token B, its windows cut there, and the B - A tokens scored."""
    try:
        a, b = (int(v) for v in text.split(":"))
    except ValueError:
        a = b = -1
    if not recorded or not 0 <= a < b <= len(ids):
        why = "needs --recorded" if not recorded else f"tokens A:B with 0 <= A < B <= {len(ids):,}"
        raise ConfigError("--score", text, why)
    ends = np.cumsum(windows)
    kept = windows[: int(np.searchsorted(ends, b)) + 1].copy()
    kept[-1] -= int(kept.sum()) - b  # the window B falls in ends at B
    return ids[:b], kept, b - a


def _sizes(text: str, n_expert: int) -> list[int]:
    """Slots per layer; a size past the layer's experts is the whole layer (the default list meets small
    models)."""
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 0:
        raise ConfigError("--sizes", text, "slots per layer, comma-separated, each >= 0")
    return sorted({min(v, n_expert) for v in sizes})


def _print_sweep(rows: list[dict[str, Any]], shape: tuple[int, ...], n_expert: int, pred: bool) -> None:
    """Seed 003's table: cache size (slots a layer and the share of experts it holds) -> each policy's hit
    rate and the misses a token that are left, which set the speed (a 99% hit rate has a quarter of 96%'s),
    and the copies a token its hits cost (each moves an expert over the same link a miss reads)."""
    names = list(dict.fromkeys(str(r["policy"]) for r in rows))
    head = f"{'slots/layer':>11} {'experts':>8}"
    for n in names:
        head += f" | {n + ' hit':>12} {'miss/tok':>8} {'copy/tok':>8}" + (f" {'tok/s':>7}" if pred else "")
    print(head)
    for size in dict.fromkeys(int(r["slots"]) for r in rows):  # type: ignore[call-overload]
        line = f"{size:>11} {size / n_expert:>8.1%}"
        for n in names:
            r = next(r for r in rows if r["slots"] == size and r["policy"] == n)
            line += f" | {r['hit_rate']:>12.1%} {r['misses_per_token']:>8.1f} {r['copies_per_token']:>8.1f}"
            line += f" {r['predicted_decode_tok_s']:>7.1f}" if pred else ""
        print(line)


def _plot(results: list[sim.Result], shape: tuple[int, ...], n_expert: int, title: str, path: Path) -> None:
    """Hit rate and misses a token against slots per layer, a line per policy."""
    try:
        import matplotlib
    except ImportError as e:
        raise ConfigError("--plot", path, "needs matplotlib (pip install 'strata[bench]')") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, low) = plt.subplots(2, 1, figsize=(6.4, 6.4), sharex=True)
    per_token = shape[1] * shape[2]
    for name in dict.fromkeys(r.policy for r in results):
        mine = [r for r in results if r.policy == name]
        x = [r.slots for r in mine]
        top.plot(x, [100 * r.hit_rate for r in mine], "o-", label=name)
        low.plot(x, [(1 - r.hit_rate) * per_token for r in mine], "o-", label=name)
    top.set_ylabel("hit rate (%)")
    low.set_ylabel("misses a token (all layers)")
    low.set_xlabel(f"slots per layer (of {n_expert} experts)")
    sizes = sorted({r.slots for r in results})
    if sizes[0] > 0:
        low.set_xscale("log", base=2)
    low.set_xticks(sizes, [str(v) for v in sizes])
    for ax in (top, low):
        ax.grid(alpha=0.3)
    top.legend(fontsize=8)
    top.set_title(f"{title}: {shape[0]:,} tokens, {shape[1]} layers, top-{shape[2]}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _predicted(args: argparse.Namespace, ids: object, n_expert: int, r: sim.Result) -> float:
    """The planner's decode tok/s at the simulated hit rate and swaps, from the model's header
    (strata.tiers.plan)."""
    from strata.cli.plan import layer_us
    from strata.gguf import GGUFFile
    from strata.gpu.weights import weight_bytes
    from strata.models import model_class
    from strata.runtime.weights import WeightStore
    from strata.tiers.layout import ExpertLayout
    from strata.tiers.plan import pcie_decode_tok_s

    g = GGUFFile(args.model)
    layout = ExpertLayout.from_gguf(g)
    shape = getattr(ids, "shape", (0, 0, 0))
    if layout is None or (len(layout.layers), layout.n_expert, layout.top_k) != (
        shape[1],
        n_expert,
        shape[2],
    ):
        raise ConfigError(
            "--model",
            args.model,
            f"does not have the trace's {shape[1]} MoE layers of {n_expert} experts, top-{shape[2]}",
        )
    dense = sum(v for k, v in weight_bytes(g).items() if k not in ("experts", "embeddings"))
    scored = _scored_tokens(r, shape)
    ahead = swap = 0.0
    if r.prefetch is not None and scored:  # bytes read ahead a scored token
        ahead = float(r.prefetch["saved_bytes"]) / scored
    routed = layout.routed_bytes_per_token()
    if scored:  # each copied swap moves an expert of the mean routed size (riders cross as misses)
        swap = r.copies / scored * routed / (shape[1] * shape[2])
    cpu = model_class(g)(g, WeightStore(g, 0))
    floor = cpu.params.n_layer * layer_us(args, cpu) * 1e-6  # type: ignore[attr-defined]
    return pcie_decode_tok_s(dense, routed, r.hit_rate, args.hbm_gbps, args.pcie_gbps, ahead, floor, swap)


def _scored_tokens(r: sim.Result, shape: tuple[int, ...]) -> float:
    """Tokens a result scored: its lookups over the trace's layers x top_k."""
    return r.lookups / (shape[1] * shape[2])


def _ahead(args: argparse.Namespace) -> trace.Ahead | None:
    """The recorded lookahead to replay, at --prefetch K when given."""
    ahead = trace.load_ahead(args.trace)
    if args.prefetch is None:
        return ahead
    check_prefetch(args.prefetch)
    if ahead is None:
        if args.prefetch == 0:
            return None
        raise ConfigError(
            "--prefetch",
            args.prefetch,
            f"{args.trace} holds no predictions (record a run with --prefetch K and --record-routes)",
        )
    return dataclasses.replace(ahead, k=args.prefetch)

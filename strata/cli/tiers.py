"""`strata tiers trace --synthetic ... -o F.npz` and
`strata tiers simulate TRACE --slots N --policy P [--sweep] [--prefetch K] [--json]`: routing traces and the
policy simulator (strata.tiers.trace, .sim) for tier-tuning experiments."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from strata.cli.output import dump_json
from strata.errors import ConfigError
from strata.tiers import policy, sim, trace
from strata.tiers.lookahead import check_prefetch


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
    s.add_argument("--sweep", action="store_true", help="every policy at 32, 64, 128 and 256 slots per layer")
    s.add_argument(
        "--recorded",
        action="store_true",
        help="start from the placement the engine had when it recorded "
        "the trace (--record-routes) and swap between its passes, scoring the whole trace: the engine's "
        "own counters for the same policy",
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
    ahead = _ahead(args)
    if args.recorded:
        resident, windows, budget = trace.load_recorded(args.trace)
        if resident is None:
            raise ConfigError("--recorded", args.trace, "needs a trace written by --record-routes")
        results = [
            sim.simulate(
                ids, n_expert, 0, args.policy, resident=resident, windows=windows, budget=budget, ahead=ahead
            )
        ]
    elif args.sweep:
        results = sim.sweep(ids, n_expert, [32, 64, 128, 256])
    else:
        results = [sim.simulate(ids, n_expert, args.slots, args.policy, ahead=ahead)]
    rows = [r.json() for r in results]
    if args.model is not None:
        for row, r in zip(rows, results):
            row["predicted_decode_tok_s"] = _predicted(args, ids, n_expert, r)
    if args.json:
        dump_json(rows)
        return 0
    pred = args.model is not None
    print(
        f"{'slots/layer':>11}  {'policy':<9} {'hit rate':>8} {'swaps':>8}" + ("  pred tok/s" if pred else "")
    )
    for row, r in zip(rows, results):
        tail = f"  {row['predicted_decode_tok_s']:>10.1f}" if pred else ""
        print(f"{r.slots:>11}  {r.policy:<9} {r.hit_rate:>8.1%} {r.swaps:>8,}{tail}")
        if r.prefetch is not None:
            pf = r.prefetch
            print(
                f"{'':>11}  lookahead: {pf['used_parts']:,} of {pf['staged_parts']:,} staged parts used "
                f"({pf['accuracy']:.1%}); {pf['saved_bytes']:,} bytes read ahead, "
                f"{pf['wasted_bytes']:,} wasted"
            )
    return 0


def _predicted(args: argparse.Namespace, ids: object, n_expert: int, r: sim.Result) -> float:
    """The planner's decode tok/s at the simulated hit rate, from the model's header (strata.tiers.plan)."""
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
    ahead = 0.0
    if r.prefetch is not None and shape[0]:  # bytes read ahead a scored token
        ahead = float(r.prefetch["saved_bytes"]) / (r.lookups / (shape[1] * shape[2]))
    cpu = model_class(g)(g, WeightStore(g, 0))
    floor = cpu.params.n_layer * layer_us(args, cpu) * 1e-6  # type: ignore[attr-defined]
    return pcie_decode_tok_s(
        dense, layout.routed_bytes_per_token(), r.hit_rate, args.hbm_gbps, args.pcie_gbps, ahead, floor
    )


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

"""`strata bench [--url URL | --model F] [--scenarios ...] [--json FILE] [--out DIR]`: benchmark a server
(strata.bench) and print a table per scenario."""

from __future__ import annotations

import argparse
import sys

from strata.conf.bench import bench_config


def run_bench_command(args: argparse.Namespace) -> int:
    from strata.bench.plots import write_plots
    from strata.bench.report import tables, write_json
    from strata.bench.run import run_bench

    cfg = bench_config(args)
    result = run_bench(cfg)
    print(tables(result))
    if cfg.json is not None:
        write_json(result, cfg.json)
        print(f"json: {cfg.json}")
    if cfg.out is not None:
        try:
            for path in write_plots(result, cfg.out):
                print(f"plot: {path}")
        except ImportError:  # matplotlib is an extra: the numbers stand without the pictures
            print(
                "strata bench: matplotlib is not installed (pip install 'strata[bench]'): no plots",
                file=sys.stderr,
            )
    return 0

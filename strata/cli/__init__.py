"""Command line: `python -m strata serve|generate|info|bench|...`. Errors: one line on stderr, exit 1.

This module builds the parser and dispatches; each subcommand's flags and its run function live in the module
of its name (generate.py, info.py, plan.py, ...; serve's and bench's flags in strata.conf). They import
nothing from here, so no subcommand and the dispatcher import each other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from strata.errors import StrataError

EXIT_ERROR = 1


def _add_generate(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from strata.cli.generate import add_generate_flags

    add_generate_flags(sub.add_parser("generate", help="generate text from a prompt"))


def _add_info(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from strata.cli.info import add_info_flags

    add_info_flags(sub.add_parser("info", help="describe a GGUF file"))


def _add_synth(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from strata.cli.synth import add_synth_flags

    add_synth_flags(
        sub.add_parser("synth", help="write a synthetic Qwen3-MoE/Qwen3-Next GGUF (random weights)")
    )


def _add_plan(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from strata.cli.plan import add_plan_flags

    add_plan_flags(
        sub.add_parser(
            "plan",
            help="where a model's tensors would live under given budgets, and the "
            "speed that allows (reads only the header)",
        )
    )


def _add_tiers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from strata.cli.tiers import add_tiers_flags

    add_tiers_flags(sub.add_parser("tiers", help="routing traces and the expert-cache policy simulator"))


def _add_profile(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from strata.cli.profile import add_profile_flags

    add_profile_flags(
        sub.add_parser(
            "profile",
            help="count a model's expert routing over prompts and save it, so "
            "the expert cache starts from the experts the workload uses",
        )
    )


def _add_bench(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from strata.conf.bench import add_bench_flags

    add_bench_flags(
        sub.add_parser(
            "bench",
            help="benchmark a server (a running one at --url, or one started "
            "on --model): concurrency, prompt sizes, tools, thinking; a table, JSON, plots",
        )
    )


def _add_serve(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from strata.conf.server import add_server_flags

    add_server_flags(sub.add_parser("serve", help="OpenAI/Anthropic-compatible HTTP server (the default)"))
    sub.add_parser("pull", help="download and verify the default model ahead of the first run")


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as every other error: one line on stderr, exit 1."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"strata: error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="strata",
        description="Strata: tiered MoE inference for GGUF models. "
        "With no command, serves the default model on 127.0.0.1:8080.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(sub)
    _add_generate(sub)
    _add_info(sub)
    _add_synth(sub)
    _add_plan(sub)
    _add_tiers(sub)
    _add_profile(sub)
    _add_bench(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, "serve")  # `python -m strata [--port N ...]` means serve
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            from strata.api.server import serve
            from strata.conf.server import server_config

            return serve(server_config(args))
        if args.command == "pull":
            from strata.hub import default_model

            print(default_model.pull())
            return 0
        if args.command == "generate":
            from strata.cli.generate import run_generate

            return run_generate(args)
        if args.command == "info":
            from strata.cli.info import run_info

            return run_info(args)
        if args.command == "plan":
            from strata.cli.plan import run_plan

            return run_plan(args)
        if args.command == "tiers":
            from strata.cli.tiers import run_tiers

            return run_tiers(args)
        if args.command == "profile":
            from strata.cli.profile import run_profile

            return run_profile(args)
        if args.command == "bench":
            from strata.cli.bench import run_bench_command

            return run_bench_command(args)
        if args.command == "synth":
            from strata.cli.synth import run_synth

            return run_synth(args)
        build_parser().print_help()
        return 0
    except StrataError as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("strata: interrupted", file=sys.stderr)
        return 130
    except (OSError, MemoryError) as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return EXIT_ERROR

"""`strata bench` configuration: its flags, read once here and validated with errors that name the flag."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from strata.errors import ConfigError

# In the order they run; the default set is all of them at quick sizes.
SCENARIOS = ("concurrency", "context", "long", "tools", "thinking", "images", "prefill", "prefix")
EFFORTS = ("none", "minimal", "low", "medium", "high")  # OpenAI reasoning_effort


@dataclass(frozen=True, slots=True)
class BenchConfig:
    url: str | None = None  # a running server; None = start one on `model`
    api_key: str = ""
    model: str | None = None  # None (and no url) = the default model, as `serve` does
    serve_args: tuple[str, ...] = ()  # extra `strata serve` flags for the server bench starts
    pid: int | None = None  # the server's process for the sampler (found from a loopback url when None)
    scenarios: tuple[str, ...] = SCENARIOS
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    tokens: int = 64  # max_tokens of each request, except the long generation's
    contexts: tuple[int, ...] = (
        128,
        512,
        2048,
        8192,
    )  # prompt sizes in tokens (those past n_ctx are skipped)
    long_tokens: int = 1024
    # tokens of the long prompt in the prefill and prefix scenarios, and of the tool loop's system prompt
    long_prompt: int = 2048
    tool_rounds: int = 3
    tool_result: int = 256  # tokens of each file the tool loop's read_file returns
    efforts: tuple[str, ...] = ("low", "high")
    sample_hz: float = 2.0
    json: Path | None = None
    out: Path | None = None  # folder for the PNG plots

    def validate(self) -> None:
        if self.url is not None:
            u = urlparse(self.url)
            if u.scheme not in ("http", "https") or not u.netloc:
                raise ConfigError("--url", self.url, "must be http(s)://host[:port]")
            if self.model is not None or self.serve_args:
                raise ConfigError(
                    "--url", self.url, "benchmarks a running server: drop --model and --serve-args"
                )
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown or not self.scenarios:
            raise ConfigError("--scenarios", ",".join(self.scenarios), f"choose from {', '.join(SCENARIOS)}")
        for flag, values, top in (
            ("--concurrency", self.concurrency, 256),
            ("--contexts", self.contexts, 1 << 21),
        ):
            if not values or any(not 1 <= v <= top for v in values):
                raise ConfigError(flag, ",".join(map(str, values)), f"must be integers in 1..{top}")
        # a decode rate needs a token after the first
        for flag, v, low in (
            ("--tokens", self.tokens, 2),
            ("--long-tokens", self.long_tokens, 2),
            ("--long-prompt", self.long_prompt, 1),
            ("--tool-rounds", self.tool_rounds, 1),
            ("--tool-result", self.tool_result, 1),
        ):
            if v < low:
                raise ConfigError(flag, v, f"must be >= {low}")
        bad = [e for e in self.efforts if e not in EFFORTS]
        if bad or not self.efforts:
            raise ConfigError("--efforts", ",".join(self.efforts), f"choose from {', '.join(EFFORTS)}")
        if not 0 < self.sample_hz <= 50:
            raise ConfigError("--sample-hz", self.sample_hz, "must be in (0, 50]")


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(flag, text, "must be comma-separated integers") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_bench_flags(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    p.add_argument(
        "--url",
        default=None,
        help="benchmark a running server (default: start `strata serve` on "
        "--model in a child process, on a free loopback port)",
    )
    p.add_argument("--api-key", default="", help="the running server's key (with --url)")
    p.add_argument("--model", "-m", default=None, help="GGUF to serve (default: the default model)")
    p.add_argument(
        "--serve-args",
        default="",
        help='extra `strata serve` flags, one string: "--parallel 8 --ctx-size 16384"',
    )
    p.add_argument(
        "--pid",
        type=int,
        default=None,
        help="the server's process id for the sampler's RSS / IO / "
        "CPU series (default: the process listening on a loopback --url's port)",
    )
    p.add_argument(
        "--scenarios", default=",".join(d.scenarios), help=f"comma-separated, from {', '.join(SCENARIOS)}"
    )
    p.add_argument("--concurrency", default=",".join(map(str, d.concurrency)), help="the sweep's levels")
    p.add_argument("--tokens", type=int, default=d.tokens, help="max_tokens of each request")
    p.add_argument("--contexts", default=",".join(map(str, d.contexts)), help="prompt sizes in tokens")
    p.add_argument("--long-tokens", type=int, default=d.long_tokens, help="tokens of the long generation")
    p.add_argument(
        "--long-prompt",
        type=int,
        default=d.long_prompt,
        help="tokens of the long prompt in the prefill-interference and prefix-reuse scenarios, and of the "
        "tool loop's system prompt",
    )
    p.add_argument(
        "--tool-rounds", type=int, default=d.tool_rounds, help="tool-call round trips in the tool loop"
    )
    p.add_argument(
        "--tool-result", type=int, default=d.tool_result, help="tokens of each file the tool loop reads"
    )
    p.add_argument(
        "--efforts", default=",".join(d.efforts), help=f"reasoning_effort values, from {', '.join(EFFORTS)}"
    )
    p.add_argument("--sample-hz", type=float, default=d.sample_hz, help="the sampler's rate")
    p.add_argument("--json", type=Path, default=None, help="write every row, request and sample to this file")
    p.add_argument("--out", type=Path, default=None, help="folder for the PNG plots (needs matplotlib)")


def bench_config(args: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig(
        url=args.url.rstrip("/") if args.url else None,
        api_key=args.api_key,
        model=args.model,
        serve_args=tuple(shlex.split(args.serve_args)),
        pid=args.pid,
        scenarios=_names(args.scenarios),
        concurrency=_ints("--concurrency", args.concurrency),
        tokens=args.tokens,
        contexts=_ints("--contexts", args.contexts),
        long_tokens=args.long_tokens,
        long_prompt=args.long_prompt,
        tool_rounds=args.tool_rounds,
        tool_result=args.tool_result,
        efforts=_names(args.efforts),
        sample_hz=args.sample_hz,
        json=args.json,
        out=args.out,
    )
    cfg.validate()
    return cfg

"""`strata generate`: stream a completion, or print one JSON object with --json."""

from __future__ import annotations

import argparse
import os
import sys

from strata.cli.output import dump_json
from strata.conf.engine import add_backend_flags, backend_options
from strata.conf.logs import add_log_flags
from strata.console.logs import configure_logging
from strata.engine import Engine
from strata.errors import ConfigError
from strata.sampling.params import SamplingError, SamplingParams
from strata.tiers.telemetry import hit_rate_line


def add_generate_flags(g: argparse.ArgumentParser) -> None:
    g.add_argument(
        "--model",
        "-m",
        default=None,
        help="path to a GGUF file (default: $STRATA_MODEL, else the default model, fetched on first use)",
    )
    g.add_argument("--prompt", "-p", required=True, help="prompt text (a user message with --chat)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--system", default=None, help="system message for --chat")
    g.add_argument("--max-tokens", "-n", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--min-p", type=float, default=0.05)
    g.add_argument("--repeat-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ctx-size", type=int, default=0, help="context size (0 = the model's)")
    g.add_argument("--no-think", action="store_true", help="ask thinking templates not to think")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    add_backend_flags(g)
    add_log_flags(g)


def _params(args: argparse.Namespace) -> SamplingParams:
    p = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
    )
    try:
        p.validate()
    except SamplingError as e:
        flag, _, rest = str(e).partition("=")
        raise ConfigError(
            "--" + flag.replace("_", "-"), getattr(args, flag, None), rest.split(" ", 1)[-1]
        ) from None
    if args.max_tokens < 0:
        raise ConfigError("--max-tokens", args.max_tokens, "must be >= 0")
    return p


def run_generate(args: argparse.Namespace) -> int:
    configure_logging(args.log_format)
    params = _params(args)
    model = args.model or os.environ.get("STRATA_MODEL") or None  # None: the default model
    engine = Engine.load(model, n_ctx=args.ctx_size, **backend_options(args))
    if args.chat:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.prompt})
        kw = {"enable_thinking": False} if args.no_think else {}
        gen = engine.generate(
            messages=messages, max_tokens=args.max_tokens, params=params, stop=args.stop, template_kw=kw
        )
    else:
        gen = engine.generate(args.prompt, max_tokens=args.max_tokens, params=params, stop=args.stop)
    if args.json:
        r = gen.run()
        dump_json(
            {
                "prompt_ids": r.prompt_ids,
                "tokens": r.tokens,
                "text": r.text,
                "finish_reason": r.finish_reason.value,
                "timings": r.timings.to_dict(),
            }
        )
        return 0
    for chunk in gen:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    t = gen.result.timings.to_dict()
    print(
        f"[prompt {t['prompt_n']} tok, {t['prompt_per_second']} tok/s | "
        f"generated {t['predicted_n']} tok, {t['predicted_per_second']} tok/s]",
        file=sys.stderr,
    )
    if (use := gen.result.timings.experts) is not None:
        print(hit_rate_line(use.prefill, "prefill"), file=sys.stderr)
        print(hit_rate_line(use.decode, "decode"), file=sys.stderr)
        if engine.expert_cache is not None and engine.expert_cache.prefetch.staged:
            print(engine.expert_cache.prefetch.line(), file=sys.stderr)
    return 0

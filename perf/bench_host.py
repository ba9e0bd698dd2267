"""The server's host side without a GPU: the real server (HTTP app, scheduler, prefix cache, tokenizer, chat
template, detokenizer, SSE) in front of perf/host_stub.py's stand-in for the GPU model, driven by `strata
bench`'s scenarios.

    python perf/bench_host.py bench [--gpu h200|h100-24g|zero] [--profile F] [--server-log F] \\
        [--serve-args "--parallel 4 ..."] [strata bench flags]
    python perf/bench_host.py serve [--gpu h200|h100-24g|zero] [--profile F] [strata serve flags]

`bench` starts `serve` in a child process, as `strata bench --model` starts `strata serve`, and prints
strata bench's tables. --gpu h200 (default) waits what the H200 takes on the 80B shape (host_stub.GpuTimes),
h100-24g what an H100 takes at a 24 GiB budget, zero makes the model free (only the host's cost is left).
--profile writes the event loop's cProfile stats
(the HTTP side and the scheduler; not the engine thread) when the server exits. The model file only
gives the tokenizer and the chat template: by default the tiny Qwen3-Next fixture (the real Qwen3
tokenizer), built by tests/oracle on first use.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import shlex
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from host_stub import SCRIPT, GpuTimes, StubModel

from strata.conf.bench import add_bench_flags, bench_config
from strata.conf.engine import EngineOptions
from strata.conf.server import ServerConfig, add_server_flags, server_config
from strata.gpu.plan import AUTO_CHUNKS

CONTEXT = 262_144  # what the stand-in claims to be trained for: any --ctx-size fits


def _stub_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu",
        choices=("h200", "h100-24g", "zero"),
        default="h200",
        help="the stand-in's forward times: the 80B all-resident on the H200, at 24 GiB on an H100, or none",
    )
    p.add_argument("--pcie-gb-s", type=float, default=None, help="snapshot and restore copies (h200: 44)")
    p.add_argument("--eager-host-ms", type=float, default=None, help="an eager pass's launches (h200: 35)")
    p.add_argument("--profile", type=Path, default=None, help="the event loop's cProfile, written at exit")


def default_model() -> str:
    from oracle import flagship

    return str(flagship.tiny_qwen3next()["q8_0"])


def stub_loader(times: GpuTimes):  # type: ignore[no-untyped-def]
    """api.server.serve's `load`: the file's tokenizer and template, the stand-in model behind them."""

    def load(cfg: ServerConfig, path: Path, n_ctx: int):  # type: ignore[no-untyped-def]
        from strata.api.server import app_state
        from strata.engine import Engine
        from strata.gguf import GGUFFile
        from strata.text.tokenizer import Tokenizer

        gguf = GGUFFile(path)
        tok = Tokenizer.from_gguf(gguf)
        model = StubModel(tok.encode(SCRIPT), times=times, max_batch=cfg.parallel)
        chunk = cfg.engine.get("prefill_chunk") or AUTO_CHUNKS[0]  # as the GPU's engine chooses (--prefill)
        opts = EngineOptions.from_kwargs(n_ctx=n_ctx or 16_384, prefill_chunk=chunk, n_seq=cfg.parallel)
        return app_state(cfg, Engine(gguf, model, tok, opts), cfg.alias or path.stem)  # type: ignore[arg-type]

    return load


def serve_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_host.py serve")
    add_server_flags(p)
    _stub_flags(p)
    p.add_argument("--server-log", type=Path, default=None, help="write the server's output here")
    args = p.parse_args(argv)
    if args.server_log is not None:  # the child's stderr goes to a file nobody keeps
        fd = os.open(args.server_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    args.model = args.model or default_model()
    from strata.gguf import GGUFFile

    arch = GGUFFile(args.model).architecture
    args.override_kv = [*args.override_kv, f"{arch}.context_length=int:{CONTEXT}"]
    cfg = server_config(args)
    times = {"h200": GpuTimes, "h100-24g": GpuTimes.h100_24g, "zero": GpuTimes.zero}[args.gpu]()
    given = {"pcie_gb_s": args.pcie_gb_s, "eager_host_ms": args.eager_host_ms}
    times = dataclasses.replace(times, **{k: v for k, v in given.items() if v is not None})
    from strata.api.server import serve

    if args.profile is None:
        return serve(cfg, stub_loader(times))
    # uvicorn raises the SIGTERM it caught again once done: exit through the finally below, not die of it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    prof = cProfile.Profile()
    prof.enable()  # this thread runs the event loop
    try:
        return serve(cfg, stub_loader(times))
    finally:
        prof.disable()
        prof.dump_stats(args.profile)


def bench_main(argv: list[str]) -> int:
    from strata.bench.report import tables, write_json
    from strata.bench.run import run_bench

    p = argparse.ArgumentParser(prog="bench_host.py bench")
    add_bench_flags(p)
    _stub_flags(p)
    p.add_argument("--server-log", type=Path, default=None, help="keep the server's output here")
    args = p.parse_args(argv)
    serve_args = shlex.split(args.serve_args)
    args.serve_args = ""
    cfg = bench_config(args)
    child = [str(Path(__file__).resolve()), "serve", "--gpu", args.gpu]
    for flag, value in (("--pcie-gb-s", args.pcie_gb_s), ("--eager-host-ms", args.eager_host_ms)):
        child += [flag, str(value)] if value is not None else []
    if args.profile is not None:
        child += ["--profile", str(args.profile.resolve())]
    if args.server_log is not None:
        child += ["--server-log", str(args.server_log.resolve())]
    if args.model is not None:
        child += ["--model", args.model]
    result = run_bench(dataclasses.replace(cfg, model=None), [*child, *serve_args])
    print(tables(result))
    if cfg.json is not None:
        write_json(result, cfg.json)
    return 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("serve", "bench"):
        print(__doc__, file=sys.stderr)
        return 2
    return (serve_main if sys.argv[1] == "serve" else bench_main)(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

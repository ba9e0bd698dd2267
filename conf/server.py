"""Server configuration: flags (named like llama-server's where they overlap) and the two
environment variables, read once here and validated with errors that name the flag."""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.conf.engine import add_backend_flags, backend_options
from strata.conf.logs import add_log_flags, check_log_format
from strata.errors import ConfigError

ENV_MODEL = "STRATA_MODEL"
ENV_API_KEY = "STRATA_API_KEY"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model: str | None = None  # None = the embedded default model (fetched on first run)
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    ctx_size: int = (
        0  # 0 = the trained context when its KV fits, else the largest that does (tiers/context.py)
    )
    parallel: int = 4
    n_predict: int = 0  # most tokens a request generates, whatever it asks (0 or -1: up to the context)
    alias: str | None = None
    strict_model: bool = False
    queue_limit: int = 0  # 0 = unbounded FIFO; else overflow gets 429 / 529
    weight_cache_mib: int = 4096
    # Engine.load keywords from the engine flags (conf/engine.py backend_options, checked there), the same on
    # serve, generate and the Python API
    engine: dict[str, Any] = field(default_factory=dict)
    prompt_cache: bool = True
    cache_ram_mib: int = 1024  # prefix cache budget
    decode_ahead: bool = True  # decode windows queued one ahead of the host's work (sched/ahead.py)
    max_body_mib: float = 16.0  # larger request bodies get a 413
    watchdog_s: float = (
        60.0  # /health turns 503 when the scheduler makes no progress this long with work waiting
    )
    shutdown_grace_s: float = 10.0  # after SIGTERM: in-flight requests get this long to finish
    test_hooks: bool = False  # exposes POST /debug/fault for the crash-epoch tests
    verbose: bool = False
    log_format: str = "text"  # text | json (strata/console/logs.py)

    def validate(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError("--port", self.port, "must be 1..65535")
        if self.host not in ("localhost", "0.0.0.0", "::"):
            try:
                ipaddress.ip_address(self.host)
            except ValueError:
                raise ConfigError("--host", self.host, "must be an IP address or localhost") from None
        if self.ctx_size < 0:
            raise ConfigError("--ctx-size", self.ctx_size, "must be >= 0 (0 = model default)")
        if not 1 <= self.parallel <= 64:
            raise ConfigError("--parallel", self.parallel, "must be 1..64")
        if self.n_predict < -1:
            raise ConfigError("--n-predict", self.n_predict, "must be >= -1 (0 or -1 = up to the context)")
        if self.queue_limit < 0:
            raise ConfigError("--queue-limit", self.queue_limit, "must be >= 0 (0 = unbounded)")
        if self.cache_ram_mib < 0:
            raise ConfigError("--cache-ram-mib", self.cache_ram_mib, "must be >= 0")
        if self.weight_cache_mib < 0:
            raise ConfigError("--weight-cache-mib", self.weight_cache_mib, "must be >= 0")
        for flag, value in (
            ("--max-body-mib", self.max_body_mib),
            ("--watchdog-s", self.watchdog_s),
            ("--shutdown-grace-s", self.shutdown_grace_s),
        ):
            if not 0 < value < 1e6:  # also refuses nan and inf
                raise ConfigError(flag, value, "must be a positive number")
        check_log_format(self.log_format)
        for k in self.api_keys:
            if not k or any(c.isspace() for c in k):
                raise ConfigError("--api-key", "***", "keys must be non-empty and contain no whitespace")
        if self.model is not None:
            path = Path(self.model)
            if path.is_dir():
                raise ConfigError("--model", self.model, "is a directory; give the path of a .gguf file")
            if not path.is_file():
                raise ConfigError("--model", self.model, "no such file")


def add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", "-m", default=None, help=f"GGUF to serve (default: ${ENV_MODEL} or SmolLM2-135M)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", action="append", default=[], help="accepted key (repeatable)")
    p.add_argument("--api-key-file", default=None, help="file with one accepted key per line")
    p.add_argument(
        "--ctx-size",
        "-c",
        type=int,
        default=0,
        help="context size, at most the trained "
        "context (0: the trained context when its KV fits the memory plan, else the largest that does; "
        "start-up says which and why)",
    )
    p.add_argument("--parallel", "-np", type=int, default=4, help="batch slots")
    p.add_argument(
        "--n-predict",
        "-n",
        type=int,
        default=0,
        help="most tokens one request generates, whatever its max_tokens asks (0 or -1: up to the context)",
    )
    p.add_argument("--alias", default=None, help="model name reported by /v1/models")
    p.add_argument("--strict-model", action="store_true", help="404 for requests naming another model")
    p.add_argument("--queue-limit", type=int, default=0, help="max queued requests (0 = unbounded)")
    p.add_argument("--weight-cache-mib", type=int, default=4096)
    add_backend_flags(p)
    p.add_argument("--prompt-cache", choices=("on", "off"), default="on", help="reuse cached prompt prefixes")
    p.add_argument("--cache-ram-mib", type=int, default=1024, help="RAM for the prompt prefix cache")
    p.add_argument(
        "--decode-ahead",
        choices=("on", "off"),
        default="on",
        help="queue each decode step before the host has handled the last one's tokens (off: one at a "
        "time, the host's sampling, detokenising and SSE between steps; for comparison)",
    )
    p.add_argument(
        "--max-body-mib", type=float, default=16.0, help="largest request body (MiB); more is a 413"
    )
    p.add_argument(
        "--watchdog-s",
        type=float,
        default=60.0,
        help="/health reports 503 when the scheduler makes no progress this long while work waits",
    )
    p.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=10.0,
        help="on SIGTERM, how long in-flight requests may take to finish (a second SIGTERM exits now)",
    )
    p.add_argument("--test-hooks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="request logs, and each window's cost and the pacer's model",
    )
    add_log_flags(p)


def server_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ServerConfig:
    """Flags win over the environment; the environment is read here and nowhere else."""
    env = os.environ if env is None else env
    keys = list(args.api_key)
    if args.api_key_file:
        try:
            keys += [ln.strip() for ln in Path(args.api_key_file).read_text().splitlines() if ln.strip()]
        except OSError as e:
            raise ConfigError("--api-key-file", args.api_key_file, e.strerror or "unreadable") from None
    if not keys and env.get(ENV_API_KEY):
        keys = [k for k in env[ENV_API_KEY].split(",") if k]
    cfg = ServerConfig(
        model=args.model or env.get(ENV_MODEL) or None,
        host=args.host,
        port=args.port,
        api_keys=tuple(keys),
        ctx_size=args.ctx_size,
        parallel=args.parallel,
        n_predict=args.n_predict,
        alias=args.alias,
        strict_model=args.strict_model,
        queue_limit=args.queue_limit,
        weight_cache_mib=args.weight_cache_mib,
        verbose=args.verbose,
        log_format=args.log_format,
        engine=backend_options(args),
        prompt_cache=args.prompt_cache == "on",
        cache_ram_mib=args.cache_ram_mib,
        test_hooks=args.test_hooks,
        decode_ahead=args.decode_ahead == "on",
        max_body_mib=args.max_body_mib,
        watchdog_s=args.watchdog_s,
        shutdown_grace_s=args.shutdown_grace_s,
    )
    cfg.validate()
    return cfg

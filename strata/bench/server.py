"""The server under test: `strata serve` started in a child process on a free loopback port, or a running one
at --url. A child rather than a thread, so the client's event loop never shares the engine's interpreter
and the sampler's process series are the server's alone."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO
from urllib.parse import urlparse

import httpx
import psutil

from strata.conf.bench import BenchConfig
from strata.errors import StrataError

READY_TIMEOUT_S = 900  # a large model from a cold disk takes minutes to load


class BenchError(StrataError):
    """The server under test did not start, or cannot be reached."""


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    key: str
    pid: int | None  # for the sampler; None when the server is not a process here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_pid(url: str) -> int | None:
    """The process listening on a loopback url's port, when it is one of ours to see."""
    u = urlparse(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return None
    return next(
        (
            c.pid
            for c in conns
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid is not None
        ),
        None,
    )


SERVE = ("-m", "strata", "serve")  # the child's arguments to the interpreter, before its port, key and flags


@contextmanager
def target(cfg: BenchConfig, serve: Sequence[str] = SERVE) -> Iterator[Target]:
    """The server at --url, or one started as `python <serve> --port P --api-key K [--model F] <serve_args>`
    (perf/bench_host.py starts its stand-in model's server so)."""
    if cfg.url is not None:
        try:
            httpx.get(f"{cfg.url}/health", timeout=10).raise_for_status()
        except httpx.HTTPError as e:
            raise BenchError(f"{cfg.url}/health: {e}") from None
        yield Target(cfg.url, cfg.api_key, cfg.pid or listening_pid(cfg.url))
        return
    port, key = _free_port(), "sk-bench-" + secrets.token_hex(8)
    cmd = [
        sys.executable,
        *serve,
        "--port",
        str(port),
        "--api-key",
        key,
        *(["--model", cfg.model] if cfg.model else []),
        *cfg.serve_args,
    ]
    # a file, not a pipe: nobody drains a pipe while the bench runs, and a full one blocks the server
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(proc, url, log)
            yield Target(url, key, proc.pid)
        finally:
            stop(proc, 30)


def stop(proc: subprocess.Popen[str], timeout_s: float) -> None:
    """SIGTERM (the server drains and exits), then SIGKILL if it is still there after timeout_s."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_ready(proc: subprocess.Popen[str], url: str, log: IO[str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read()[-2000:].rstrip()
            raise BenchError(f"the server exited with {proc.returncode} before it was ready:\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise BenchError(f"the server was not ready within {READY_TIMEOUT_S} s")

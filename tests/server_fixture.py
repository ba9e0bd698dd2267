"""Start the real server (uvicorn on a free loopback port) in a subprocess for black-box tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from strata.bench.server import stop

API_KEY = "sk-strata-test"


@dataclass(frozen=True)
class Server:
    url: str
    key: str
    proc: subprocess.Popen[str]
    log: IO[str]  # the server's stdout and stderr

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(model: Path, *extra: str, key: str | None = API_KEY) -> Iterator[Server]:
    """key=None starts an open server (no --api-key)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "strata",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        *(["--api-key", key] if key else []),
        "--ctx-size",
        "2048",
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # A file, not a pipe: nobody drains a pipe during the tests, and a full pipe blocks the server.
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"server exited early:\n{log.read()}")
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            else:
                raise RuntimeError("server did not become healthy within 120 s")
            yield Server(url, key or "", proc, log)
        finally:
            stop(proc, 15)

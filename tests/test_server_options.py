"""Server flags: an open server warns, --strict-model 404s unknown names, --queue-limit overflows
into 429 (OpenAI) / 529 overloaded_error (Anthropic) with Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_fixture import Server, running_server


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[Server]:
    with running_server(
        smollm2_path, "--strict-model", "--alias", "smol", "--parallel", "1", "--queue-limit", "1", key=None
    ) as s:
        yield s


def test_open_server_warns_and_serves_without_a_key(server: Server) -> None:
    assert "no API key set" in server.output()
    assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"] == "smol"


def test_strict_model_rejects_other_names(server: Server) -> None:
    msg = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{server.url}/v1/chat/completions", json={**msg, "model": "gpt-4o"})
    assert r.status_code == 404 and "smol" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/messages", json={**msg, "model": "claude"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert httpx.post(f"{server.url}/v1/chat/completions", json={**msg, "model": "smol"}).status_code == 200


def test_queue_overflow_is_429_or_529_with_retry_after(server: Server) -> None:
    long = {
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": 200,
        "ignore_eos": True,
        "model": "smol",
    }

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as c:
            running = asyncio.create_task(c.post("/v1/chat/completions", json=long))  # takes the slot
            await asyncio.sleep(0.5)
            queued = asyncio.create_task(c.post("/v1/chat/completions", json=long))  # fills the queue
            await asyncio.sleep(0.5)
            over_oa = await c.post("/v1/chat/completions", json=long)
            over_an = await c.post("/v1/messages", json={**long, "max_tokens": 5})
            return [over_oa, over_an, await running, await queued]

    over_oa, over_an, first, second = asyncio.run(go())
    assert over_oa.status_code == 429 and int(over_oa.headers["retry-after"]) >= 1
    assert over_oa.json()["error"]["code"] == "queue_full"
    assert over_an.status_code == 529 and over_an.json()["error"]["type"] == "overloaded_error"
    assert "retry-after" in over_an.headers
    assert first.status_code == 200 and second.status_code == 200  # nobody queued was dropped


def test_server_flags_are_validated_with_the_flag_name(smollm2_path: Path) -> None:
    import subprocess
    import sys

    for flag, value in (
        ("--device", "tpu"),
        ("--vram-budget-mib", "-1"),
        ("--parallel", "0"),
        ("--n-predict", "-2"),
        ("--backend", "fortran"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "strata", "serve", "--model", str(smollm2_path), flag, value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0 and flag in out.stderr, (flag, out.stderr)
        assert "Traceback" not in out.stderr


def test_n_predict_caps_every_request(smollm2_path: Path) -> None:
    """--n-predict (llama-server's -n): no request generates more, whatever its max_tokens; /props says it."""
    ask = {"messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 40, "ignore_eos": True}
    with running_server(smollm2_path, "--n-predict", "3", "--parallel", "1", key=None) as s:
        chat = httpx.post(f"{s.url}/v1/chat/completions", json=ask, timeout=120).json()
        done = httpx.post(
            f"{s.url}/v1/completions", json={"prompt": "One", "max_tokens": 2}, timeout=120
        ).json()
        props = httpx.get(f"{s.url}/props").json()
    assert chat["usage"]["completion_tokens"] == 3 and chat["choices"][0]["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] <= 2, "a smaller max_tokens still holds"
    assert props["n_predict"] == 3


def test_engine_flags_reach_the_engine_on_serve(smollm2_path: Path) -> None:
    """Every engine flag means on `serve` what it means on `generate` and in Engine.load: the server hands
    conf/engine.py's backend_options to Engine.load unchanged (tier policy, split and profile flags
    included)."""
    from strata.cli import build_parser
    from strata.conf.engine import backend_options
    from strata.conf.server import server_config

    argv = [
        "--model",
        str(smollm2_path),
        "--cache-policy",
        "adaptive",
        "--pcie-frac",
        "0.5",
        "--swap-budget-mib",
        "8",
        "--routing-profile",
        "off",
        "--expert-cache",
        "40%",
        "--prefill",
        "256",
        "--kv-grow",
        "--decode-ahead",
        "off",
    ]
    serve = build_parser().parse_args(["serve", *argv])
    cfg = server_config(serve, env={})
    assert cfg.engine == backend_options(build_parser().parse_args(["generate", "--prompt", "x", *argv[:-2]]))
    assert cfg.engine["cache_policy"] == "adaptive" and cfg.engine["swap_budget_mib"] == 8
    assert cfg.engine["prefill_chunk"] == 256 and not cfg.decode_ahead
    assert cfg.engine["kv_grow"] is True

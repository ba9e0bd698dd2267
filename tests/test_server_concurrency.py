"""Concurrency through the real server: batched == solo, queueing past the slots, disconnects,
the crash epoch, and prefix reuse."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_fixture import Server, running_server

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary color.",
    "What is 2+2?",
    "Say hello.",
    "What is the largest ocean?",
    "Name a fruit.",
]


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[Server]:
    with running_server(smollm2_path, "--parallel", "4", "--test-hooks") as s:
        yield s


def body(q: str, n: int = 12, **kw: object) -> dict:
    return {"messages": [{"role": "user", "content": q}], "max_tokens": n, "temperature": 0, **kw}


async def ask(c: httpx.AsyncClient, payload: dict) -> httpx.Response:
    return await c.post("/v1/chat/completions", json=payload)


def text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def aclient(server: Server) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {server.key}"}, timeout=300
    )


def test_concurrent_equals_solo_and_overflow_queues(server: Server) -> None:
    async def go() -> None:
        async with aclient(server) as c:
            alone = [text(await ask(c, body(q))) for q in QUESTIONS]
            together = await asyncio.gather(*(ask(c, body(q)) for q in QUESTIONS))  # 6 requests, 4 slots
            assert [text(r) for r in together] == alone

    asyncio.run(go())


def test_disconnect_leaves_other_streams_intact(server: Server) -> None:
    async def go() -> None:
        async with aclient(server) as c:
            want = text(await ask(c, body(QUESTIONS[0], 16)))

            async def quitter() -> None:
                async with c.stream(
                    "POST",
                    "/v1/chat/completions",
                    json=body("Count to a thousand.", 500, stream=True, ignore_eos=True),
                ) as r:
                    async for i, _ in _aenum(r.aiter_lines()):
                        if i > 6:
                            return

            survivor, _ = await asyncio.gather(ask(c, body(QUESTIONS[0], 16)), quitter())
            assert text(survivor) == want
            for _ in range(100):
                if (await c.get("/v1/status")).json()["busy_slots"] == 0:
                    break
                await asyncio.sleep(0.1)
            assert (await c.get("/v1/status")).json()["busy_slots"] == 0
            assert text(await ask(c, body(QUESTIONS[1], 4)))  # the freed slot serves again

    asyncio.run(go())


async def _aenum(it):  # type: ignore[no-untyped-def]
    i = 0
    async for x in it:
        yield i, x
        i += 1


def test_injected_window_fault_is_503_then_recovers(server: Server) -> None:
    async def go() -> None:
        async with aclient(server) as c:
            epoch = (await c.get("/v1/status")).json()["epoch"]
            assert (await c.post("/debug/fault")).status_code == 200
            failed = await ask(c, body(QUESTIONS[2], 8))
            assert failed.status_code == 503
            assert "injected" in failed.json()["error"]["message"]
            assert (await c.get("/v1/status")).json()["epoch"] == epoch + 1
            assert text(await ask(c, body(QUESTIONS[2], 8)))

    asyncio.run(go())


def test_repeated_long_prompt_reuses_its_prefix(server: Server) -> None:
    long_q = "Here are some notes. " * 60 + "Summarise them in one word."
    with server.client() as c:
        first = c.post("/v1/chat/completions", json=body(long_q, 6)).json()
        second = c.post("/v1/chat/completions", json=body(long_q, 6)).json()
    assert second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] - 1 > 300
    assert second["timings"]["prompt_n"] < first["timings"]["prompt_n"]

"""The async streaming client: OpenAI chat completions over SSE, a timestamp at every chunk that carries
generated text, tool calls accumulated the way OpenAI streams them (fragments by index)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from strata.bench.stats import Stream


def connect(url: str, api_key: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # no pool limit: the concurrency sweep opens as many streams as it asks for
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=3600, limits=limits)


def _take(s: Stream, ev: dict[str, Any], now: float) -> None:
    if "error" in ev:
        s.error = str(ev["error"].get("message", ev["error"]))
        return
    if usage := ev.get("usage"):
        s.usage_tokens = usage.get("completion_tokens")
        s.prompt_tokens = usage.get("prompt_tokens", 0)
        s.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    if (timings := ev.get("timings")) and "prompt_ms" in timings:  # Strata's and llama-server's last chunk
        s.prompt_ms = timings["prompt_ms"]
    for choice in ev.get("choices") or ():
        delta = choice.get("delta") or {}
        text, thought, calls = delta.get("content"), delta.get("reasoning_content"), delta.get("tool_calls")
        if text or thought or calls:
            s.stamps.append(now)
        s.content_chars += len(text or "")
        s.reasoning_chars += len(thought or "")
        for c in calls or ():
            while len(s.tool_calls) <= c.get("index", 0):
                s.tool_calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            acc, fn = s.tool_calls[c.get("index", 0)], c.get("function") or {}
            acc["id"] = c.get("id") or acc["id"]
            acc["function"]["name"] += fn.get("name") or ""
            acc["function"]["arguments"] += fn.get("arguments") or ""
        s.finish_reason = choice.get("finish_reason") or s.finish_reason


async def stream_chat(c: httpx.AsyncClient, body: dict[str, Any]) -> Stream:
    """POST a streamed chat completion and record it; failures land in Stream.error, never raise."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    s = Stream(time.perf_counter())
    try:
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {(await r.aread())[:300].decode(errors='replace')}"
                return s
            async for line in r.aiter_lines():
                now = time.perf_counter()  # before parsing: the stamp is the arrival, not our work
                if line.startswith("data: ") and line != "data: [DONE]":
                    _take(s, orjson.loads(line[6:]), now)
    except httpx.HTTPError as e:
        s.error = f"{type(e).__name__}: {e}"
    if not s.stamps and s.error is None:
        s.error = "no tokens"
    return s

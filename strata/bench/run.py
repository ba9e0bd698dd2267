"""Run the chosen scenarios against the target with the sampler going, and gather one result: rows per
scenario (joules per token added where the GPU's power is known), the samples, and the bench's own cost."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx

from strata.bench import features, scenarios
from strata.bench.client import connect
from strata.bench.report import run_meta
from strata.bench.sampler import Sampler
from strata.bench.scenarios import Bench, Row, Skipped, ask
from strata.bench.server import SERVE, BenchError, Target, target
from strata.conf.bench import SCENARIOS, BenchConfig

RUNS: dict[str, Callable[[Bench], Awaitable[list[Row]]]] = {
    "concurrency": scenarios.concurrency,
    "context": scenarios.context,
    "long": scenarios.long,
    "tools": features.tools,
    "thinking": features.thinking,
    "images": features.images,
    "prefill": scenarios.prefill,
    "prefix": scenarios.prefix,
}
assert tuple(RUNS) == SCENARIOS  # conf/bench.py validates the names; the two lists are one vocabulary


async def _model(c: httpx.AsyncClient) -> tuple[str, int | None]:
    """The served model's name and context: /v1/models (Strata's meta.n_ctx), else /props (llama-server)."""
    r = await c.get("/v1/models")
    if r.status_code != 200:
        raise BenchError(f"GET /v1/models answered {r.status_code}: {r.text[:200]}")
    m = r.json()["data"][0]
    n_ctx = (m.get("meta") or {}).get("n_ctx")
    if n_ctx is None and (p := await c.get("/props")).status_code == 200:
        n_ctx = p.json().get("n_ctx")
    return str(m["id"]), n_ctx


async def _scenarios(cfg: BenchConfig, t: Target) -> dict[str, Any]:
    async with connect(t.url, t.key) as c:
        model, n_ctx = await _model(c)
        b = Bench(c, cfg, n_ctx)
        t0 = time.perf_counter()
        first = await b.chat(ask("warm up", 4))  # the first request after ready pays what warming left
        if first.error is not None:
            raise BenchError(f"the first request failed: {first.error}")
        warm = {"first_s": time.perf_counter() - t0, "first_ttft_s": first.ttft}
        # the client's cost is counted from here: the warm-up paid the lazy imports
        cpu0, b.seen = time.process_time(), []
        done: dict[str, Any] = {}
        for name in cfg.scenarios:
            start = time.perf_counter()
            try:
                done[name] = {"rows": await RUNS[name](b)}
            except Skipped as e:
                done[name] = {"skipped": str(e)}
            done[name]["span"] = [start, time.perf_counter()]
            print(
                f"strata bench: {name}: {done[name]['span'][1] - start:.1f} s"
                + (f" (skipped: {done[name]['skipped']})" if "skipped" in done[name] else ""),
                file=sys.stderr,
            )
        chunks = sum(len(s.stamps) for s in b.seen)
    return {
        "model": model,
        "n_ctx": n_ctx,
        "warmup": warm,
        "scenarios": done,
        "chunks": chunks,
        "client_cpu_s": time.process_time() - cpu0,
    }


def add_joules(sampler: Sampler, done: dict[str, Any]) -> None:
    """j_per_token on every row with a span and tokens: the GPUs' mean power over the span x its length."""
    for res in done.values():
        for r in res.get("rows", ()):
            if "t0" in r and r.get("tokens"):
                p = sampler.power_w(r["t0"], r["t1"])
                r["j_per_token"] = None if p is None else p * (r["t1"] - r["t0"]) / r["tokens"]


def _shift(obj: Any, origin: float) -> Any:
    """Every perf_counter time (t0, t1, span, t) as seconds since the bench began."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("span", "t"):
                out[k] = [x - origin for x in v]
            elif k in ("t0", "t1"):
                out[k] = v - origin
            else:
                out[k] = _shift(v, origin)
        return out
    if isinstance(obj, list):
        return [_shift(x, origin) for x in obj]
    return obj


def run_bench(cfg: BenchConfig, serve: Sequence[str] = SERVE) -> dict[str, Any]:
    """The whole bench: a JSON-ready dict (report.py prints and plots it). `serve`: how to start the server
    when there is no --url (strata.bench.server.target)."""
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with target(cfg, serve) as t:
        sampler = Sampler(t.pid, cfg.sample_hz)
        origin = time.perf_counter()
        sampler.start()
        try:
            out = asyncio.run(_scenarios(cfg, t))
        except httpx.HTTPError as e:  # stream_chat keeps its own; this is /tokenize and the like
            raise BenchError(f"{t.url}: {type(e).__name__}: {e}") from None
        finally:
            sampler.stop()
        wall = time.perf_counter() - origin
    add_joules(sampler, out["scenarios"])
    # the client's CPU, all in (parsing, the event loop, httpx), less the sampler thread's
    client_cpu, chunks, cost = out.pop("client_cpu_s") - sampler.cpu_s, out.pop("chunks"), sampler.cost_s
    overhead = {
        "wall_s": wall,
        "client_cpu_s": client_cpu,
        "chunks": chunks,
        "client_cpu_us_per_chunk": 1e6 * client_cpu / max(1, chunks),
        "sampler_cpu_s": sampler.cpu_s,
        "samples": len(cost),
        "sample_ms_mean": 1e3 * sum(cost) / len(cost) if cost else 0.0,
        "sample_ms_max": 1e3 * max(cost, default=0.0),
    }
    meta = run_meta(
        started=started,  # before the server it started was ready
        url=cfg.url or f"{t.url} (started on {cfg.model or 'the default model'})",
        model=out.pop("model"),
        n_ctx=out.pop("n_ctx"),
        config={
            k: (str(v) if v is not None and not isinstance(v, (int, float, str, tuple)) else v)
            for k, v in dataclasses.asdict(cfg).items()
            if k != "api_key"
        },
    )
    return {
        "meta": meta,
        **_shift(out, origin),
        "samples": _shift(dataclasses.asdict(sampler.series), origin),
        "notes": sampler.notes(),
        "overhead": overhead,
    }

"""Operations endpoints: /health, /v1/models, /v1/status, /props, /metrics, /tokenize, /detokenize."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.api.body import read_json
from strata.api.errors import APIError, bad_request, error_response
from strata.api.schemas import DetokenizeRequest, TokenizeRequest, parse
from strata.api.state import VERSION, AppState


def _state(request: Request) -> AppState:
    return request.app.state.strata


async def health(request: Request) -> Response:
    """200 while the scheduler makes progress; 503 (OpenAI error shape) when its loop stopped, has
    made no progress for --watchdog-s with work waiting, or the server is draining after SIGTERM."""
    if request.app.state.strata is None:
        loading = request.app.state.loading
        return JSONResponse(loading.body(), status_code=503, headers={"Retry-After": "2"})
    sch = _state(request).scheduler
    problem = sch.stalled() or ("the server is shutting down" if sch.draining else None)
    if problem is not None:
        return error_response(request, APIError(503, problem, code="unhealthy"))
    return JSONResponse({"status": "ok", "loaded": True})


async def models(request: Request) -> Response:
    s = _state(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": s.alias,
                    "object": "model",
                    "created": int(s.started),
                    "owned_by": "strata",
                    "meta": {
                        "arch": s.engine.arch,
                        "n_ctx": s.engine.n_ctx,
                        "n_vocab": s.engine.tokenizer.vocab_size,
                    },
                },
            ],
        }
    )


async def status(request: Request) -> Response:
    s = _state(request)
    sch = s.scheduler
    return JSONResponse(
        {
            "model": s.alias,
            "arch": s.engine.arch,
            "slots": sch.parallel,
            "busy_slots": sch.busy_slots,
            "serving": sch.busy_slots,
            "queue_depth": sch.queue_depth,
            "uptime_s": round(time.time() - s.started, 1),
            "requests_total": sch.counters.requests,
            "epoch": sch.epoch,
            "prefix_cache": None
            if sch.prefix_cache is None
            else {
                "entries": len(sch.prefix_cache),
                "bytes": sch.prefix_cache.used,
                "hits": sch.prefix_cache.hits,
                "reused_tokens": sch.prefix_cache.reused_tokens,
            },
            "expert_cache": _expert_cache(s),
        }
    )


def _expert_cache(s: AppState) -> dict[str, object] | None:
    """The tiers as /v1/status shows them: slots, bytes, and hit rates since start, decode and prefill
    apart."""
    cache = s.engine.expert_cache
    if cache is None:
        return None
    out: dict[str, object] = {
        "slots": cache.n_slots,
        "experts": cache.layout.n_total,
        "slot_bytes": cache.layout.slot_bytes,
        "bytes": cache.n_slots * cache.layout.slot_bytes,
    }
    for phase, c in (("decode", cache.use.decode), ("prefill", cache.use.prefill)):
        out[phase] = {
            "lookups": c.lookups,
            "hits": c.hits,
            "hit_rate": round(c.hit_rate, 4),
            "pcie_bytes": c.pcie_bytes,
            "cpu_expert_calls": c.cpu_calls,
            "mmap_expert_reads": c.mmap_reads,
            "mmap_bytes": c.mmap_bytes,
        }
    ring = getattr(cache.slots, "ring", None)  # the low-RAM mode's bounce ring (tiers/ring.py)
    out["ram"] = {
        "arena_experts": int(cache.in_ram.sum()),
        "mmap_experts": int((~cache.in_ram).sum()),
        "arena_bytes": _arena_bytes(cache),
        "bounce_bytes": ring.bytes if ring is not None else 0,
    }
    out["pcie_frac"], out["swaps"], out["swap_bytes"] = cache.pcie_frac, cache.swaps, cache.swap_bytes
    out["policy"] = type(cache.policy).__name__.lower() if cache.policy is not None else "static"
    out["swaps_per_s"] = round(cache.swaps / max(time.monotonic() - cache.started, 1e-9), 2)
    out["kv_grow"] = cache.lender.status() if cache.lender is not None else None  # --kv-grow's lending
    out["prefetch"] = cache.prefetch.status()  # the lookahead (GPU, or the CPU stand-in): staged, used, bytes
    out["per_layer_hit_rate"] = [
        round(h / lk, 4) if lk else 0.0
        for h, lk in zip(cache.layer_hits.tolist(), cache.layer_lookups.tolist())
    ]
    return out


def _arena_bytes(cache: Any) -> int:
    """The RAM tier's rows (0 for the CPU stand-in's view of the file's mapping, which holds no copy)."""
    nbytes = getattr(cache.arena, "nbytes", None)
    return int(nbytes()) if nbytes is not None else 0


async def props(request: Request) -> Response:
    s = _state(request)
    return JSONResponse(
        {
            "model_alias": s.alias,
            "model_path": s.engine.gguf.path,
            "n_ctx": s.engine.n_ctx,
            "total_slots": s.scheduler.parallel,
            "n_predict": s.config.n_predict if s.config.n_predict > 0 else -1,  # llama-server's: -1 unlimited
            "chat_template": s.engine.template.source,
            "bos_token": s.engine.tokenizer.bos_token,
            "eos_token": s.engine.tokenizer.eos_token,
            "version": VERSION,
            "build_info": f"strata {VERSION}",
        }
    )


async def metrics(request: Request) -> Response:
    """Prometheus text format, from the scheduler's own registry (sched/metrics.py)."""
    m = _state(request).scheduler.metrics
    return Response(m.render(), media_type=m.media_type)


async def tokenize(request: Request) -> Response:
    s = _state(request)
    body = parse(TokenizeRequest, await read_json(request))
    ids = await asyncio.to_thread(
        s.engine.tokenizer.encode, body.content, body.add_special, body.parse_special
    )
    if body.with_pieces:
        return JSONResponse({"tokens": [{"id": i, "piece": s.engine.tokenizer.token_text(i)} for i in ids]})
    return JSONResponse({"tokens": ids})


async def detokenize(request: Request) -> Response:
    s = _state(request)
    body = parse(DetokenizeRequest, await read_json(request))
    vocab = s.engine.tokenizer.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"token ids out of range 0..{vocab - 1}: {bad[:5]}", param="tokens")
    return JSONResponse({"content": s.engine.tokenizer.decode(body.tokens)})


async def inject_fault(request: Request) -> Response:
    """Test hook (--test-hooks only): make the next window raise, to exercise the crash epoch."""
    s = _state(request)
    pending = s.scheduler.faults.arm()
    return JSONResponse({"pending_faults": pending, "epoch": s.scheduler.epoch})

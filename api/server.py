"""`strata serve`: load the model, print where to reach it, and run uvicorn on uvloop."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from types import FrameType

import uvicorn
from sse_starlette.sse import AppStatus

from strata import hub
from strata.api.app import build_app
from strata.api.state import AppState
from strata.conf.server import ServerConfig
from strata.engine import Engine
from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.gguf.names import Keys
from strata.sched.prefix_cache import PrefixCache
from strata.sched.scheduler import Scheduler

# Without --ctx-size, the KV cache is bounded to this many tokens (or the model's own, if smaller).
DEFAULT_CTX = 8192


def load_state(cfg: ServerConfig) -> AppState:
    path = Path(cfg.model) if cfg.model else hub.pull()
    trained = int(GGUFFile(path).arch_get(Keys.CONTEXT_LENGTH, DEFAULT_CTX))
    if cfg.ctx_size > trained:
        raise ConfigError("--ctx-size", cfg.ctx_size, f"{path.name} was trained for at most {trained} tokens")
    n_ctx = cfg.ctx_size or min(trained, DEFAULT_CTX)
    engine = Engine.load(path, n_ctx=n_ctx, weight_cache_mib=cfg.weight_cache_mib, backend=cfg.backend,
                         pool_workers=cfg.pool_workers, aux_cpus=cfg.aux_cpus, device=cfg.device,
                         vram_budget_mib=cfg.vram_budget_mib, vram_reserve_mib=cfg.vram_reserve_mib,
                         expert_cache=cfg.expert_cache, prefill_chunk=cfg.prefill_chunk, n_seq=cfg.parallel)
    alias = cfg.alias or path.stem
    cache = PrefixCache(cfg.cache_ram_mib << 20) if cfg.prompt_cache else None
    return AppState(engine, Scheduler(engine, cfg.parallel, cfg.queue_limit, cache, cfg.watchdog_s), cfg, alias)


def serve(cfg: ServerConfig) -> int:
    state = load_state(cfg)
    app = build_app(state)
    url = f"http://{cfg.host}:{cfg.port}"
    auth = f' -H "Authorization: Bearer {cfg.api_keys[0]}"' if cfg.api_keys else ""
    if not cfg.api_keys:
        print("strata: warning: no API key set (--api-key / STRATA_API_KEY): the server is open to anyone "
              "who can reach it", file=sys.stderr)
    print(f"strata: serving {state.alias} ({state.engine.arch}, ctx {state.engine.n_ctx}) at {url}", flush=True)
    print(f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
          f"""-d '{{"messages":[{{"role":"user","content":"Hello!"}}]}}'""", flush=True)
    state.engine.pin_helper_thread()  # uvicorn runs the loop on this thread
    # uvicorn waits for open connections a little past the grace: the requests the grace cut short
    # still send their error events before their connections close
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, loop="uvloop", http="h11",
                            log_level="info" if cfg.verbose else "warning",
                            timeout_graceful_shutdown=int(cfg.shutdown_grace_s) + 2)
    DrainingServer(config, state).run()
    return 0


class DrainingServer(uvicorn.Server):
    """SIGTERM / SIGINT: stop admitting (new requests get 503, /health turns 503), let in-flight
    requests finish for --shutdown-grace-s, fail the rest with a reason, exit. A second signal exits
    at once."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.state = state
        # sse-starlette would cut every stream at the first signal; ours end through the scheduler
        AppStatus.disable_automatic_graceful_drain()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            print("strata: second signal: exiting now", file=sys.stderr, flush=True)
            os._exit(1)  # not even the engine thread's current window is waited for
        grace = self.state.config.shutdown_grace_s
        print(f"strata: shutting down: finishing in-flight requests (up to {grace:g} s)", file=sys.stderr, flush=True)
        sch = self.state.scheduler
        sch.draining = True
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(loop.call_later, grace, sch.abort, "the server shut down before this request finished")
        super().handle_exit(sig, frame)

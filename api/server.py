"""`strata serve`: load the model, print where to reach it, and run uvicorn on uvloop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn
from sse_starlette.sse import AppStatus
from starlette.applications import Starlette

from strata.api.app import build_app
from strata.api.loading import Loading
from strata.api.state import AppState
from strata.conf.engine import parse_overrides
from strata.conf.server import ServerConfig
from strata.console.logs import configure_logging
from strata.engine import Engine
from strata.errors import ConfigError, StrataError
from strata.gguf import GGUFFile
from strata.gguf.names import Keys
from strata.hub import default_model
from strata.runtime.passes import pass_slack
from strata.sched.prefix_cache import PrefixCache, checkpoint_every
from strata.sched.scheduler import Scheduler

log = logging.getLogger("strata.server")


def check_model(cfg: ServerConfig) -> tuple[Path, int]:
    """The model file and the context asked for (0: the engine chooses, strata.tiers.context), from its header
    alone: what can be refused before the socket opens."""
    path = Path(cfg.model) if cfg.model else default_model.pull()
    trained = int(
        GGUFFile(path, parse_overrides(cfg.engine.get("override_kv", ()))).arch_get(Keys.CONTEXT_LENGTH, 4096)
    )
    if cfg.ctx_size > trained:
        raise ConfigError("--ctx-size", cfg.ctx_size, f"{path.name} was trained for at most {trained} tokens")
    return path, cfg.ctx_size


def load_state(cfg: ServerConfig, path: Path, n_ctx: int) -> AppState:
    engine = Engine.load(
        path, n_ctx=n_ctx, weight_cache_mib=cfg.weight_cache_mib, n_seq=cfg.parallel, **cfg.engine
    )
    return app_state(cfg, engine, cfg.alias or path.stem)


def app_state(cfg: ServerConfig, engine: Engine, alias: str) -> AppState:
    """The scheduler and prefix cache the flags ask for, in front of a loaded engine."""
    every = checkpoint_every(engine.options.prefill_chunk)
    fold = pass_slack(engine.options.prefill_chunk)
    cache = PrefixCache(cfg.cache_ram_mib << 20, every, fold) if cfg.prompt_cache else None
    return AppState(
        engine,
        Scheduler(
            engine, cfg.parallel, cfg.queue_limit, cache, cfg.watchdog_s, decode_ahead=cfg.decode_ahead
        ),
        cfg,
        alias,
    )


Loader = Callable[[ServerConfig, Path, int], AppState]


def serve(cfg: ServerConfig, load: Loader = load_state) -> int:
    """Open the socket at once, load and warm the model behind it (/health says loading), then serve.
    A model that fails to load ends the process with one line and exit 1, as before the socket opened.
    `load` builds the state (perf/bench_host.py puts a stand-in model behind the real server)."""
    json_logs = cfg.log_format == "json"
    # --verbose: the scheduler's debug lines (each window's cost and the pacer's model) too; in json uvicorn's
    # lines come through the same handler, in text they keep uvicorn's own format
    configure_logging(
        cfg.log_format,
        logging.DEBUG if cfg.verbose else logging.INFO,
        ("strata", "uvicorn") if json_logs else ("strata",),
    )
    path, n_ctx = check_model(cfg)
    url = f"http://{cfg.host}:{cfg.port}"
    if not cfg.api_keys:
        log.warning(
            "no API key set (--api-key / STRATA_API_KEY): the server is open to anyone who can reach it"
        )
    loading = Loading()
    app = build_app(cfg, loading)
    # uvicorn waits for open connections a little past the grace: the requests the grace cut short
    # still send their error events before their connections close
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        loop="uvloop",
        http="h11",
        log_level="info" if cfg.verbose else "warning",
        **({"log_config": None} if json_logs else {}),
        timeout_graceful_shutdown=int(cfg.shutdown_grace_s) + 2,
    )
    server = DrainingServer(config, cfg, app, loading, (path, n_ctx), load)
    log.info("loading the model; %s/health answers 503 until it is ready", url)
    server.run()
    if loading.error is not None:
        log.error("%s", loading.error)
        return 1
    return 0


def _announce(cfg: ServerConfig, state: AppState, seconds: float) -> None:
    url = f"http://{cfg.host}:{cfg.port}"
    auth = f' -H "Authorization: Bearer {cfg.api_keys[0]}"' if cfg.api_keys else ""
    log.info(
        "serving %s (%s, ctx %d) at %s (ready in %.1f s)",
        state.alias,
        state.engine.arch,
        state.engine.n_ctx,
        url,
        seconds,
        extra={"url": url, "model": state.alias, "ready_s": round(seconds, 3)},
    )
    log.info(
        "  curl %s/v1/chat/completions -H 'Content-Type: application/json'%s "
        """-d '{"messages":[{"role":"user","content":"Hello!"}]}'""",
        url,
        auth,
    )


def settle_heap() -> None:
    """Collect the loading's garbage, then keep what is left out of every later collection: the model, the
    tokenizer and the GGUF metadata live as long as the process, and a full collection walked their ~240k
    objects (Qwen3's vocabulary) while serving, 150 ms on the 2-core dev box with the event loop and the
    engine thread (the GIL) stopped, the GPU idle behind them (perf/bench_host.py)."""
    gc.collect()
    gc.freeze()


class DrainingServer(uvicorn.Server):
    """SIGTERM / SIGINT: stop admitting (new requests get 503, /health turns 503), let in-flight
    requests finish for --shutdown-grace-s, fail the rest with a reason, exit. A second signal exits
    at once."""

    def __init__(
        self,
        config: uvicorn.Config,
        cfg: ServerConfig,
        app: Starlette,
        loading: Loading,
        model: tuple[Path, int],
        load: Loader = load_state,
    ) -> None:
        super().__init__(config)
        self.cfg, self.app, self.loading, self.model, self.load = cfg, app, loading, model, load
        # sse-starlette would cut every stream at the first signal; ours end through the scheduler
        AppStatus.disable_automatic_graceful_drain()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._load, args=(loop,), name="strata-load", daemon=True).start()

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        """On a thread, so the loop answers /health meanwhile: load, warm up, then hand over to the loop."""
        try:
            self.loading.phase = "loading the model"
            state = self.load(self.cfg, *self.model)
            self.loading.phase = "warming up (kernels, decode graphs, a prefill pass)"
            state.engine.warm_up(self.cfg.parallel)
            self.loading.phase = "timing prompt passes (the pacer's cost model)"
            state.scheduler.calibrate()
            settle_heap()
        except Exception as e:
            self.loading.error = (
                str(e) if isinstance(e, StrataError | OSError) else f"{type(e).__name__}: {e}"
            )
            loop.call_soon_threadsafe(setattr, self, "should_exit", True)
            return
        loop.call_soon_threadsafe(self._ready, state)

    def _ready(self, state: AppState) -> None:
        state.engine.pin_helper_thread()  # uvicorn runs the loop on this thread
        state.scheduler.start()
        self.app.state.strata = state
        self.loading.ready = True
        _announce(self.cfg, state, time.monotonic() - self.loading.started)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            log.warning("second signal: exiting now")
            os._exit(1)  # not even the engine thread's current window is waited for
        state = self.app.state.strata
        if state is None:  # still loading: nothing in flight
            super().handle_exit(sig, frame)
            return
        grace = self.cfg.shutdown_grace_s
        log.info("shutting down: finishing in-flight requests (up to %g s)", grace)
        sch = state.scheduler
        sch.draining = True
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(
            loop.call_later, grace, sch.abort, "the server shut down before this request finished"
        )
        super().handle_exit(sig, frame)

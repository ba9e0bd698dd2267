"""What every handler needs: the engine, the scheduler and the served name."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from strata.api.errors import APIError
from strata.conf.server import ServerConfig
from strata.engine import Engine
from strata.sched.scheduler import Scheduler

VERSION = "0.1.0"


@dataclass(slots=True)
class AppState:
    engine: Engine
    scheduler: Scheduler
    config: ServerConfig
    alias: str
    started: float = field(default_factory=time.time)

    def model_name(self, requested: str | None) -> str:
        """The name to report back. Clients (IDEs) send fixed model ids; with one model loaded we
        answer any of them, under the name they sent, unless --strict-model is set."""
        if not requested:
            return self.alias
        if self.config.strict_model and requested != self.alias:
            raise APIError(
                404,
                f"model {requested!r} is not served; available: {self.alias}",
                param="model",
                code="model_not_found",
            )
        return requested

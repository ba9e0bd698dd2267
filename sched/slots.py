"""Small pieces the scheduler is built from: a batch slot, the /metrics counters, queue overflow."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from strata.errors import StrataError
from strata.runtime.finish import FinishReason
from strata.runtime.sequence import ActiveSequence, GenerationResult
from strata.runtime.state import Checkpoint
from strata.sched.request import Request


class ShuttingDownError(StrataError):
    """The server is draining after SIGTERM and takes no new requests."""


class DeviceLostError(StrataError):
    """A window met a sticky CUDA error: the GPU's context is gone for this process, which must restart."""


class QueueFullError(StrataError):
    """Every slot is busy and the queue is at --queue-limit."""

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(f"server busy: {limit} requests already queued")
        self.retry_after = retry_after


@dataclass(eq=False, slots=True)
class Slot:
    """A request occupying one of the --parallel batch slots, with its running sequence."""

    req: Request
    seq: ActiveSequence
    cached: int  # prompt tokens restored from the prefix cache
    last_token: float = 0.0  # perf_counter of the stream's last token (0: none yet), for /metrics' latencies
    copy: asyncio.Future[Any] | None = None  # its prompt checkpoints' copy to host RAM, while it sits out
    # a hybrid prompt read in a wide pass: the checkpoints the pass takes inside it, and what it took
    marks: list[int] = field(default_factory=list)
    kept: list[Checkpoint] = field(default_factory=list)

    @property
    def copying(self) -> bool:
        return self.copy is not None and not self.copy.done()

    @property
    def prompt_left(self) -> int:
        """Prompt tokens the slot has still to feed."""
        return len(self.seq.prompt) - self.seq.state.n_past


@dataclass(slots=True)
class Counters:
    """Monotonic totals for /metrics and /v1/status."""

    outcomes: dict[FinishReason, int] = field(default_factory=dict)  # requests ended, by finish reason
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    windows: int = 0

    def add_window(self, seconds: float, n_prefill: int, n_slots: int) -> None:
        """Split a window's time between prefill and decode by the tokens each fed."""
        self.windows += 1
        n_decode = n_slots - (1 if n_prefill else 0)
        total = n_prefill + n_decode
        if total:
            self.prompt_seconds += seconds * n_prefill / total
            self.decode_seconds += seconds * n_decode / total

    @property
    def requests(self) -> int:
        """Requests completed (cancelled ones too): every outcome but an engine error."""
        return sum(n for reason, n in self.outcomes.items() if reason is not FinishReason.ERROR)

    @property
    def requests_failed(self) -> int:
        return self.outcomes.get(FinishReason.ERROR, 0)

    def ended(self, reason: FinishReason) -> None:
        self.outcomes[reason] = self.outcomes.get(reason, 0) + 1

    def finished(self, r: GenerationResult, reason: FinishReason) -> None:
        self.ended(reason)
        self.prompt_tokens += r.timings.prompt_n
        self.cached_prompt_tokens += r.cached_tokens
        self.generated_tokens += len(r.tokens)

"""Requests as the scheduler sees them: an explicit state machine and one finish reason each
(strata.runtime.finish.FinishReason, the vocabulary every layer shares)."""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from strata.constraints.schema import Grammar
from strata.runtime.finish import FinishReason
from strata.sampling.params import SamplingParams


class RequestState(enum.IntEnum):
    """Ordered: a request only moves forward (BATCHED may return to SOLO when others finish)."""

    QUEUED = 0
    ADMITTING = 1  # prompt being prefilled
    SOLO = 2
    BATCHED = 3
    FINISHED = 4


_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token: int | None
    text: str


@dataclass(frozen=True, slots=True)
class DoneEvent:
    reason: FinishReason
    stop_string: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timings: dict[str, float]


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    reason: str


Event = TokenEvent | DoneEvent | ErrorEvent


@dataclass(eq=False, slots=True)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    grammar: Grammar | None = None  # decoding is held to this JSON (response_format, a forced tool call)
    think_budget: int | None = None  # reasoning tokens allowed before </think> is forced
    in_think: bool = False  # the prompt already opened a <think> block
    turn_end: int | None = None  # prompt tokens before the generation prompt (api.prompt.Prompt.turn_end)
    id: int = field(default_factory=lambda: next(_ids))
    state: RequestState = RequestState.QUEUED
    finish: FinishReason | None = None
    cancelled: bool = False  # set from the loop; the engine thread checks it every token
    submitted: float = 0.0  # perf_counter when the scheduler queued it (TTFT and queue wait count from here)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)

    def cancel(self) -> None:
        self.cancelled = True

"""One streamed request's record and the numbers read from it: TTFT, decode rate, inter-token gaps.

The decode rate counts the tokens after the first over the time after the first: dividing all tokens by
the whole time would spread the prompt's prefill over every token (the seeds' 250k-token prompt read
5.9 tok/s that way against a real 87.8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 1]; nan for no values."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def decode_rate(stamps: list[float], tokens: int) -> float:
    """Tokens after the first / seconds after the first; 0 when there is no second token to time."""
    if tokens < 2 or len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return 0.0
    return (tokens - 1) / (stamps[-1] - stamps[0])


@dataclass(slots=True)
class Stream:
    """What the client saw of one request. `stamps` are perf_counter times of the chunks that carried
    generated text (content, reasoning or a tool call); a chunk may hold more than one token."""

    sent: float
    stamps: list[float] = field(default_factory=list)
    usage_tokens: int | None = None  # usage.completion_tokens, when the server reports it
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt_ms: float | None = None  # the server's time reading the prompt (its `timings`, if it sends them)
    content_chars: int = 0
    reasoning_chars: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # accumulated OpenAI tool_calls
    finish_reason: str | None = None
    error: str | None = None

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.stamps)

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.sent if self.stamps else math.nan

    @property
    def decode_tok_s(self) -> float:
        return decode_rate(self.stamps, self.tokens)

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]

    def summary(self) -> dict[str, Any]:
        """The per-request numbers every scenario reports."""
        gaps = self.gaps
        return {
            "ttft_s": self.ttft,
            "decode_tok_s": self.decode_tok_s,
            "tokens": self.tokens,
            "itl_p50_ms": percentile(gaps, 0.5) * 1e3,
            "itl_p99_ms": percentile(gaps, 0.99) * 1e3,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prompt_ms": self.prompt_ms,
            "error": self.error,
        }


def windowed_rates(stamps: list[float], window: int) -> list[float]:
    """Decode rate over each run of `window` chunk gaps (the long generation's drift over time)."""
    return [
        window / (stamps[i + window] - stamps[i])
        for i in range(0, len(stamps) - window, window)
        if stamps[i + window] > stamps[i]
    ]

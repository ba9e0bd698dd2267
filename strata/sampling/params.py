"""SamplingParams: how one request draws its tokens, checked once (validate) before any draw.

The chain that applies them is strata/sampling/sampler.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from strata.errors import StrataError


class SamplingError(StrataError):
    """A sampling parameter is out of range; the message names it."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0  # llama.cpp-style: divide positive logits, multiply negative ones
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def validate(self) -> None:
        checks = [
            ("temperature", self.temperature, 0.0 <= self.temperature <= 100.0),
            ("top_k", self.top_k, self.top_k >= 0),
            ("top_p", self.top_p, 0.0 < self.top_p <= 1.0),
            ("min_p", self.min_p, 0.0 <= self.min_p <= 1.0),
            ("repeat_penalty", self.repeat_penalty, self.repeat_penalty > 0.0),
            ("presence_penalty", self.presence_penalty, -2.0 <= self.presence_penalty <= 2.0),
            ("frequency_penalty", self.frequency_penalty, -2.0 <= self.frequency_penalty <= 2.0),
            ("seed", self.seed, self.seed is None or 0 <= self.seed < 2**64),
        ]
        for name, value, ok in checks:
            if not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise SamplingError(f"{name}={value!r} is out of range")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

"""The scheduler's fabricated model, tokenizer and engine, shared by the scheduler's tests (test_scheduler.py,
test_hardening_scheduler.py, test_metrics.py): no model, no HTTP.

The fake model's next token is a pure function of the sequence's own history, so any crosstalk
between slots, lost token or re-read prompt shows up as a wrong token.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from strata.runtime.kvcache import KVCache
from strata.runtime.state import SequenceState
from strata.sampling.params import SamplingParams
from strata.sched.request import DoneEvent, ErrorEvent, Request, TokenEvent

V = 50
EOT = 0


def next_token(history: list[int]) -> int:
    """The fabricated model: deterministic in the history, never EOT unless history sums to 0 mod 49."""
    s = sum(history) * 31 + len(history)
    return 1 + s % (V - 1) if s % 97 else EOT


class FakeTokenizer:
    eot_ids = frozenset({EOT})
    byte_level = False
    vocab_size = V

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return "".join(f"<{i}>" for i in ids)

    def is_special(self, i: int) -> bool:
        return False

    def is_byte_token(self, i: int) -> bool:
        return False


@dataclass
class FakeModel:
    windows: list[list[int]] = field(default_factory=list)  # tokens fed per sequence, per window

    def forward_batch(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        self.windows.append([len(t) for t in tokens])
        out = []
        for t, s in zip(tokens, states):
            s.tokens.extend(int(v) for v in t)
            s.n_past += len(t)
            s.kv.append(0, np.zeros((len(t), 1, 1), np.float32), np.zeros((len(t), 1, 1), np.float32))
            logits = np.zeros(V, np.float32)
            logits[next_token(s.tokens)] = 1.0
            out.append(logits)
        return out


@dataclass
class FakeOptions:
    prefill_chunk: int = 8


class FakeEngine:
    def __init__(self) -> None:
        self.model = FakeModel()
        self.tokenizer = FakeTokenizer()
        self.options = FakeOptions()
        self.expert_cache = None  # every expert resident: no tier counters
        self.wide_rows = 0  # the model's wide prompt passes (Engine.prompt_rows); 0: none

    @property
    def prompt_rows(self) -> int:
        return max(self.wide_rows, self.options.prefill_chunk)

    def new_state(self) -> SequenceState:
        return SequenceState(KVCache([0], 1, 1))


def solo(prompt: list[int], n: int) -> list[int]:
    hist, out = list(prompt), []
    for _ in range(n):
        t = next_token(hist)
        if t == EOT:
            break
        out.append(t)
        hist.append(t)
    return out


def make(prompt: list[int], n: int = 6) -> Request:
    return Request(list(prompt), SamplingParams(temperature=0.0), n, seed=1)


async def drain(req: Request) -> tuple[list[int], DoneEvent | ErrorEvent]:
    toks = []
    while True:
        ev = await asyncio.wait_for(req.events.get(), 5)
        if isinstance(ev, TokenEvent):
            if ev.token is not None:
                toks.append(ev.token)
        else:
            return toks, ev


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


PROMPTS = [[3, 4, 5], [7, 1, 1, 2, 9, 9, 4, 4, 4, 4, 2, 1, 3], [11], [5, 5], [8, 2, 6], [13, 21, 34, 1]]

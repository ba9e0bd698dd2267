"""One generating sequence: what it feeds the model next and what it does with the logits.

Engine.generate drives one Sequence alone; the scheduler drives several through one batched
forward per window. Both use the same object, so solo and batched output are the same tokens.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from strata.runtime.finish import FinishReason
from strata.runtime.state import SequenceState
from strata.sampling.params import SamplingParams
from strata.sampling.sampler import sample
from strata.text.detok import StreamDecoder
from strata.text.stops import StopMatcher
from strata.text.tokenizer import Tokenizer
from strata.tiers.telemetry import TierUse


class Constraint(Protocol):
    """Shapes decoding: masks logits before each draw, follows each token, may end generation."""

    @property
    def done(self) -> bool: ...

    def mask(self, logits: np.ndarray) -> np.ndarray: ...

    def advance(self, token: int) -> None: ...


class Phase(enum.Enum):
    PREFILL = "prefill"  # prompt tokens still to feed
    DECODE = "decode"  # one sampled token to feed per step
    DONE = "done"


@dataclass(slots=True)
class Timings:
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    table_rows: int = 0  # PLE lookup-table rows gathered (qwen4exp), when the model has tables
    table_bytes: int = 0
    table_disk_bytes: int = 0  # of those, read from disk (--ple-io direct)
    table_wait_ms: float = 0.0  # time the pass waited for its rows (they are gathered ahead of use)
    experts: TierUse | None = None  # expert-tier counters, when the model routes through the tiers

    def to_dict(self) -> dict[str, float]:
        extra = (
            {
                "table_rows": self.table_rows,
                "table_bytes": self.table_bytes,
                "table_disk_bytes": self.table_disk_bytes,
                "table_wait_ms": round(self.table_wait_ms, 3),
            }
            if self.table_rows
            else {}
        )
        if self.experts is not None:
            extra.update(self.experts.timings())
        return {
            **extra,
            "prompt_n": self.prompt_n,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_second": _rate(self.prompt_n, self.prompt_ms),
            "predicted_n": self.predicted_n,
            "predicted_ms": round(self.predicted_ms, 3),
            "predicted_per_second": _rate(self.predicted_n, self.predicted_ms),
        }


def _rate(n: int, ms: float) -> float:
    return round(n * 1000.0 / ms, 3) if ms > 0 else 0.0


@dataclass(slots=True)
class Chunk:
    """One generated token and the text it completed (may be empty while UTF-8 is pending)."""

    token: int | None  # None for text released at the end (held-back UTF-8 or stop-string prefix)
    text: str


@dataclass(slots=True)
class GenerationResult:
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason = FinishReason.LENGTH
    stop_string: str | None = None  # which stop string ended it, when one did
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache instead of computed
    timings: Timings = field(default_factory=Timings)


class ActiveSequence:
    def __init__(
        self,
        tokenizer: Tokenizer,
        state: SequenceState,
        prompt_ids: list[int],
        *,
        params: SamplingParams,
        seed: int,
        max_tokens: int,
        stop: Seq[str] = (),
        ignore_eos: bool = False,
        constraints: Seq[Constraint] = (),
        tiered: bool = False,
    ) -> None:
        self.state = state
        self.prompt = list(prompt_ids)
        self.params, self.seed, self.max_tokens = params, seed, max_tokens
        self.constraints = tuple(constraints)
        self.result = GenerationResult(prompt_ids=list(prompt_ids))
        self.result.cached_tokens = state.n_past
        if tiered:
            self.result.timings.experts = state.experts
        self._detok, self._stops = StreamDecoder(tokenizer), StopMatcher(stop)
        self._eot = frozenset() if ignore_eos else tokenizer.eot_ids
        self._next: int | None = None  # sampled token not yet fed to the model
        self._t0 = self._t_decode = 0.0
        self.phase = Phase.PREFILL if state.n_past < len(self.prompt) else Phase.DECODE
        if self.phase is Phase.DECODE:
            raise ValueError("a sequence needs at least one prompt token left to feed")

    @property
    def finished(self) -> bool:
        return self.phase is Phase.DONE

    def next_input(self, chunk: int) -> np.ndarray:
        """Token ids to feed in this step: up to `chunk` prompt tokens, or the last sampled one."""
        if not self._t0:
            self._t0 = time.perf_counter()
        if self.phase is Phase.PREFILL:
            return np.asarray(self.prompt[self.state.n_past : self.state.n_past + chunk], dtype=np.int64)
        assert self._next is not None and self.phase is Phase.DECODE
        return np.asarray([self._next], dtype=np.int64)

    def accept(self, logits: np.ndarray) -> list[Chunk]:
        """Take the logits [vocab] after this step's last token; returns the text produced."""
        tm = self.result.timings
        if self.phase is Phase.PREFILL:
            if self.state.n_past < len(self.prompt):
                return []  # more prompt to feed; these logits are of no use
            tm.prompt_n = len(self.prompt) - self.result.cached_tokens
            tm.prompt_ms = (time.perf_counter() - self._t0) * 1000
            self._t_decode = time.perf_counter()
            self.phase = Phase.DECODE
        out = self._sample(logits)
        tm.predicted_n = len(self.result.tokens)
        tm.predicted_ms = (time.perf_counter() - self._t_decode) * 1000
        return out

    def accept_token(self, tok: int) -> list[Chunk]:
        """Take a token chosen elsewhere (the decode pipeline's sampler, strata.sampling.sampler's
        device_drawable) for this decode step, as `accept` would have sampled it."""
        assert self.phase is Phase.DECODE and not self.constraints
        tm = self.result.timings
        out = self._finish() if len(self.result.tokens) >= self.max_tokens else self._take(tok)
        tm.predicted_n = len(self.result.tokens)
        tm.predicted_ms = (time.perf_counter() - self._t_decode) * 1000
        return out

    def cancel(self) -> list[Chunk]:
        """Stop now (client gone); releases held-back text."""
        if self.finished:
            return []
        self.result.finish_reason = FinishReason.CANCELLED
        return self._finish()

    def _sample(self, logits: np.ndarray) -> list[Chunk]:
        r = self.result
        if len(r.tokens) >= self.max_tokens:  # max_tokens 0: the prompt is all there is
            return self._finish()
        for c in self.constraints:
            logits = c.mask(logits)
        return self._take(sample(logits, self.state.tokens, self.params, self.seed, self.state.n_past))

    def _take(self, tok: int) -> list[Chunk]:
        r = self.result
        if tok in self._eot:
            r.finish_reason = FinishReason.EOS
            return self._finish()
        r.tokens.append(tok)
        for c in self.constraints:
            c.advance(tok)
        text, hit = self._stops.push(self._detok.push(tok))
        r.text += text
        out = [Chunk(tok, text)]
        if hit:
            r.finish_reason, r.stop_string = FinishReason.STOP_STRING, self._stops.matched
            self.phase = Phase.DONE  # text after a stop string is dropped, not flushed
            return out
        if any(c.done for c in self.constraints):  # e.g. the JSON object just closed
            r.finish_reason = FinishReason.EOS
            return out + self._finish()
        if len(r.tokens) >= self.max_tokens:
            return out + self._finish()
        self._next = tok
        return out

    def _finish(self) -> list[Chunk]:
        self.phase = Phase.DONE
        tail, _ = self._stops.push(self._detok.flush())
        tail += self._stops.flush()
        if not tail:
            return []
        self.result.text += tail
        return [Chunk(None, tail)]

"""Engine: a loaded model with its tokenizer and chat template, and the public API the tests,
the CLI and the server use: `Engine.load`, `engine.logits`, `engine.generate`."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strata.chat_template import ChatTemplate
from strata.conf import EngineOptions
from strata.constrain import JsonConstraint
from strata.detok import StreamDecoder
from strata.errors import ContextOverflowError
from strata.gguf import GGUFFile
from strata.models import Model, model_class
from strata.sampling import SamplingParams, sample
from strata.state import SequenceState
from strata.stops import StopMatcher
from strata.tokenizer import Tokenizer
from strata.weights import WeightStore, check_supported


@dataclass(slots=True)
class Timings:
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {
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
    finish_reason: str = "length"  # "stop" (EOS or stop string) or "length"
    stop_string: str | None = None  # which stop string ended it, when one did
    timings: Timings = field(default_factory=Timings)


class Generation:
    """Iterate for Chunks; `result` is complete once iteration ends."""

    def __init__(self, steps: Iterator[Chunk], result: GenerationResult) -> None:
        self._steps = steps
        self.result = result

    def __iter__(self) -> Iterator[Chunk]:
        return self._steps

    def run(self) -> GenerationResult:
        for _ in self._steps:
            pass
        return self.result


class Engine:
    def __init__(self, gguf: GGUFFile, model: Model, tokenizer: Tokenizer, options: EngineOptions) -> None:
        self.gguf = gguf
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.template = ChatTemplate.from_gguf(gguf, tokenizer)
        trained = model.params.n_ctx_train
        self.n_ctx = options.n_ctx or trained

    @classmethod
    def load(cls, path: str | os.PathLike[str], **options: Any) -> Engine:
        """Open a GGUF and build its model; raises typed errors for bad files and options."""
        opts = EngineOptions.from_kwargs(**options)
        gguf = GGUFFile(path)
        if opts.verify:
            gguf.verify(opts.verify)
        model_cls = model_class(gguf)
        check_supported(gguf)
        weights = WeightStore(gguf, opts.weight_cache_mib << 20)
        return cls(gguf, model_cls(gguf, weights), Tokenizer.from_gguf(gguf), opts)

    @property
    def arch(self) -> str:
        return self.gguf.architecture

    def new_state(self) -> SequenceState:
        return self.model.new_state()

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """float32 logits [T, vocab] for every position of `token_ids`, from a fresh state."""
        ids = np.asarray(token_ids, dtype=np.int64)
        return self.model.forward(ids, self.new_state(), all_logits=True)

    def prefill(self, state: SequenceState, ids: Sequence[int]) -> np.ndarray:
        """Feed `ids` in chunks; returns the logits [vocab] after the last one."""
        chunk = self.options.prefill_chunk
        last = None
        for i in range(0, len(ids), chunk):
            last = self.model.forward(np.asarray(ids[i : i + chunk]), state, all_logits=False)
        assert last is not None, "prefill needs at least one token"
        return last[-1]

    def encode_chat(self, messages: list[dict[str, Any]], **template_kw: Any) -> list[int]:
        text = self.template.render(messages, add_generation_prompt=True, **template_kw)
        ids = self.tokenizer.encode(text, add_special=True, parse_special=True)
        bos = self.tokenizer.bos_id
        if len(ids) > 1 and ids[0] == bos and ids[1] == bos:  # template already wrote BOS
            ids = ids[1:]
        return ids

    def generate(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        max_tokens: int = 128,
        params: SamplingParams | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        template_kw: dict[str, Any] | None = None,
        constraint: JsonConstraint | None = None,
    ) -> Generation:
        """Stream tokens for a text prompt, token ids, or chat messages."""
        params = params or SamplingParams()
        params.validate()
        if messages is not None:
            ids = self.encode_chat(messages, **(template_kw or {}))
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special=True, parse_special=True)
        else:
            ids = [int(t) for t in (prompt or [])]
        if not ids:
            ids = [self.tokenizer.bos_id]
        if len(ids) >= self.n_ctx:
            raise ContextOverflowError(len(ids), self.n_ctx)
        max_tokens = min(max_tokens, self.n_ctx - len(ids))
        result = GenerationResult(prompt_ids=list(ids))
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        steps = self._steps(ids, max_tokens, params, seed, stop, ignore_eos, result, constraint)
        return Generation(steps, result)

    def _steps(
        self,
        ids: list[int],
        max_tokens: int,
        params: SamplingParams,
        seed: int,
        stop: Sequence[str],
        ignore_eos: bool,
        result: GenerationResult,
        constraint: JsonConstraint | None,
    ) -> Iterator[Chunk]:
        state, tm = self.new_state(), result.timings
        t0 = time.perf_counter()
        logits = self.prefill(state, ids)
        tm.prompt_n, tm.prompt_ms = len(ids), (time.perf_counter() - t0) * 1000
        detok, stops = StreamDecoder(self.tokenizer), StopMatcher(stop)
        eot = set() if ignore_eos else self.tokenizer.eot_ids
        t1 = time.perf_counter()
        for _ in range(max_tokens):
            if constraint is not None:
                logits = constraint.mask(logits)
            tok = sample(logits, state.tokens, params, seed, state.n_past)
            if tok in eot:
                result.finish_reason = "stop"
                break
            result.tokens.append(tok)
            if constraint is not None:
                constraint.advance(tok)
            text, hit = stops.push(detok.push(tok))
            result.text += text
            tm.predicted_n = len(result.tokens)
            tm.predicted_ms = (time.perf_counter() - t1) * 1000
            yield Chunk(tok, text)
            if hit:
                result.finish_reason, result.stop_string = "stop", stops.matched
                return
            if constraint is not None and constraint.done:  # the JSON object just closed
                result.finish_reason = "stop"
                break
            if len(result.tokens) < max_tokens:
                logits = self.model.forward(np.asarray([tok]), state, all_logits=False)[-1]
        tail, _ = stops.push(detok.flush())
        tail += stops.flush()
        if tail:
            result.text += tail
            yield Chunk(None, tail)
        tm.predicted_ms = (time.perf_counter() - t1) * 1000

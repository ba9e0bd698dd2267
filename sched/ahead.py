"""Decode one window ahead of the host: the next step runs while the host handles the last one's token.

Without it, each decode window is compute, then the host's share (sampling, detokenising, stop
strings, SSE events), then the next compute: on the GPU the host's share cost a quarter of a b=1
stream's pace and half of b=4's (issue 15). A pipeline keeps one step queued behind the one the
host waits on, so the model never waits for the host while the set of sequences stays the same.

The protocol, for a fixed list of sequences and their draws:
- `start(states, tokens, draws)`: launch a step feeding the host's tokens (each sequence's last
  sampled token);
- `advance()`: launch one more step feeding the tokens the last launch chose, then wait for the
  oldest launch and return its tokens (already fed to the model by the step just launched);
- `drain()`: wait for the last launch and return its tokens, not fed: the sequences are back in
  the state a plain window leaves (n_past == len(tokens)), ready for any other window.

A sequence that ends at a token the pipeline already fed has had one extra step: its state holds
that token (an EOS the next turn's prompt starts with, which the prefix cache can reuse).

`HostAhead` is the pipeline for any model: steps run on a worker thread (forward_batch, then
strata.sampling.sampler.sample), so the host's share overlaps the model's next step. strata/gpu/ahead.py
keeps the steps inside the CUDA graph, with the draw on the device.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from strata.runtime.state import SequenceState
from strata.sampling.params import SamplingParams
from strata.sampling.sampler import sample

Draw = tuple[SamplingParams, int]  # a sequence's sampling parameters and seed


class Ahead(Protocol):
    def drawable(self, params: SamplingParams) -> bool: ...

    @property
    def max_batch(self) -> int: ...

    def start(self, states: list[SequenceState], tokens: list[int], draws: Sequence[Draw]) -> None: ...

    def advance(self) -> np.ndarray: ...

    def drain(self) -> np.ndarray: ...

    def reset(self) -> None: ...


class HostAhead:
    """Steps on a worker thread: forward_batch and the host sampler, one step queued ahead."""

    def __init__(self, model: Any, max_batch: int) -> None:
        self.model = model
        self.max_batch = max_batch
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="strata-ahead")
        self._pending: deque[Future[np.ndarray]] = deque()
        self._states: list[SequenceState] = []
        self._draws: Sequence[Draw] = ()

    def drawable(self, params: SamplingParams) -> bool:
        return True  # the host sampler takes every parameter

    def start(self, states: list[SequenceState], tokens: list[int], draws: Sequence[Draw]) -> None:
        assert not self._pending, "a pipeline starts empty"
        self._states, self._draws = states, draws
        self._pending.append(self._worker.submit(self._step, tokens))

    def advance(self) -> np.ndarray:
        prev = self._pending[-1]
        self._pending.append(self._worker.submit(lambda: self._step([int(t) for t in prev.result()])))
        return self._pending.popleft().result()

    def drain(self) -> np.ndarray:
        assert len(self._pending) == 1, "drain follows advance"
        return self._pending.popleft().result()

    def reset(self) -> None:
        while self._pending:
            f = self._pending.popleft()
            f.exception()  # waits; the error was the window's, already reported

    def _step(self, tokens: list[int]) -> np.ndarray:
        states = self._states
        logits = self.model.forward_batch([np.asarray([t], np.int64) for t in tokens], states)
        return np.asarray(
            [
                sample(row, s.tokens, p, seed, s.n_past)
                for row, s, (p, seed) in zip(logits, states, self._draws)
            ],
            np.int64,
        )

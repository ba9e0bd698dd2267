"""The decode pipeline on the GPU (sched/ahead.py's protocol): steps replay the captured graph back to back.

Each launch writes the slots' draw rows (strata.sampling.sampler.draw_row, the uniform computed on the host
from the position the step samples at) through pinned memory, replays the graph, which draws the
next tokens into the table's token column and advances the positions, and queues the chosen tokens'
copy to pinned memory behind an event. The next launch needs nothing from the host, so the host
waits on launch j while launch j+1 is already queued: sampling, detokenising and SSE of one token
overlap the next token's compute. The expert tiers count each pass into pinned memory too
(GpuTiers.record), and are credited when the host takes the pass.

Host bookkeeping follows the device: a launch advances each state's n_past (its KV row is written);
the token it fed joins `state.tokens` when the host learns it, so after `drain` every state is as a
plain window leaves it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from strata.gpu.graphs import DecodeGraphs
from strata.gpu.kv import COLD_COL
from strata.gpu.runtime import DEVICE_TO_HOST, HOST_TO_DEVICE, cupy_module
from strata.runtime.state import SequenceState
from strata.sampling.params import SamplingParams
from strata.sampling.sampler import DRAW_COLS, device_drawable, draw_row

if TYPE_CHECKING:
    from strata.gpu.tiers import PassRecord

RING = 3  # pinned buffers in turn: at most two launches are in flight


@dataclass(slots=True)
class _Launch:
    event: Any
    out: np.ndarray  # pinned: the tokens the launch drew
    record: PassRecord | None


class AheadModel(Protocol):
    """What the pipeline reads of its model (strata.gpu.model.GpuModel), so this module needs none of it."""

    graphs: DecodeGraphs
    params: Any
    stream: Any  # the cupy stream every launch goes on
    tiers: Any  # strata.gpu.tiers.GpuTiers or None


class GraphAhead:
    def __init__(self, model: AheadModel) -> None:
        import cupyx

        self.model = model
        self.graphs = model.graphs
        self.max_batch = model.graphs.max_batch
        n = self.max_batch
        self._rows = [cupyx.empty_pinned((n, DRAW_COLS), np.float64) for _ in range(RING)]
        self._outs = [cupyx.empty_pinned((n,), np.int64) for _ in range(RING)]
        self._turn = 0
        self._pending: deque[_Launch] = deque()
        self._states: list[SequenceState] = []
        self._draws: Sequence[tuple[SamplingParams, int]] = ()

    def drawable(self, params: SamplingParams) -> bool:
        return device_drawable(params, self.model.params.vocab)

    def start(
        self, states: list[SequenceState], tokens: list[int], draws: Sequence[tuple[SamplingParams, int]]
    ) -> None:
        assert not self._pending and 0 < len(states) <= self.max_batch
        self._states, self._draws = states, draws
        with self.model.stream:
            self.graphs._buffers()
            self.graphs._load(tokens, states, extra=2)
        for s, t in zip(states, tokens):
            s.tokens.append(t)
        self._launch()

    def advance(self) -> np.ndarray:
        self._launch()
        return self._collect()

    def drain(self) -> np.ndarray:
        assert len(self._pending) == 1, "drain follows advance"
        out = self._collect()
        self._greedy()
        return out

    def reset(self) -> None:
        self.model.stream.synchronize()
        self._pending.clear()
        self._greedy()

    def _greedy(self) -> None:
        if self._states:
            with self.model.stream:
                self.graphs.greedy(len(self._states))

    def _launch(self) -> None:
        cp = cupy_module()
        g, m, states = self.graphs, self.model, self._states
        b = len(states)
        stream = m.stream
        rows, out = self._rows[self._turn], self._outs[self._turn]
        self._turn = (self._turn + 1) % RING
        with stream:
            for i, s in enumerate(states):
                kv = s.kv
                layout = kv.layout  # type: ignore[attr-defined]
                kv.reserve(s.n_past + 2)  # type: ignore[attr-defined]
                if kv.layout != layout:  # type: ignore[attr-defined]  # grown or the window moved: new addresses
                    g.tab[i, :3] = cp.asarray(kv.table_row(0)[:3], cp.int64)  # type: ignore[attr-defined]
                    g.tab[i, 7:9] = cp.asarray(kv.scale_cols(), cp.int64)  # type: ignore[attr-defined]
                    g.tab[i, COLD_COL : COLD_COL + 6] = cp.asarray(kv.cold_cols(), cp.int64)  # type: ignore[attr-defined]
                s.n_past += 1
                s.kv.length = s.n_past  # type: ignore[attr-defined]
                params, seed = self._draws[i]
                rows[i] = draw_row(params, seed, s.n_past)
            cp.cuda.runtime.memcpyAsync(
                g.draws.data.ptr, rows.ctypes.data, b * DRAW_COLS * 8, HOST_TO_DEVICE, stream.ptr
            )
            tiers = m.tiers
            if tiers is not None:
                tiers.publish()
            g._launch(b)
            if tiers is not None:
                tiers.overlap()
            cp.cuda.runtime.memcpyAsync(out.ctypes.data, g.chosen.data.ptr, b * 8, DEVICE_TO_HOST, stream.ptr)
            record = tiers.record(b) if tiers is not None else None
            event = cp.cuda.Event(disable_timing=True)
            event.record(stream)
        self._pending.append(_Launch(event, out, record))

    def _collect(self) -> np.ndarray:
        """Wait for the oldest launch; its tokens join the states' tokens when a later launch fed them."""
        launch = self._pending.popleft()
        launch.event.synchronize()
        states = self._states
        chosen = launch.out[: len(states)].copy()
        if launch.record is not None:
            self.model.tiers.finish(launch.record, [s.experts for s in states], [1] * len(states))  # type: ignore[union-attr]
        if self._pending:
            for s, t in zip(states, chosen):
                s.tokens.append(int(t))
        return chosen

"""The decode step as a CUDA graph: one token for each of B sequences, captured once per B.

A Python kernel launch costs ~7 us; replayed from a graph, ~1 us, and a decode step is ~300
launches (6 per MoE layer). The graph reads everything it varies from static buffers: `tab` holds per
slot (k address, v address, cap, position, token, DeltaNet state addresses), so which sequences sit in
the slots, where their caches live and how long they are change by a host write of B rows, not by a
new capture.

The captured step ends with the draw of each slot's next token (kernels/sample.py, by the draw rows
in `draws`: all zeros is greedy) into the token column and `advance` (position + 1), so
`greedy_loop` (the benchmark's decode loop) and the server's decode pipeline (strata/gpu/ahead.py)
replay it back to back with no host round trip; `step` instead rewrites the table each time and
hands the logits back.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import numpy as np

from strata.gpu.kernels import sample
from strata.gpu.layers import TAB, Activations
from strata.gpu.runtime import cupy_module
from strata.runtime.state import SequenceState
from strata.sampling.sampler import DEVICE_TOP_K, DRAW_COLS


class GraphModel(Protocol):
    """What a decode graph reads of its model (strata.gpu.model.GpuModel), so this module needs none of it."""

    ops: Any  # strata.gpu.ops.Ops
    dims: Any
    params: Any
    stream: Any  # the cupy stream every launch goes on
    tiers: Any  # strata.gpu.tiers.GpuTiers or None
    host_inputs: bool  # each step needs the host to know its tokens first (qwen4exp's PLE rows)

    def layers_for(self, n: int) -> list[Any]: ...

    def prepare(self, tokens: list[np.ndarray], states: list[SequenceState], act: Activations) -> None: ...

    def embed(self, act: Activations, n: int, tab: Any) -> None: ...

    def run_layer(self, i: int, layer: Any, act: Activations, n: int, tab: Any, segs: Any) -> None: ...

    def head_logits(self, act: Activations, n: int, out: Any = None) -> Any: ...

    def table_row(self, state: SequenceState, pos: int, token: int) -> list[int]: ...


class DecodeGraphs:
    def __init__(self, model: GraphModel, max_batch: int) -> None:
        self.model = model
        self.max_batch = max_batch
        self._graphs: dict[int, Any] = {}
        self._act: Activations | None = None
        self.tab: Any = None
        self.draws: Any = None
        self.chosen: Any = None
        self.cands: Any = None  # the draw's first stage (kernels/sample.py sample_chunks)
        # the loaded slots' DeltaNet states (RecurrentState), if any, for the capture's put-back; weak, so
        # that a finished sequence's state goes back to the ledger before the next load (a benchmark's warm-up
        # sequences kept alive here beside its measured ones went past a 24 GiB plan by one state each)
        self._recurrent: list[weakref.ref[Any]] = []
        self.use_graphs = True  # False: launch the same kernels eagerly (tests compare the two)

    def _buffers(self) -> Activations:
        if self._act is None:
            cp = cupy_module()
            m = self.model
            self._act = Activations(m.dims, self.max_batch, self.max_batch, m.params.vocab)
            self.tab = cp.zeros((self.max_batch, TAB), cp.int64)
            self.draws = cp.zeros((self.max_batch, DRAW_COLS), cp.float64)  # sampler.draw_row per slot
            self.chosen = cp.zeros(self.max_batch, cp.int64)  # the tokens the last step drew
            self.cands = cp.zeros((2, self.max_batch, sample.SAMPLE_CHUNKS * DEVICE_TOP_K), cp.int32)
        return self._act

    def greedy(self, b: int) -> None:
        """Draw greedily for slots 0..b-1 (what a pipeline's draw rows left behind goes)."""
        self.draws[:b].fill(0)

    def _kernels(self, b: int) -> None:
        """The whole step for slots 0..b-1, reading `tab` and writing logits and the next tokens."""
        m, act = self.model, self._act
        assert act is not None
        m.embed(act, b, self.tab)
        for i, layer in enumerate(m.layers_for(b)):
            m.run_layer(i, layer, act, b, self.tab, None)
        m.head_logits(act, b, act.logits)
        m.ops.sample_rows(act.logits, b, m.params.vocab, self.draws, self.tab, TAB, self.chosen, self.cands)
        m.ops.advance(self.tab, TAB, b)

    def _launch(self, b: int) -> None:
        if not self.use_graphs:
            self._kernels(b)
            return
        g = self._graphs.get(b)
        if g is None:
            # One eager run first loads every function and sets its shared-memory limit, which a
            # capture cannot do. It rewrites this step's own KV rows with the same values, and the
            # table it advanced is put back, so the captured run below repeats it exactly.
            # DeltaNet states are not rewritten but advanced, so they are put back too.
            saved = self.tab[:b].copy()
            live = [r for r in (ref() for ref in self._recurrent) if r is not None]
            recurrent = [(buf, buf.copy()) for r in live for buf in r.device_buffers()]
            self._kernels(b)
            self.tab[:b] = saved
            tiers = self.model.tiers
            if tiers is not None:  # the warm-up's lookups (and prefetches) would be counted twice
                tiers.counts[:b].fill(0)
                if tiers.lookahead is not None:
                    tiers.lookahead.stats.fill(0)
                if (
                    tiers.share is not None
                ):  # the CPU counted its calls before answering: once the run is done
                    self.model.stream.synchronize()
                    tiers.share.take_calls(b)
                    tiers.share.take_mapped(b)
            for buf, kept in recurrent:
                buf[...] = kept
            s = self.model.stream
            s.begin_capture()
            try:
                self._kernels(b)
            finally:
                g = s.end_capture()
            self._graphs[b] = g
        g.launch(self.model.stream)

    def _load(self, tokens: list[int], states: list[SequenceState], extra: int = 1) -> None:
        rows = []
        self._recurrent = [
            weakref.ref(st) for s in states for st in s.layers.values() if hasattr(st, "device_buffers")
        ]
        for t, s in zip(tokens, states):
            s.kv.reserve(s.n_past + extra)  # type: ignore[attr-defined]
            rows.append(self.model.table_row(s, s.n_past, t))
        self.tab[: len(rows)].set(np.asarray(rows, np.int64))

    def step(self, tokens: list[int], states: list[SequenceState]) -> np.ndarray:
        """One decode token for each sequence; returns logits [B, vocab] on the host."""
        b = len(tokens)
        tiers = self.model.tiers
        with self.model.stream:
            act = self._buffers()
            self._load(tokens, states)
            self.model.prepare([np.asarray([t]) for t in tokens], states, act)
            if tiers is not None:
                tiers.publish()
            self._launch(b)
            if tiers is not None:
                tiers.overlap()
            logits = act.logits[:b].get(stream=self.model.stream)
            if tiers is not None:
                tiers.cache.settle(tiers.take_counts(b), 0, [s.experts for s in states], [1] * b)
                tiers.after_pass(b)
        for t, s in zip(tokens, states):
            s.n_past += 1
            s.tokens.append(t)
            s.kv.length = s.n_past  # type: ignore[attr-defined]
        return logits

    def greedy_loop(
        self, tokens: list[int], states: list[SequenceState], steps: int, feed: np.ndarray | None = None
    ) -> np.ndarray:
        """`steps` greedy tokens per sequence, chosen on the device; returns them [steps, B]. feed [steps, B]:
        the tokens each step passes on instead of its draw (a benchmark's fixed stream: a random-weight
        model's greedy text soon repeats one token, whose routing never changes, which a learning cache
        would turn into hits no real text gives)."""
        b = len(tokens)
        cp = cupy_module()
        with self.model.stream:
            act = self._buffers()
            self.greedy(b)
            self._load(tokens, states, extra=steps)
            self.model.prepare([np.asarray([t]) for t in tokens], states, act)
            out = cp.empty((steps, b), cp.int64)
            given = None if feed is None else np.asarray(feed, np.int64).reshape(steps, b)
            fed = None if given is None else cp.asarray(given)
            tiers = self.model.tiers
            # a cache that learns sees every pass (a round trip each); a static one counts once at the end
            learning = tiers is not None and tiers.cache.policy is not None
            for k in range(steps):
                if tiers is not None and (learning or k == 0):
                    tiers.publish()
                self._launch(b)
                out[k] = self.tab[:b, 4]
                if fed is not None:  # over the draw, behind the step on the stream: the next step embeds it
                    self.tab[:b, 4] = fed[k]
                if self.model.host_inputs and k + 1 < steps:  # the next step's inputs, from its tokens (drawn
                    # or fed: both are in the column by now; the read syncs before prepare reuses its buffers)
                    drawn = self.tab[:b, 4].get(stream=self.model.stream)
                    self.model.prepare([np.asarray([t]) for t in drawn], states, act)
                if learning:
                    tiers.overlap()
                    tiers.cache.settle(tiers.take_counts(b), 0, [s.experts for s in states], [1] * b)
                    tiers.after_pass(b)
            chosen = out.get(stream=self.model.stream)
            if tiers is not None and not learning:  # every row decoded `steps` tokens: decode counters
                tiers.cache.settle(tiers.take_counts(b), 0, [s.experts for s in states], [1] * b)
        passed = chosen if given is None else given
        for j, s in enumerate(states):
            s.tokens.extend([tokens[j]] + [int(v) for v in passed[:-1, j]])
            s.n_past += steps
            s.kv.length = s.n_past  # type: ignore[attr-defined]
        return chosen

"""A stand-in for the GPU model, for measuring the server's host side without a GPU (perf/bench_host.py).

The real scheduler, HTTP app, tokenizer, chat template, detokenizer and SSE path run in front of it; only
the forward passes are fabricated. What the GPU path does that the host can feel is kept:
- a decode window is a captured-graph replay and a prompt window an eager pass: the eager pass runs
  Python while it launches its kernels (`eager_host_ms`, the GPU's ~35 ms at a handful of tokens), letting
  go of the GIL a moment at each launch (the H100 server read four newcomers in one window, as this does; a
  stand-in that kept the GIL between the interpreter's 5 ms switches read them in two or three),
  a graph replay only briefly; waiting for the GPU releases it (time.sleep, as a CUDA sync does);
- the GPU is one stream: work is queued behind the work already queued, so the decode pipeline
  (StubAhead, strata/gpu/ahead.py's protocol: draws on the device, Philox uniforms from the host)
  runs the next step while the host handles the last one;
- logits rows are `vocab` float32 wide (151,936 for Qwen3), copied out per window as `.get()` does;
- states carry an attention KV of `kv_bytes_per_token` and a recurrent part of `state_bytes`
  (Qwen3-Next-80B: 24 KiB a token, f16, 12 attention layers; 75.5 MB of DeltaNet state): the prefix
  cache's snapshots and restores wait the PCIe time of that many bytes (`pcie_gb_s`), and a snapshot's
  blocks come from strata.gpu.pinned's pool, whose driver pins pages at `pin_gb_s` holding a lock that
  copies wait for (as cudaHostAlloc does: on an H100 a burst of four snapshot copies took 26-103 ms beside
  pinning, 1.7 ms without).

Times default to the H200's on the 80B shape (issue 15): decode 4.4 ms at b=1, 7.7 at b=4 (linear
between), a prompt window a + b * n with a = 12 ms and b = 0.12 ms a token. `GpuTimes.zero()` makes the
GPU free, leaving only the host's cost.

The model "writes" a fixed text: the token after position p is script[p % len(script)], so the
detokenizer and stop strings see real text. Host-sampled rows put that token 20 nats above N(0, 3)
noise; the pipeline's device draws take it directly.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from strata.gpu.pinned import SPARES, PinnedPool
from strata.runtime.passes import STEP_ROWS
from strata.runtime.state import SequenceState
from strata.sampling.params import SamplingParams
from strata.sampling.sampler import device_drawable, draw_row

RECURRENT = ("stub_deltanet", 0)
SCRIPT = (
    "The lighthouse keeper climbed the spiral stairs each evening, counting the steps as his father had "
    "taught him. At the top he trimmed the wick, polished the great lens, and watched the beam sweep "
    "across the dark water. Ships passed far out, their lights small and steady, and he wrote each one "
    "into the log with the hour and the state of the sea. "
)


@dataclass(frozen=True, slots=True)
class GpuTimes:
    decode_b1_ms: float = 4.4
    decode_b4_ms: float = 7.7
    prompt_a_ms: float = 12.0  # a prompt window's fixed part (decode rows, weights read once)
    prompt_b_ms: float = 0.12  # per token of the window
    eager_host_ms: float = 35.0  # host time an eager pass spends launching kernels
    graph_host_ms: float = 0.1  # host time of a graph replay's launch
    # prefix-cache snapshots and restores between VRAM and pinned blocks, and the driver's pinning of fresh
    # blocks (H100 host, 2026-12-06: 75.5 MB copied in 1.7 ms, pinned in 40.6 ms)
    pcie_gb_s: float = 44.0
    pin_gb_s: float = 1.9
    # tiered runs: windows of this many rows or more stage their misses first (tiers/borrow.py staging_rows),
    # a copy of every missing expert whatever the window's length, then pay their own part
    staged_from: int = 1 << 30
    staged_a_ms: float = 0.0
    staged_b_ms: float = 0.0

    @classmethod
    def zero(cls) -> GpuTimes:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, float("inf"), float("inf"))

    @classmethod
    def h100_24g(cls) -> GpuTimes:
        """The 80B file at a 24 GiB budget on the H100 host of perf/pp_short_paths_h100_2026-12-06.json
        (zero-copy 50.6 GB/s): decode b1 78.9 tok/s, b4 94.0; passes of up to 46 rows per pair with their
        misses read in place, pp9 105 ms and pp32 327 ms; staged from 47 (staging_rows there), pp64 587
        ms, pp512 602 ms, 2,048-token chunks 561-577 ms in an earlier server log; snapshots through pinned
        memory."""
        return cls(12.7, 42.5, 20.0, 10.0, 35.0, 0.1, 44.0, 1.9, 47, 560.0, 0.03)

    def decode_s(self, rows: int) -> float:
        return (self.decode_b1_ms + (self.decode_b4_ms - self.decode_b1_ms) * (rows - 1) / 3) / 1e3

    def prompt_s(self, tokens: int) -> float:
        if tokens >= self.staged_from:
            return (self.staged_a_ms + self.staged_b_ms * tokens) / 1e3
        return (self.prompt_a_ms + self.prompt_b_ms * tokens) / 1e3


LAUNCH_S = 7e-6  # a kernel launch from Python


def hold_gil(seconds: float) -> None:
    """Python work for `seconds` (launching kernels): bytecode between launches, each launch a moment
    without the GIL, so a thread waiting for the GIL gets it at the next launch rather than after the
    interpreter's 5 ms switch interval."""
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        launch = min(end, now + LAUNCH_S)
        while time.perf_counter() < launch:
            pass
        time.sleep(0)


class Device:
    """The GPU's one stream as a timeline: work starts when the work before it is done."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy_s = 0.0

    def queue(self, seconds: float, not_before: float = 0.0) -> float:
        """Queue work of `seconds`; returns when it will be done."""
        start = max(time.perf_counter(), self.free_at, not_before)
        self.free_at = start + seconds
        self.busy_s += seconds
        return self.free_at

    @staticmethod
    def wait(until: float) -> None:
        left = until - time.perf_counter()
        if left > 0:
            time.sleep(left)  # releases the GIL, as a CUDA event or stream sync does


_DRIVER = threading.Lock()  # the driver's lock: pinning holds it, a copy waits for it to start


@functools.cache
def _pool(pin_gb_s: float) -> PinnedPool:
    """The snapshots' pool as on the GPU (spares and all), over blocks whose pinning takes its time."""

    def pin(n: int) -> tuple[np.ndarray, int]:
        with _DRIVER:
            time.sleep(n / (pin_gb_s * 1e9))  # the GIL released, as cudaHostAlloc releases it
        b = np.empty(n, np.uint8)  # reserved, never written: the cache's GiBs cost no RAM
        return b, b.ctypes.data

    return PinnedPool(pin, spares=SPARES)


class _OnHost:
    """A device part copied to a pinned block, and back by copy(): each way waits the PCIe time, the GIL
    released as cudaMemcpy releases it."""

    def __init__(self, part: StubKV | StubRecurrent, nbytes: int) -> None:
        self.part = part  # a frozen copy of the device part
        self.data = _pool(part.pin).empty((nbytes,), np.uint8)
        with _DRIVER:
            pass
        time.sleep(nbytes / (part.pcie * 1e9))

    def nbytes(self) -> int:
        return self.data.nbytes

    def copy(self) -> StubKV | StubRecurrent:
        time.sleep(self.data.nbytes / (self.part.pcie * 1e9))
        return self.part.copy()


class StubKV:
    """Attention KV in "VRAM": only its length is real."""

    def __init__(self, bytes_per_token: int, pcie_gb_s: float, pin_gb_s: float, length: int = 0) -> None:
        self.bytes_per_token, self.pcie, self.pin, self.length = bytes_per_token, pcie_gb_s, pin_gb_s, length

    def truncate(self, n: int) -> None:
        self.length = min(self.length, n)

    def copy(self) -> StubKV:
        return StubKV(self.bytes_per_token, self.pcie, self.pin, self.length)

    def nbytes(self) -> int:
        return self.length * self.bytes_per_token

    def to_host(self) -> _OnHost:
        return _OnHost(self.copy(), self.nbytes())


class StubRecurrent:
    """A fixed-size recurrent state in "VRAM"."""

    def __init__(self, nbytes: int, pcie_gb_s: float, pin_gb_s: float) -> None:
        self._bytes, self.pcie, self.pin = nbytes, pcie_gb_s, pin_gb_s

    def copy(self) -> StubRecurrent:
        return StubRecurrent(self._bytes, self.pcie, self.pin)

    def nbytes(self) -> int:
        return self._bytes

    def to_host(self) -> _OnHost:
        return _OnHost(self.copy(), self._bytes)


class StubModel:
    """forward / forward_batch / new_state / decode_ahead as strata.gpu.model.GpuModel offers them."""

    def __init__(
        self,
        script: Sequence[int],
        vocab: int = 151_936,
        times: GpuTimes | None = None,
        max_batch: int = 4,
        kv_bytes_per_token: int = 24_576,
        state_bytes: int = 75_497_472,
    ) -> None:
        self.script = np.asarray(script, np.int64)
        self.params = SimpleNamespace(vocab=vocab)
        self.times = times or GpuTimes()
        self.max_batch = max_batch
        self.prompt_rows = 0  # all-resident: a prompt's passes are the chunk's (Model.prompt_rows)
        self.kv_bytes, self.state_bytes = kv_bytes_per_token, state_bytes
        self.device = Device()
        rng = np.random.default_rng(0)
        self._noise = (rng.standard_normal((8, vocab)) * 3).astype(np.float32)  # [8, vocab]
        self._turn = 0

    def next_token(self, position: int) -> int:
        """The token the model writes after `position` tokens."""
        return int(self.script[position % len(self.script)])

    def new_state(self) -> SequenceState:
        t = self.times
        st = SequenceState(StubKV(self.kv_bytes, t.pcie_gb_s, t.pin_gb_s))  # type: ignore[arg-type]
        if self.state_bytes:
            st.layers[RECURRENT] = StubRecurrent(self.state_bytes, t.pcie_gb_s, t.pin_gb_s)
        return st

    def decode_ahead(self) -> StubAhead:
        return StubAhead(self)

    def forward(self, tokens: np.ndarray, state: SequenceState, all_logits: bool = True) -> np.ndarray:
        rows = self.forward_batch([tokens], [state])
        return np.stack(rows)

    def forward_batch(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        tokens = [np.asarray(t, np.int64).reshape(-1) for t in tokens]
        t, dev = self.times, self.device
        if max(len(x) for x in tokens) <= STEP_ROWS and len(tokens) <= self.max_batch:
            for j in range(max(len(x) for x in tokens)):  # decode steps, a row of each sequence a step
                hold_gil(t.graph_host_ms / 1e3)
                done = dev.queue(t.decode_s(sum(len(x) > j for x in tokens)))
        else:  # the eager pass: the GPU follows the launches, and ends no sooner than the last one
            done = dev.queue(t.prompt_s(sum(len(x) for x in tokens)))
            hold_gil(t.eager_host_ms / 1e3)
            done = dev.free_at = max(done, time.perf_counter())
        for x, s in zip(tokens, states):
            advance(s, x.tolist())
        dev.wait(done)
        return list(self._logits(states))

    def _logits(self, states: list[SequenceState]) -> np.ndarray:
        """[rows, vocab]: noise with each state's next script token far above it, fresh memory as `.get()`
        gives."""
        out = np.empty((len(states), self.params.vocab), np.float32)
        for i, s in enumerate(states):
            out[i] = self._noise[self._turn % len(self._noise)]
            out[i, self.next_token(s.n_past)] += 20.0
            self._turn += 1
        return out


def advance(state: SequenceState, fed: list[int]) -> None:
    """What a pass leaves in a state that consumed `fed`."""
    state.n_past += len(fed)
    state.tokens.extend(fed)
    state.kv.length = state.n_past  # type: ignore[attr-defined]


class StubAhead:
    """The decode pipeline of strata/gpu/ahead.py: each launch queues a step that draws on the device."""

    def __init__(self, model: StubModel) -> None:
        self.model = model
        self.max_batch = model.max_batch
        self._pending: deque[tuple[float, np.ndarray]] = deque()
        self._states: list[SequenceState] = []
        self._draws: Sequence[tuple[SamplingParams, int]] = ()

    def drawable(self, params: SamplingParams) -> bool:
        return device_drawable(params, self.model.params.vocab)

    def start(
        self, states: list[SequenceState], tokens: list[int], draws: Sequence[tuple[SamplingParams, int]]
    ) -> None:
        assert not self._pending
        self._states, self._draws = states, draws
        for s, tok in zip(states, tokens):
            s.tokens.append(tok)
        self._launch()

    def advance(self) -> np.ndarray:
        self._launch()
        return self._collect()

    def drain(self) -> np.ndarray:
        assert len(self._pending) == 1
        return self._collect()

    def reset(self) -> None:
        self._pending.clear()

    def _launch(self) -> None:
        m, states = self.model, self._states
        hold_gil(m.times.graph_host_ms / 1e3)
        for s, (params, seed) in zip(states, self._draws):
            s.n_past += 1
            s.kv.length = s.n_past  # type: ignore[attr-defined]
            draw_row(params, seed, s.n_past)  # the host's share of a device draw: its Philox uniform
        chosen = np.asarray([m.next_token(s.n_past) for s in states], np.int64)
        self._pending.append((m.device.queue(m.times.decode_s(len(states))), chosen))

    def _collect(self) -> np.ndarray:
        done, chosen = self._pending.popleft()
        Device.wait(done)
        if self._pending:  # the step just launched fed these
            for s, t in zip(self._states, chosen):
                s.tokens.append(int(t))
        return chosen.copy()

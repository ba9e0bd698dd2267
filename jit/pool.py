"""The CPU expert pool: worker threads that run JIT kernels, handed work as futures.

Legend: T = tokens in the window, D = hidden size, A = experts per token, E = experts.

Kernels are ctypes calls, which release the GIL, so N workers really compute in parallel while
the Python thread that asked waits or helps. `submit` returns a concurrent.futures.Future (await
it from asyncio with asyncio.wrap_future); `run` spreads a list of tasks over the workers and the
calling thread and returns when all are done. Workers are pinned to the plan's worker CPUs.
Dense matmuls are split by rows over spinning helper threads instead (spin.py): an executor
hand-off costs more than the 20-150 us a decode-step matmul takes.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T

from strata.jit.cpus import CpuPlan
from strata.jit.kernels import Kernels
from strata.jit.spin import SpinGroup

# Rough kernel speeds (one thread, measured on znver4 with perf/bench_jit.py); they only decide
# whether a dense matmul is worth splitting across threads, since a hand-off costs ~20-50 us.
BYTES_PER_S = 8e9  # quantized bytes streamed at one token
MACS_PER_S = 40e9  # multiply-adds once several tokens share each decoded block
SPLIT_MIN_S = 150e-6  # below this much work, one thread does it all
SPIN_MIN_S = 10e-6  # the same through the spinning helpers (spin.py), whose hand-off is ~1 us


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """One 3-D expert tensor [E, rows, row_bytes] as the kernels need it."""

    raw: np.ndarray  # uint8 [E, rows, row_bytes], the mmap view
    qtype: T
    table: np.ndarray | None = None  # int64 [E]: each expert's address, when the tiers place it elsewhere

    @property
    def rows(self) -> int:
        return int(self.raw.shape[1])

    @property
    def row_bytes(self) -> int:
        return int(self.raw.shape[2])

    def address(self, e: int) -> int:
        if self.table is not None:
            return int(self.table[e])
        return int(self.raw.ctypes.data) + int(e) * self.rows * self.row_bytes


class ExpertPool:
    def __init__(self, kernels: Kernels, plan: CpuPlan) -> None:
        self.kernels = kernels
        self.plan = plan
        self.workers = plan.workers
        self._exec = ThreadPoolExecutor(
            plan.workers, thread_name_prefix="strata-pool", initializer=_pin, initargs=(plan.worker_cpus,)
        )
        self._spin: SpinGroup | None = None  # started by the first dense matmul worth splitting
        self._qmm: dict[T, tuple[Callable[..., None], int, int, int]] = {}  # fn, address, block, bytes

    def close(self) -> None:
        if self._spin is not None:
            self._spin.close()
        self._exec.shutdown(wait=True)

    def _spin_group(self) -> SpinGroup:
        if self._spin is None:
            self._spin = SpinGroup(
                *self.kernels.spin(), self.workers - 1, functools.partial(_pin, self.plan.worker_cpus)
            )
        return self._spin

    def pin_helper(self) -> None:
        """Pin the calling (helper) thread to the plan's aux CPUs, away from the workers."""
        _pin(self.plan.aux_cpus)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self._exec.submit(fn, *args)

    def run(self, tasks: Sequence[Callable[[], None]]) -> None:
        """Run every task; at most `workers` at once, the caller taking its share (no hand-off at
        all for a single task). Tasks are taken in order, so put the longest first."""
        if len(tasks) <= 1 or self.workers <= 1:
            for t in tasks:
                t()
            return
        counter = itertools.count()  # next() on it is atomic under the GIL

        def drain() -> None:
            while (i := next(counter)) < len(tasks):
                tasks[i]()

        if self._spin is not None:
            self._spin.park(True)  # the spinning helpers would only take CPU from these tasks
        try:
            helpers = [self._exec.submit(drain) for _ in range(min(self.workers, len(tasks)) - 1)]
            drain()
            for h in helpers:
                h.result()  # re-raises a task's exception here
        finally:
            if self._spin is not None:
                self._spin.park(False)

    def matmul(self, raw: np.ndarray, qtype: T, x: np.ndarray) -> np.ndarray:
        """x [N, C] . W^T for a 2-D quantized W: rows split among threads when that pays off."""
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        n_rows = raw.shape[0]
        out = np.empty((x.shape[0], n_rows), np.float32)
        work = max(raw.nbytes / BYTES_PER_S, n_rows * x.shape[1] * x.shape[0] / MACS_PER_S)
        # spin.py posts tasks with plain numpy stores, which only x86 keeps in program order
        if self.workers > 1 and work >= SPIN_MIN_S and n_rows >= 32 * self.workers and self.kernels.host.x86:
            kernel = self._kernel(qtype, raw, x)
            group = self._spin_group()
            if kernel is not None and group.lock.acquire(blocking=False):  # else another thread splits
                try:
                    step = (-(-n_rows // self.workers) + 15) // 16 * 16  # whole register tiles per part
                    group.matmul(
                        *kernel, raw, x, out, [(r, min(n_rows, r + step)) for r in range(0, n_rows, step)]
                    )
                finally:
                    group.lock.release()
                return out
        parts = int(min(self.workers, work // SPLIT_MIN_S, n_rows // 16))
        if parts <= 1:
            return self.kernels.matmul(raw, qtype, x, out=out)
        step = (-(-n_rows // parts) + 15) // 16 * 16  # whole register tiles per part
        bounds = [(r, min(n_rows, r + step)) for r in range(0, n_rows, step)]
        self.run([lambda b=b: self.kernels.matmul(raw, qtype, x, out=out, rows=b) for b in bounds])
        return out

    def _kernel(self, qtype: T, raw: np.ndarray, x: np.ndarray) -> tuple[Callable[..., None], int] | None:
        """The qmm kernel for qtype and its address, after the checks Kernels.matmul makes (done
        here, before any helper is handed the pointers); None if they fail."""
        hit = self._qmm.get(qtype)
        if hit is None:
            if not self.kernels.supports(qtype):
                return None
            fn = self.kernels.fn(qtype)
            hit = self._qmm[qtype] = (
                fn,
                int(ctypes.cast(fn, ctypes.c_void_p).value or 0),
                *GGML_QUANT_SIZES[T(qtype)],
            )
        fn, address, block, size = hit
        if (
            raw.ndim != 2
            or not raw.flags.c_contiguous
            or raw.shape[1] % size
            or x.shape[1] * size != raw.shape[1] * block
        ):
            return None
        return fn, address

    def moe(
        self,
        x: np.ndarray,
        ids: np.ndarray,
        weights: np.ndarray,
        gate: ExpertWeights,
        up: ExpertWeights,
        down: ExpertWeights,
    ) -> np.ndarray:
        """sum_a weights[t, a] * expert_{ids[t, a]}(x[t]) -> [T, D]: one fused call per used expert.

        Tokens are sorted by expert, so each expert's weights are read once per window. Each expert
        writes its weighted rows into its own (token, a) slots; the slots are then summed over a in
        a fixed order, so the result does not depend on which thread finished first.
        """
        x = np.ascontiguousarray(x, dtype=np.float32)  # [T, D]
        t, a = ids.shape
        d, f = x.shape[1], gate.rows
        flat = ids.reshape(-1)  # [T*A]
        order = np.argsort(flat, kind="stable").astype(np.int32)  # slot indices grouped by expert
        counts = np.bincount(flat, minlength=gate.raw.shape[0])
        tok = order // np.int32(a)  # token of each slot, in expert order
        tw = np.ascontiguousarray(weights.reshape(-1)[order], dtype=np.float32)
        slots = np.empty((t * a, d), np.float32)  # [T*A, D]
        fn = self.kernels.expert()
        kern = {w.qtype: self.kernels.fn(w.qtype) for w in (gate, up, down)}
        ptr = {q: ctypes.cast(k, ctypes.c_void_p).value for q, k in kern.items()}
        starts = np.concatenate([[0], np.cumsum(counts)])
        tasks = []
        for e in np.argsort(-counts, kind="stable"):  # biggest first: no long straggler at the end
            n = int(counts[e])
            if n == 0:
                break
            s = int(starts[e])
            scratch = np.empty(n * (2 * d + 2 * f), np.float32)
            args = (
                x.ctypes.data,
                d,
                tok[s:].ctypes.data,
                tw[s:].ctypes.data,
                order[s:].ctypes.data,
                n,
                ptr[gate.qtype],
                gate.address(e),
                gate.row_bytes,
                ptr[up.qtype],
                up.address(e),
                up.row_bytes,
                ptr[down.qtype],
                down.address(e),
                down.row_bytes,
                f,
                scratch.ctypes.data,
                slots.ctypes.data,
            )
            tasks.append(lambda args=args, keep=scratch: fn(*args))
        self.run(tasks)
        return slots.reshape(t, a, d).sum(axis=1)


def _pin(cpus: tuple[int, ...]) -> None:
    if cpus and set(cpus) != os.sched_getaffinity(0):
        os.sched_setaffinity(0, cpus)  # pid 0 = this thread on Linux

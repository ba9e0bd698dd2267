"""GPU time per kernel for the benchmarks (perf/bench_gpu.py, perf/bench_long.py): every launch of an eager
pass timed with a pair of events, and the KV window's copies (to the host, staged for a long pass) too; and
inside a captured decode step, each kernel's share measured by repeating its launches (`graph_profile`).

Each strata.gpu module binds `launch` at import (`from strata.gpu.runtime import launch`), so a wrapper must
replace that name in every module holding it, not only in ops.py: the qwen4exp, mixer and MoE launches live in
modules of their own.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

Launch = Callable[..., None]
WINDOW_COPIES = "(KV window copies)"  # GpuKV._copy2d: cells to the host, or staged for a long pass


@contextmanager
def launches_through(make: Callable[[Launch], Launch]) -> Iterator[None]:
    """Within the block every strata.gpu module launches through make(the original launch)."""
    from strata.gpu import runtime

    orig = runtime.launch
    wrapped = make(orig)
    holders = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("strata.gpu") and m is not None and getattr(m, "launch", None) is orig
    ]
    for m in holders:
        m.launch = wrapped  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in holders:
            m.launch = orig  # type: ignore[attr-defined]


def timed_ms(cp: Any, fn: Callable[[], None], reps: int) -> float:
    """Median ms of fn()'s launches on the current stream over reps runs (CUDA events), after one warm-up."""
    fn()
    out = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        out.append(cp.cuda.get_elapsed_time(e0, e1))
    return statistics.median(out)


class Profile:
    """GPU time per kernel name (eager passes only: a captured graph records no events of ours), the KV
    window's copies as one more row."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.events: list[tuple[str, Any, Any]] = []

    def _timed(self, name: Callable[[Any], str], fn: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any, **kw: Any) -> None:
            e0, e1 = self.cp.cuda.Event(), self.cp.cuda.Event()
            e0.record()
            fn(*args, **kw)
            e1.record()
            self.events.append((name(args), e0, e1))

        return run

    @contextmanager
    def running(self) -> Iterator[Self]:
        from strata.gpu import kv
        from strata.gpu.runtime import KERNEL_NAMES

        self.events.clear()
        copy2d = kv.GpuKV._copy2d

        def kernel(orig: Launch) -> Launch:
            return self._timed(lambda args: KERNEL_NAMES.get(id(args[0]), "?"), orig)

        kv.GpuKV._copy2d = self._timed(lambda _args: WINDOW_COPIES, copy2d)  # type: ignore[method-assign]
        try:
            with launches_through(kernel):
                yield self
        finally:
            kv.GpuKV._copy2d = copy2d  # type: ignore[method-assign]

    def table(self) -> list[tuple[str, int, float]]:
        """(name, launches, total ms), the largest first."""
        self.cp.cuda.Device().synchronize()
        by: dict[str, list[float]] = defaultdict(list)
        for name, e0, e1 in self.events:
            by[name].append(self.cp.cuda.get_elapsed_time(e0, e1))
        return sorted(((k, len(v), sum(v)) for k, v in by.items()), key=lambda r: -r[2])


def print_table(rows: list[tuple[str, int, float]], title: str, top: int = 15) -> None:
    total = sum(r[2] for r in rows) or 1.0
    print(f"  {title}: {total:,.1f} ms in the launches and copies timed", flush=True)
    for name, n, ms in rows[:top]:
        print(f"    {ms:9.2f} ms {100 * ms / total:5.1f}%  x{n:<6} {name}", flush=True)


def graph_profile(gpu: Any, b: int = 1, reps: int = 25) -> list[tuple[str, int, float]]:
    """In-graph time per kernel name: the decode step captured once as is and once per name with every
    launch of that name repeated, (t_repeated - t_base) / launches. Unlike the eager profile this has
    no Python launch gap in it, so it is the time the graph actually spends in each kernel. Where the graph
    has side branches (the lookahead's copies at a VRAM cap, the shared expert), a repeated launch off the
    critical path costs nothing and one on it can shift what overlaps the branch: such rows read noisy, some
    negative, at a cap (2026-12-04: the Q6_K head 270 us there, 151 all-resident)."""
    import cupy as cp

    from strata.gpu.runtime import KERNEL_NAMES

    g, st = gpu.graphs, gpu.stream
    states = [gpu.new_state() for _ in range(b)]
    g.greedy_loop(list(range(1, b + 1)), states, 1)  # buffers and the graph's functions loaded
    g._load(list(range(1, b + 1)), states, extra=64)  # positions are put back before every replay
    counts: dict[str, int] = defaultdict(int)

    def capture(target: str | None) -> Any:
        def repeating(orig: Any) -> Any:
            def lw(fn: Any, grid: Any, block: Any, args: Any, smem: int = 0) -> None:
                orig(fn, grid, block, args, smem)
                name = KERNEL_NAMES.get(id(fn), "?")
                if target is None:
                    counts[name] += 1
                elif name == target:
                    orig(fn, grid, block, args, smem)

            return lw

        with launches_through(repeating), st:
            st.begin_capture()
            try:
                g._kernels(b)
            finally:
                graph = st.end_capture()
        return graph

    saved = g.tab[:b].copy()

    def timed(graph: Any) -> float:
        """Median over replays, each at the same positions (decode attention grows with the position)."""
        ts = []
        with st:
            for k in range(reps + 2):
                g.tab[:b] = saved
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(st)
                graph.launch(st)
                e1.record(st)
                e1.synchronize()
                if k >= 2:
                    ts.append(cp.cuda.get_elapsed_time(e0, e1))
        return statistics.median(ts)

    base = timed(capture(None))
    out = [("(whole step)", 1, base)]
    for name, n in sorted(counts.items()):
        if name.startswith("advance") or name == "?":
            continue
        out.append((name, n, (timed(capture(name)) - base) / n * 1e3))  # us per launch
    return sorted(out, key=lambda r: -r[1] * r[2] if r[0] != "(whole step)" else -1e18)

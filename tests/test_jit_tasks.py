"""The task-list executor (jit/tasks.py): a table of qmm calls run over helpers and the caller must
give exactly the bits of one kernel call per matrix, run every task exactly once in every round,
and wait_change must see another thread's write or time out."""

from __future__ import annotations

import ctypes
import itertools
import threading
import time

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T
from llvmlite import ir
from quant_blocks import random_blocks

from strata.jit import tasks
from strata.jit.irutil import I32, I64, VOID, c64, loop
from strata.jit.kernels import Kernels
from strata.jit.matmul_ir import QMM_ARGS


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    return Kernels(tmp_path_factory.mktemp("jit-cache"))


def address(fn: ctypes._CFuncPtr) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def task(fn: int, raw: np.ndarray, x: np.ndarray, y: np.ndarray, col: int, r0: int, r1: int) -> list[int]:
    """A row computing y[:, col + r] = x . raw[r]^T for r in [r0, r1); y may be wider than the matrix."""
    n_tok = x.shape[0]
    return [
        fn,
        raw.ctypes.data,
        raw.shape[1],
        x.ctypes.data,
        x.strides[0] // 4,
        n_tok,
        y.ctypes.data + 4 * col,
        y.strides[0] // 4,
        r0,
        r1,
    ]


def counter_fn(kernels: Kernels) -> int:
    """A QMM_ARGS-shaped function that atomically adds 1 to ((i64*)w)[r] for r in [r0, r1): a task
    run twice (or never) shows in the counts, which pure writes would hide."""

    def build() -> ir.Module:
        mod = ir.Module(name="count_rows")
        fn = ir.Function(mod, ir.FunctionType(VOID, QMM_ARGS), "count_rows")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        counts = b.bitcast(fn.args[0], I64.as_pointer())
        with loop(b, fn.args[7], fn.args[8], 1) as r:
            b.atomic_rmw("add", b.gep(counts, [r]), c64(1), "monotonic")
        b.ret_void()
        return mod

    return kernels.compiler.symbols("count_rows", "", build, ("count_rows",))["count_rows"]


@pytest.mark.parametrize("helpers", [0, 1, 3])
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q8_0], ids=lambda t: t.name)
def test_task_table_equals_one_matmul(kernels: Kernels, qtype: T, helpers: int) -> None:
    """Several matrices, each split into ragged row ranges, written at offsets of one wide y."""
    block = GGML_QUANT_SIZES[qtype][0]
    fn = address(kernels.fn(qtype))
    rng = np.random.default_rng(helpers)
    shapes = [(300, 2 * block), (257, 4 * block), (64, 1024)]
    mats = [random_blocks(qtype, rows, cols, seed=i) for i, (rows, cols) in enumerate(shapes)]
    width = sum(rows for rows, _ in shapes) + 17  # a margin no task writes: it must stay NaN
    group = tasks.TaskGroup(kernels, helpers)
    try:
        for n_tok in (1, 3, 9):
            wide = [rng.standard_normal((n_tok, cols + 32)).astype(np.float32) for _, cols in shapes]
            xs = [x[:, :cols] for x, (_, cols) in zip(wide, shapes)]  # ldx > cols
            y = np.full((n_tok, width), np.nan, np.float32)
            rows, col = [], 0
            for raw, x in zip(mats, xs):
                cuts = np.unique(np.concatenate([[0, raw.shape[0]], rng.integers(0, raw.shape[0], 12)]))
                rows += [task(fn, raw, x, y, col, int(a), int(b)) for a, b in itertools.pairwise(cuts)]
                col += raw.shape[0]
            table = np.array(rows, np.int64)[rng.permutation(len(rows))]
            for _ in range(5):  # repeated: helpers find rounds from every state (spinning, just done)
                y[:] = np.nan
                group.run(table)
                want = np.concatenate([kernels.matmul(raw, qtype, x) for raw, x in zip(mats, xs)], axis=1)
                assert np.array_equal(y[:, :col], want)
                assert np.isnan(y[:, col:]).all()
    finally:
        group.close()


@pytest.mark.parametrize("helpers", [1, 2])
def test_every_task_runs_once_a_round(kernels: Kernels, helpers: int) -> None:
    """Thousands of rounds of 0-200 tiny tasks, helpers parked and unparked and left to nap, round
    numbers wrapping: every round each task's counters are exactly 1, and the control block
    accounts for every task."""
    fn, k, most = counter_fn(kernels), 3, 200
    counts = np.zeros(most * k + 8, np.int64)
    x, y = np.zeros((1, 32), np.float32), np.zeros((1, 1), np.float32)
    w = counts.view(np.uint8).reshape(1, -1)
    table = np.array([task(fn, w, x, y, 0, i * k, i * k + k) for i in range(most)], np.int64)
    rng, rounds = np.random.default_rng(0), 0
    group = tasks.TaskGroup(kernels, helpers)
    group.ctl[tasks.NEXT] = (tasks.ROUNDS - 3000) << tasks.ROUND_SHIFT  # the rounds wrap half way through
    try:
        for i in range(6000):
            if i % 500 == 250:
                group.park(i % 1000 == 250)
            if i % 700 == 699:
                time.sleep(0.01)  # long enough for helpers to start napping
            n = int(rng.integers(0, most + 1))
            counts[:] = 0
            if i % 2:
                group.run(table, n)  # the kept table
            else:
                group.run(table[:n])  # a new slice each round
            assert (counts[: n * k] == 1).all() and not counts[n * k :].any(), f"round {i}, n = {n}"
            rounds += n > 0
            posted = tasks.unpack(int(group.ctl[tasks.NEXT]))
            if n:
                assert posted == ((tasks.ROUNDS - 3000 + rounds) % tasks.ROUNDS, n, n)
                assert group.ctl[tasks.FINISHED] == n
    finally:
        group.close()


def test_run_checks_the_table(kernels: Kernels) -> None:
    group = tasks.TaskGroup(kernels, 0)
    before = int(group.ctl[tasks.NEXT])
    group.run(np.zeros((0, tasks.TASK_COLS), np.int64))  # nothing to do: returns at once
    assert int(group.ctl[tasks.NEXT]) == before
    for bad in (
        np.zeros((2, tasks.TASK_COLS), np.int32),
        np.zeros((2, 9), np.int64),
        np.zeros((tasks.TASK_COLS, 2), np.int64).T,
        np.zeros(tasks.TASK_COLS, np.int64),
        [[0] * 10],
    ):
        with pytest.raises(ValueError, match="C-contiguous int64"):
            group.run(bad)  # type: ignore[arg-type]
    table = np.zeros((3, tasks.TASK_COLS), np.int64)
    for n in (-1, 4):
        with pytest.raises(ValueError, match="table's rows"):
            group.run(table, n)
    with pytest.raises(ValueError, match="at most"):
        group.run(np.zeros((tasks.MAX_TASKS, tasks.TASK_COLS), np.int64))  # calloc'd: costs no memory


MEET_NAP_US, MEET_NAPS = 100, 300_000  # a partner gets >= 30 s: a loaded 2-core CI box stalls seconds


def meet_fn(kernels: Kernels) -> int:
    """A QMM_ARGS-shaped function for two tasks that must run at the same time: each adds 1 to
    ((i64*)w)[r0], then waits for the other's 1, napping MEET_NAP_US (usleep's address is w[2])
    between looks; one that gives up after MEET_NAPS naps adds 1 to w[r1]. The bound is wall time,
    not a loop count: a tight loop of 2**32 looks ends in ~1 s, which a descheduled helper can miss."""

    def build() -> ir.Module:
        mod = ir.Module(name="meet")
        fn = ir.Function(mod, ir.FunctionType(VOID, QMM_ARGS), "meet")
        blk = {n: fn.append_basic_block(n) for n in ("entry", "wait", "again", "gave_up", "met")}
        b = ir.IRBuilder(blk["entry"])
        counts = b.bitcast(fn.args[0], I64.as_pointer())
        here, miss = b.gep(counts, [fn.args[7]]), b.gep(counts, [fn.args[8]])
        usleep_type = ir.FunctionType(I32, (I32,)).as_pointer()
        usleep = b.inttoptr(b.load(b.gep(counts, [c64(2)])), usleep_type)
        b.atomic_rmw("add", here, c64(1), "acq_rel")
        b.branch(blk["wait"])
        b.position_at_end(blk["wait"])
        i = b.phi(I64)
        i.add_incoming(c64(0), blk["entry"])
        met = b.icmp_signed(">=", b.load_atomic(here, "acquire", 8), c64(2))
        b.cbranch(met, blk["met"], blk["again"])
        b.position_at_end(blk["again"])
        b.call(usleep, [ir.Constant(I32, MEET_NAP_US)])
        i.add_incoming(b.add(i, c64(1)), blk["again"])
        b.cbranch(b.icmp_signed("<", i, c64(MEET_NAPS)), blk["wait"], blk["gave_up"])
        b.position_at_end(blk["gave_up"])
        b.atomic_rmw("add", miss, c64(1), "monotonic")
        b.branch(blk["met"])
        b.position_at_end(blk["met"])
        b.ret_void()
        return mod

    return kernels.compiler.symbols("meet_nap", "", build, ("meet",))["meet"]


def test_helpers_run_tasks_beside_the_caller(kernels: Kernels) -> None:
    """Two tasks that can only finish together: the helper must have claimed one of them."""
    fn, counts = meet_fn(kernels), np.zeros(3, np.int64)
    w = counts.view(np.uint8).reshape(1, -1)
    x, y = np.zeros((1, 32), np.float32), np.zeros((1, 1), np.float32)
    table = np.array([task(fn, w, x, y, 0, 0, 1)] * 2, np.int64)
    group = tasks.TaskGroup(kernels, 1)
    try:
        for _ in range(20):
            counts[:] = 0, 0, ctypes.cast(ctypes.CDLL(None).usleep, ctypes.c_void_p).value
            group.run(table)
            assert counts[:2].tolist() == [2, 0]
    finally:
        group.close()


def test_a_helper_that_starts_late_still_serves_the_first_round(kernels: Kernels) -> None:
    """The helper enters its loop only after the caller has posted round 1 (its start waits on a timer the
    caller's round outlasts): it must still claim one of the two tasks that can only finish together."""
    fn, counts = meet_fn(kernels), np.zeros(3, np.int64)
    w = counts.view(np.uint8).reshape(1, -1)
    x, y = np.zeros((1, 32), np.float32), np.zeros((1, 1), np.float32)
    table = np.array([task(fn, w, x, y, 0, 0, 1)] * 2, np.int64)
    posted = threading.Event()
    group = tasks.TaskGroup(kernels, 1, pin=lambda: posted.wait())
    timer = threading.Timer(0.3, posted.set)  # fires while the caller's round waits in the meet
    try:
        counts[:] = 0, 0, ctypes.cast(ctypes.CDLL(None).usleep, ctypes.c_void_p).value
        timer.start()
        group.run(table)
        assert counts[:2].tolist() == [2, 0]
    finally:
        timer.cancel()
        posted.set()
        group.close()


@pytest.mark.parametrize("timeout_us", [-1, 5_000_000])
def test_wait_change_sees_another_threads_write(kernels: Kernels, timeout_us: int) -> None:
    flag = np.zeros(1, np.int64)
    waiter = tasks.Waiter(kernels)
    writer = threading.Timer(0.02, lambda: flag.__setitem__(0, 7))  # runs only if the wait drops the GIL
    writer.start()
    try:
        assert waiter(flag.ctypes.data, 0, timeout_us) == 7
    finally:
        writer.join()
    assert tasks.wait_change(kernels, flag.ctypes.data, 0, 0) == 7  # already changed: at once


def test_wait_change_times_out(kernels: Kernels) -> None:
    flag = np.full(1, 3, np.int64)
    start = time.perf_counter()
    assert tasks.wait_change(kernels, flag.ctypes.data, 3, 2000) == 3
    assert tasks.wait_change(kernels, flag.ctypes.data, 3, 0) == 3  # 0: look once
    assert time.perf_counter() - start < 1.0


def test_close_ends_the_helpers(kernels: Kernels) -> None:
    group = tasks.TaskGroup(kernels, 3)
    group.park(True)  # napping helpers must see QUIT too
    threads = group.threads
    assert all(t.is_alive() for t in threads)
    group.close()
    assert not any(t.is_alive() for t in threads)
    group.close()  # idempotent

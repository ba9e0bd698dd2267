"""A compiled task-list executor: one ctypes call runs a whole table of qmm calls over helper threads.

During GPU decode the CPU computes a few expert matrices per MoE layer (~1.8 MB each, ~100 us),
split by rows over ~15 threads, about 100 rounds per token; so a round must cost ~1-2 us of
hand-off and no Python per task. spin.py posts one task per helper with Python writes per helper;
here the caller hands a table of N tasks in one call (`task_run`, GIL released), every helper and
the caller claim tasks one at a time (dynamic load balance), and the call returns when all are done.

A task is one int64 row [TASK_COLS] = fn, w, row_bytes, x, ldx, n_tok, y, ldy, r0, r1: running it
calls the function at address fn with matmul_ir.QMM_ARGS, as Kernels.fn(qtype) compiles it.

The claim protocol (the control block has one writer, the caller; see the slot names):
- NEXT packs (round << 40) | (n << 20) | index. Before a round the caller, whose previous round is
  finished (it waited for it), stores TASKS, stores FINISHED = 0, then stores NEXT = (round << 40)
  | (n << 20) (release). Rounds wrap at 2**23; NEXT is never reset to 0.
- Claim: v = NEXT (acquire); stop if round(v) is not mine or index(v) >= n(v); else
  cmpxchg(NEXT, v, v + 1) (acq_rel), retrying on failure. After a successful claim load TASKS
  (it is this round's: the caller cannot start another round while a claimed task is unfinished),
  run tasks[index(v)], then FINISHED += 1 (release).
- The caller claims like a helper, then spins until FINISHED == n (acquire). A helper that wakes
  late finds index >= n and goes back to waiting.

Idle helpers pause-spin for a few ms, then nap (usleep) ever longer, as spin.py's do; `park` sends
them straight to short naps while other work wants the CPUs. Parked helpers still claim tasks when
they wake, so a round always completes, on the caller alone if need be.

`wait_change` waits without the GIL for a word in pinned memory that a GPU writes.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from strata.jit.host import Host
from strata.jit.irutil import I32, I64, P8, PF32, VOID, c64, intrinsic
from strata.jit.matmul_ir import QMM_ARGS
from strata.jit.spin import PARK, QUIT, RUN, SPINS, idle_blocks  # the helpers idle as spin.py's do

if TYPE_CHECKING:
    from strata.jit.kernels import Kernels

# A task row's columns (int64 each)
FN, W, ROW_BYTES, X, LDX, N_TOK, Y, LDY, R0, R1 = range(10)
TASK_COLS = 10
COLUMNS = ("fn", "w", "row_bytes", "x", "ldx", "n_tok", "y", "ldy", "r0", "r1")

# Control block, int64 slots: the hot NEXT and FINISHED on cache lines of their own (8 slots = 64 bytes),
# the rarely written TASKS, MODE, SLEEP (usleep's address) on a third
NEXT, FINISHED, TASKS, MODE, SLEEP = 0, 8, 16, 17, 18
SLOTS = 24
ROUND_SHIFT, N_SHIFT = 40, 20
MAX_TASKS = 1 << 20  # n and index are 20-bit fields of NEXT
ROUNDS = 1 << 23  # rounds wrap here (bit 63 stays clear)

WAIT_NAP_US = 20  # wait_change's nap once its spins are spent

LAYOUT = "claim2"  # part of the disk-cache key: bump when the slots or the loops change

_WORKER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_RUN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_WAIT = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
NAMES = ("task_worker", "task_run", "wait_change")

_PI64 = I64.as_pointer()
_I64 = np.dtype(np.int64)


def unpack(next_word: int) -> tuple[int, int, int]:
    """(round, n, index) of a NEXT value."""
    return next_word >> ROUND_SHIFT, (next_word >> N_SHIFT) & (MAX_TASKS - 1), next_word & (MAX_TASKS - 1)


def build(host: Host) -> ir.Module:
    """void task_worker(i64* ctl): a helper's loop until MODE is QUIT.
    void task_run(i64* ctl, i64* tasks, i64 n): the caller's round of n tasks.
    i64 wait_change(i64* addr, i64 old, i64 timeout_us, i64 usleep): *addr once it differs from old."""
    mod = ir.Module(name="tasks")
    mod.triple = host.triple

    def pause(b: ir.IRBuilder) -> None:
        if host.x86:
            intrinsic(b, "llvm.x86.sse2.pause", VOID, [])

    claim = _claim_all(mod)
    _worker(mod, claim, pause)
    _run(mod, claim, pause)
    _wait_change(mod, pause)
    return mod


def _field(b: ir.IRBuilder, v: ir.Value, shift: int) -> ir.Value:
    return b.and_(b.lshr(v, c64(shift)), c64(MAX_TASKS - 1)) if shift else b.and_(v, c64(MAX_TASKS - 1))


def _claim_all(mod: ir.Module) -> ir.Function:
    """void claim_all(i64* ctl, i64 round): claim and run tasks of `round` until none are left."""
    fn = ir.Function(mod, ir.FunctionType(VOID, (_PI64, I64)), "claim_all")
    fn.linkage = "internal"
    ctl, rnd = fn.args
    blk = {n: fn.append_basic_block(n) for n in ("entry", "head", "try", "run", "exit")}
    b = ir.IRBuilder(blk["entry"])
    next_ = b.gep(ctl, [c64(NEXT)])
    v0 = b.load_atomic(next_, "acquire", 8)
    b.branch(blk["head"])

    b.position_at_end(blk["head"])
    v = b.phi(I64)
    v.add_incoming(v0, blk["entry"])
    index = _field(b, v, 0)
    open_ = b.and_(
        b.icmp_unsigned("==", b.lshr(v, c64(ROUND_SHIFT)), rnd),
        b.icmp_unsigned("<", index, _field(b, v, N_SHIFT)),
    )
    b.cbranch(open_, blk["try"], blk["exit"])

    b.position_at_end(blk["try"])
    swap = b.cmpxchg(next_, v, b.add(v, c64(1)), "acq_rel", "acquire")
    v.add_incoming(b.extract_value(swap, 0), blk["try"])  # lost the race: look again at what won
    b.cbranch(b.extract_value(swap, 1), blk["run"], blk["head"])

    b.position_at_end(blk["run"])  # task `index` is ours: only now is TASKS surely this round's
    tasks = b.inttoptr(b.load(b.gep(ctl, [c64(TASKS)])), _PI64)
    row = b.gep(tasks, [b.mul(index, c64(TASK_COLS))])
    col = [b.load(b.gep(row, [c64(i)])) for i in range(TASK_COLS)]
    qmm = b.inttoptr(col[FN], ir.FunctionType(VOID, QMM_ARGS).as_pointer())
    ptrs = {W: P8, X: PF32, Y: PF32}
    b.call(qmm, [b.inttoptr(col[i], ptrs[i]) if i in ptrs else col[i] for i in range(W, R1 + 1)])
    b.atomic_rmw("add", b.gep(ctl, [c64(FINISHED)]), c64(1), "release")
    v.add_incoming(b.load_atomic(next_, "acquire", 8), blk["run"])
    b.branch(blk["head"])

    b.position_at_end(blk["exit"])
    b.ret_void()
    return fn


def _worker(mod: ir.Module, claim: ir.Function, pause: Callable[[ir.IRBuilder], None]) -> None:
    fn = ir.Function(mod, ir.FunctionType(VOID, (_PI64,)), "task_worker")
    (ctl,) = fn.args
    names = ("entry", "loop", "serve", "check", "idle", "pause", "nap", "quit")
    blk = {n: fn.append_basic_block(n) for n in names}
    b = ir.IRBuilder(blk["entry"])
    last, idle = b.alloca(I64), b.alloca(I64)

    def slot(i: int) -> ir.Value:
        return b.gep(ctl, [c64(i)])

    # round 0 is the control block's before any `run` (rounds count from 1): a helper that starts after
    # the caller posted its first round still serves it. Taking the round NEXT held at its start, a helper
    # the OS started late skipped that round, and the caller ran all its tasks alone (in CI, a test whose
    # two tasks must run at once waited out its 30 s)
    b.store(c64(0), last)
    b.store(c64(0), idle)
    b.branch(blk["loop"])

    b.position_at_end(blk["loop"])
    rnd = b.lshr(b.load_atomic(slot(NEXT), "acquire", 8), c64(ROUND_SHIFT))
    b.cbranch(b.icmp_unsigned("!=", rnd, b.load(last)), blk["serve"], blk["check"])

    b.position_at_end(blk["serve"])  # a new round: help until its tasks are all claimed
    b.store(rnd, last)
    b.store(c64(0), idle)
    b.call(claim, [ctl, rnd])
    b.branch(blk["loop"])

    idle_blocks(b, blk, slot, MODE, SLEEP, idle, pause)


def _run(mod: ir.Module, claim: ir.Function, pause: Callable[[ir.IRBuilder], None]) -> None:
    fn = ir.Function(mod, ir.FunctionType(VOID, (_PI64, _PI64, I64)), "task_run")
    ctl, tasks, n = fn.args
    blk = {name: fn.append_basic_block(name) for name in ("entry", "post", "wait", "spin", "done")}
    b = ir.IRBuilder(blk["entry"])
    b.cbranch(b.icmp_signed("<=", n, c64(0)), blk["done"], blk["post"])

    b.position_at_end(blk["post"])  # the previous round is finished: we waited for it
    next_, finished = b.gep(ctl, [c64(NEXT)]), b.gep(ctl, [c64(FINISHED)])
    prev = b.lshr(b.load_atomic(next_, "monotonic", 8), c64(ROUND_SHIFT))
    rnd = b.and_(b.add(prev, c64(1)), c64(ROUNDS - 1))
    b.store(b.ptrtoint(tasks, I64), b.gep(ctl, [c64(TASKS)]))
    b.store_atomic(c64(0), finished, "monotonic", 8)
    b.store_atomic(b.or_(b.shl(rnd, c64(ROUND_SHIFT)), b.shl(n, c64(N_SHIFT))), next_, "release", 8)
    b.call(claim, [ctl, rnd])
    b.branch(blk["wait"])

    b.position_at_end(blk["wait"])  # helpers may still be running the last tasks they claimed
    done = b.icmp_unsigned("==", b.load_atomic(finished, "acquire", 8), n)
    b.cbranch(done, blk["done"], blk["spin"])

    b.position_at_end(blk["spin"])
    pause(b)
    b.branch(blk["wait"])

    b.position_at_end(blk["done"])
    b.ret_void()


def _wait_change(mod: ir.Module, pause: Callable[[ir.IRBuilder], None]) -> None:
    """Spins SPINS pause loops (none when timeout_us == 0), then naps WAIT_NAP_US at a time; time is
    counted in naps, so a timeout is a lower bound (each usleep oversleeps by the timer slack)."""
    fn = ir.Function(mod, ir.FunctionType(I64, (_PI64, I64, I64, I64)), "wait_change")
    addr, old, timeout_us, sleep_fn = fn.args
    names = ("entry", "loop", "changed", "idle", "pause", "nap", "sleep", "timeout")
    blk = {n: fn.append_basic_block(n) for n in names}
    b = ir.IRBuilder(blk["entry"])
    spins = b.select(b.icmp_signed("==", timeout_us, c64(0)), c64(0), c64(SPINS))
    usleep = b.inttoptr(sleep_fn, ir.FunctionType(I32, (I32,)).as_pointer())
    b.branch(blk["loop"])

    b.position_at_end(blk["loop"])
    i = b.phi(I64)  # loops so far: spins, then spins + naps
    i.add_incoming(c64(0), blk["entry"])
    v = b.load_atomic(addr, "acquire", 8)
    b.cbranch(b.icmp_unsigned("!=", v, old), blk["changed"], blk["idle"])

    b.position_at_end(blk["changed"])
    b.ret(v)

    b.position_at_end(blk["idle"])
    b.cbranch(b.icmp_signed("<", i, spins), blk["pause"], blk["nap"])

    b.position_at_end(blk["pause"])
    pause(b)
    i.add_incoming(b.add(i, c64(1)), blk["pause"])
    b.branch(blk["loop"])

    b.position_at_end(blk["nap"])
    slept = b.mul(b.sub(i, spins), c64(WAIT_NAP_US))
    over = b.and_(b.icmp_signed(">=", timeout_us, c64(0)), b.icmp_signed(">=", slept, timeout_us))
    b.cbranch(over, blk["timeout"], blk["sleep"])

    b.position_at_end(blk["sleep"])
    b.call(usleep, [ir.Constant(I32, WAIT_NAP_US)])
    i.add_incoming(b.add(i, c64(1)), blk["sleep"])
    b.branch(blk["loop"])

    b.position_at_end(blk["timeout"])
    b.ret(old)


def _usleep_address() -> int:
    return ctypes.cast(ctypes.CDLL(None).usleep, ctypes.c_void_p).value or 0


def _control_block() -> np.ndarray:
    """int64 [SLOTS] starting on a 64-byte boundary, so the hot slots own their cache lines."""
    buf = np.zeros(SLOTS + 8, np.int64)
    skip = (-buf.ctypes.data % 64) // 8
    return buf[skip : skip + SLOTS]


def _stop(ctl: np.ndarray, threads: list[threading.Thread], kernels: Kernels) -> None:
    """End the helpers; `kernels` rides along so the compiled loop they run outlives them."""
    ctl[MODE] = QUIT
    for t in threads:
        t.join()


class TaskGroup:
    """`helpers` threads inside task_worker; `run` executes a table of tasks over them and the caller.

    ctl is the control block (slot names above); `close` (idempotent, also run at collection)
    ends the helpers, after which `run` still works on the caller alone."""

    def __init__(self, kernels: Kernels, helpers: int, pin: Callable[[], None] | None = None) -> None:
        worker_address, run_address, _ = kernels.tasks()
        self.ctl = _control_block()
        self.ctl[SLEEP] = _usleep_address()
        self.address = int(self.ctl.ctypes.data)
        self.lock = threading.Lock()  # the control block has one writer
        self._run = _RUN(run_address)
        self._table: np.ndarray | None = None  # the last table run, its shape and address
        self._shape: tuple[int, ...] = ()
        self._table_address = 0
        worker = _WORKER(worker_address)

        def serve(ctl: np.ndarray) -> None:  # holds no reference to self, so the group can be collected
            if pin is not None:
                pin()
            worker(ctl.ctypes.data)  # ctypes drops the GIL for the whole loop

        self.threads = [
            threading.Thread(target=serve, args=(self.ctl,), daemon=True, name=f"strata-tasks-{i}")
            for i in range(helpers)
        ]
        for t in self.threads:
            t.start()
        self.close = weakref.finalize(self, _stop, self.ctl, self.threads, kernels)

    def park(self, parked: bool) -> None:
        """Parked helpers nap instead of spinning (they still claim tasks when they wake)."""
        self.ctl[MODE] = PARK if parked else RUN

    def run(self, tasks: np.ndarray, n: int | None = None) -> None:
        """Run rows [0, n) of tasks (int64 [rows, TASK_COLS], C-contiguous; n defaults to all rows)
        and return when all are done. Nothing checks the addresses in the rows: they must point at
        live kernels and arrays.

        Reading an array's address costs ~2 us, more than a round's hand-off, so the last table's is
        kept: refill one preallocated table and pass n rather than a new slice each round."""
        # One caller at a time, so the kept address is this table's; `tasks` stays referenced to the end
        with self.lock:
            if tasks is not self._table or tasks.shape != self._shape or tasks.dtype is not _I64:
                self._table_address = _address(tasks)  # raises ValueError on a bad table
                self._table, self._shape = tasks, tasks.shape
            rows = self._shape[0] if n is None else n
            if not 0 <= rows <= self._shape[0]:
                raise ValueError(f"n must be in [0, {self._shape[0]}] (the table's rows), not {rows}")
            if rows >= MAX_TASKS:
                raise ValueError(f"at most {MAX_TASKS - 1} tasks a round, not {rows}")
            self._run(self.address, self._table_address, rows)


def _address(tasks: np.ndarray) -> int:
    if (
        not isinstance(tasks, np.ndarray)
        or tasks.dtype != _I64
        or tasks.ndim != 2
        or tasks.shape[1] != TASK_COLS
        or not tasks.flags.c_contiguous
    ):
        what = f"{tasks.dtype} {tasks.shape}" if isinstance(tasks, np.ndarray) else type(tasks).__name__
        raise ValueError(f"tasks must be a C-contiguous int64 [n, {TASK_COLS}] array, not {what}")
    return int(tasks.ctypes.data)


class Waiter:
    """The compiled wait_change, with libc's usleep: `waiter(address, old, timeout_us)`."""

    def __init__(self, kernels: Kernels) -> None:
        self._wait = _WAIT(kernels.tasks()[2])
        self._usleep = _usleep_address()

    def __call__(self, address: int, old: int, timeout_us: int) -> int:
        """The int64 at address once it differs from old (acquire), or old after timeout_us of naps
        (a lower bound on the time waited; < 0 waits forever). The GIL is released meanwhile."""
        return int(self._wait(address, old, timeout_us, self._usleep))


def wait_change(kernels: Kernels, address: int, old: int, timeout_us: int) -> int:
    """One-off Waiter(kernels)(address, old, timeout_us); keep a Waiter where this is called often."""
    return Waiter(kernels)(address, old, timeout_us)

"""Spinning helper threads for splitting one dense matmul by rows, with a hand-off of ~1 us.

A decode step runs ~200 matmuls of 20-150 us each; a ThreadPoolExecutor hand-off (~50-100 us of
condition variables and GIL round trips) costs more than the half it would save. Here each helper
thread sits inside a compiled loop (`spin_worker`, no GIL) watching its row of a shared int64
control block; the caller writes a task's arguments and bumps the row's sequence number, runs its
own share, then spins in Python until every helper has echoed the number back in `done`. x86
stores become visible in program order (the pool uses this on x86 only), and the worker reads
with acquire / writes with release.
A task is run by whoever claims it first (compare-and-swap on `claim`): when the machine is busy
and a helper is not running, the caller takes the helper's share itself instead of waiting.

Idle helpers pause-spin for a few ms, then nap (usleep) ever longer, so a quiet engine costs
almost nothing; `park` sends them straight to napping while other pool work (MoE experts on the
executor) wants the CPUs.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from strata.jit.host import Host
from strata.jit.irutil import I32, I64, P8, PF32, VOID, c64
from strata.jit.matmul_ir import QMM_ARGS

# Control row, int64 slots; 16 of them (128 bytes) a row keeps helpers' hot slots on separate lines
SEQ, DONE, MODE, SLEEP, FN, RAW, ROW_BYTES, X, COLS, N_TOK, OUT, N_ROWS, R0, R1, CLAIM = range(15)
ROW = 16
RUN, QUIT, PARK = 0, 1, 2  # MODE values
SPINS = 1 << 17  # pause loops (a few ms) before napping
SHORT_NAPS = 200  # then this many naps of SHORT_US before the long ones
SHORT_US, LONG_US = 50, 2000

LAYOUT = "claim1"  # part of the disk-cache key: bump when the slots or the loop change

_WORKER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_CLAIM = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def build(host: Host) -> ir.Module:
    """void spin_worker(i64* ctl): run each task posted to ctl (see the slot names) until QUIT.
    i64 spin_claim(i64* ctl, i64 expected, i64 seq): 1 if this caller claimed task `seq`."""
    mod = ir.Module(name="spin")
    mod.triple = host.triple
    fn = ir.Function(mod, ir.FunctionType(VOID, (I64.as_pointer(),)), "spin_worker")
    (ctl,) = fn.args
    names = ("entry", "loop", "claim", "run", "check", "idle", "pause", "nap", "quit")
    blk = {n: fn.append_basic_block(n) for n in names}
    b = ir.IRBuilder(blk["entry"])
    last, idle = b.alloca(I64), b.alloca(I64)

    def slot(i: int) -> ir.Value:
        return b.gep(ctl, [c64(i)])

    b.store(b.load_atomic(slot(SEQ), "acquire", 8), last)
    b.store(c64(0), idle)
    b.branch(blk["loop"])

    b.position_at_end(blk["loop"])
    seq = b.load_atomic(slot(SEQ), "acquire", 8)
    b.cbranch(b.icmp_unsigned("!=", seq, b.load(last)), blk["claim"], blk["check"])

    b.position_at_end(blk["claim"])  # a new task: run it unless the caller already took it
    b.store(seq, last)
    b.store(c64(0), idle)
    held = b.load_atomic(slot(CLAIM), "acquire", 8)
    swap = b.cmpxchg(slot(CLAIM), held, seq, "acq_rel", "acquire")
    mine = b.and_(b.icmp_unsigned("!=", held, seq), b.extract_value(swap, 1))
    b.cbranch(mine, blk["run"], blk["loop"])

    b.position_at_end(blk["run"])  # call the qmm kernel on rows [R0, R1)
    qmm = b.inttoptr(b.load(slot(FN)), ir.FunctionType(VOID, QMM_ARGS).as_pointer())
    args = [
        b.inttoptr(b.load(slot(RAW)), P8),
        b.load(slot(ROW_BYTES)),
        b.inttoptr(b.load(slot(X)), PF32),
        b.load(slot(COLS)),
        b.load(slot(N_TOK)),
        b.inttoptr(b.load(slot(OUT)), PF32),
        b.load(slot(N_ROWS)),
        b.load(slot(R0)),
        b.load(slot(R1)),
    ]
    b.call(qmm, args)
    b.store_atomic(seq, slot(DONE), "release", 8)
    b.branch(blk["loop"])

    def pause(b: ir.IRBuilder) -> None:
        if host.x86:
            b.call(ir.Function(mod, ir.FunctionType(VOID, ()), "llvm.x86.sse2.pause"), [])

    idle_blocks(b, blk, slot, MODE, SLEEP, idle, pause)

    claim = ir.Function(mod, ir.FunctionType(I64, (I64.as_pointer(), I64, I64)), "spin_claim")
    row, expected, seq = claim.args
    b = ir.IRBuilder(claim.append_basic_block("entry"))
    swap = b.cmpxchg(b.gep(row, [c64(CLAIM)]), expected, seq, "acq_rel", "acquire")
    b.ret(b.zext(b.extract_value(swap, 1), I64))
    return mod


def idle_blocks(
    b: ir.IRBuilder,
    blk: dict[str, ir.Block],
    slot: Callable[[int], ir.Value],
    mode_at: int,
    sleep_at: int,
    idle: ir.Value,
    pause: Callable[[ir.IRBuilder], None],
) -> None:
    """A helper loop's idle path, from blk["check"] (entered when no new work was seen) to blk["loop"]:
    pause-spin SPINS times, then nap, short and then long (parked: short naps at once); blk["quit"] returns
    when MODE is QUIT. `idle` counts the checks since the last work; slot(sleep_at) holds usleep's address."""
    b.position_at_end(blk["check"])
    mode = b.load_atomic(slot(mode_at), "monotonic", 8)
    n = b.add(b.load(idle), c64(1))
    b.store(n, idle)
    quit_now = b.icmp_unsigned("==", mode, c64(QUIT))
    spin = b.and_(b.icmp_unsigned("<", n, c64(SPINS)), b.icmp_unsigned("==", mode, c64(RUN)))
    b.cbranch(quit_now, blk["quit"], blk["idle"])

    b.position_at_end(blk["idle"])
    b.cbranch(spin, blk["pause"], blk["nap"])

    b.position_at_end(blk["pause"])
    pause(b)
    b.branch(blk["loop"])

    b.position_at_end(blk["nap"])  # parked: short naps, and spin again as soon as unparked
    parked = b.icmp_unsigned("==", mode, c64(PARK))
    b.store(b.select(parked, c64(SPINS), b.load(idle)), idle)
    short = b.or_(parked, b.icmp_unsigned("<", n, c64(SPINS + SHORT_NAPS)))
    us = b.select(short, ir.Constant(I32, SHORT_US), ir.Constant(I32, LONG_US))
    usleep = b.inttoptr(b.load(slot(sleep_at)), ir.FunctionType(I32, (I32,)).as_pointer())
    b.call(usleep, [us])
    b.branch(blk["loop"])

    b.position_at_end(blk["quit"])
    b.ret_void()


def _stop(ctl: np.ndarray, threads: list[threading.Thread]) -> None:
    ctl[:, MODE] = QUIT
    for t in threads:
        t.join()


class SpinGroup:
    """`helpers` spinning threads; `matmul` splits one kernel call's rows between them and the caller."""

    def __init__(
        self, worker_address: int, claim_address: int, helpers: int, pin: Callable[[], None]
    ) -> None:
        self.ctl = np.zeros((helpers, ROW), np.int64)
        self.ctl[:, SLEEP] = ctypes.cast(ctypes.CDLL(None).usleep, ctypes.c_void_p).value or 0
        self.seq = 0
        self.lock = threading.Lock()  # one split at a time; a second caller runs unsplit
        self.row_addresses = [int(self.ctl[i].ctypes.data) for i in range(helpers)]
        self.posted = [0] * helpers  # per row: the last task posted (so the claimed one when we post)
        self.in_flight: tuple[np.ndarray, ...] = ()
        self.claim = _CLAIM(claim_address)
        worker = _WORKER(worker_address)

        def run(row: np.ndarray) -> None:  # holds no reference to self, so the group can be collected
            pin()
            worker(row.ctypes.data)  # ctypes drops the GIL for the whole loop

        self.threads = [
            threading.Thread(target=run, args=(self.ctl[i],), daemon=True, name=f"strata-spin-{i}")
            for i in range(helpers)
        ]
        for t in self.threads:
            t.start()
        self.close = weakref.finalize(self, _stop, self.ctl, self.threads)

    def park(self, parked: bool) -> None:
        self.ctl[:, MODE] = PARK if parked else RUN

    def matmul(
        self,
        fn: Callable[..., None],
        address: int,
        raw: np.ndarray,
        x: np.ndarray,
        out: np.ndarray,
        bounds: list[tuple[int, int]],
    ) -> None:
        """out[:, r0:r1] = x . raw[r0:r1]^T for each (r0, r1) in bounds: the first here, the rest
        on helpers (at most one bound per helper). fn is the qmm kernel, address the same as an int."""
        n_rows, row_bytes = raw.shape
        pr, px, po = raw.ctypes.data, x.ctypes.data, out.ctypes.data  # each .ctypes builds an object
        common = (address, pr, row_bytes, px, x.shape[1], x.shape[0], po, n_rows)
        self.seq += 1
        seq, posted, prevs = self.seq, bounds[1:], self.posted[:]
        self.in_flight = (raw, x, out)  # alive until the next call, even if this one is interrupted
        for i, (r0, r1) in enumerate(posted):
            self.ctl[i, FN : R1 + 1] = (*common, r0, r1)
            self.ctl[i, SEQ] = self.posted[i] = seq  # after the arguments: the helper acts on this store
        r0, r1 = bounds[0]
        fn(pr, row_bytes, px, x.shape[1], x.shape[0], po, n_rows, r0, r1)
        done = self.ctl[:, DONE]
        for i, (r0, r1) in enumerate(posted):
            prev = prevs[i]
            if done[i] == seq:
                continue
            if self.ctl[i, CLAIM] == seq:  # the helper is on it: no need to try claiming
                while done[i] != seq:
                    pass
                continue
            if self.claim(self.row_addresses[i], prev, seq):  # the helper has not started: do it here
                fn(pr, row_bytes, px, x.shape[1], x.shape[0], po, n_rows, r0, r1)
                continue
            while done[i] != seq:  # the GIL is ours, but the helpers never need it
                pass

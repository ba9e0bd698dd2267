"""The CPU's share of the GPU's decode misses: a thread that serves the decode graph's requests.

For each MoE layer of a decode pass the graph picks the misses the CPU takes, publishes the layer's normed
rows, routed ids (-1 for the pairs the GPU computes) and weights into a mailbox in pinned RAM and raises its
ticket (strata/gpu/kernels/share.py `cpu_publish`), computes its own experts, and then waits for the ticket
to come back (`cpu_collect`). Here one thread waits for the ticket, computes the pairs the mailbox gives
the CPU straight from the expert arena, writes their weighted sum into the mailbox and echoes the ticket:
all of it a compiled loop (share_ir.py) that holds no GIL, so the engine's own Python (the server's event
loop, sampling) never delays an answer the GPU is waiting for.

An expert of a decode row is far too small to split across experts alone (a 24 GB card misses ~5 of 10 experts
a layer, ~1.8 MB each, in ~150 us), so every matrix is split by rows: gate and up of every CPU expert in one
round of row-range tasks, silu(g) * u, then down in a second round, over a TaskGroup of spinning helpers
(tasks.py): two hand-offs a layer. Q4_K, Q5_K, Q6_K, IQ4_XS and Q8_0 products take int8 inputs (qdot_ir.py,
2-3x the float kernels a row): each round's inputs are first quantized into q8 rows. The low-RAM arena's
per-expert addresses, and a stand-in for the arithmetic (`compute`), are answered in Python, with numpy steps
between the rounds.

Legend: n = rows (<= 8), A = experts per row, D = hidden, F = expert width, p = CPU pairs, k = their experts.
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from strata.jit import share_ir
from strata.jit.kernels import SHARE_SERVE, Kernels
from strata.jit.qdot_ir import Q8_BLOCK, Q8_BYTES
from strata.jit.tasks import TASK_COLS, TaskGroup, Waiter

# mailbox control words (int64), as strata.gpu.kernels.tiers names them
MB_REQ, MB_LAYER, MB_ROWS, MB_DONE = 0, 1, 2, 8
MB_WORDS = 16
WAIT_US = 50_000  # a wait returns about this often (its naps overshoot) to see whether to stop
FN, W, ROW_BYTES, X, LDX, N_TOK, Y, LDY, R0, R1 = range(TASK_COLS)


@dataclass(frozen=True, slots=True)
class Mailbox:
    """Views over one block of memory both sides see (pinned and mapped on the GPU; any array in tests)."""

    ctl: np.ndarray  # int64 [MB_WORDS]
    h: np.ndarray  # float32 [rows, D]
    ids: np.ndarray  # int32 [rows * A]: the CPU's pairs' experts, -1 for the GPU's
    wts: np.ndarray  # float32 [rows * A]
    out: np.ndarray  # float32 [rows, D]

    @staticmethod
    def nbytes(rows: int, a: int, d: int) -> int:
        return 8 * MB_WORDS + 4 * (2 * rows * d + 2 * rows * a)

    @classmethod
    def over(cls, buf: np.ndarray, rows: int, a: int, d: int) -> Mailbox:
        """Carve the views out of a uint8 buffer of at least nbytes(rows, a, d) bytes, 64-byte aligned."""
        assert buf.dtype == np.uint8 and buf.nbytes >= cls.nbytes(rows, a, d) and buf.ctypes.data % 64 == 0
        o = 8 * MB_WORDS
        sizes = [(np.float32, rows * d), (np.int32, rows * a), (np.float32, rows * a), (np.float32, rows * d)]
        views = []
        for dt, n in sizes:
            views.append(buf[o : o + 4 * n].view(dt))
            o += 4 * n
        h, ids, wts, out = views
        return cls(buf[: 8 * MB_WORDS].view(np.int64), h.reshape(rows, d), ids, wts, out.reshape(rows, d))


@dataclass(frozen=True, slots=True)
class ExpertBytes:
    """Where the CPU reads experts: part p of expert e of MoE layer l at bases[l, p] + e * strides[l, p],
    plus addrs[l, p, e] when given (the low-RAM mode's arena: a pinned row, or the file's mapping; bases
    and strides 0 then)."""

    bases: np.ndarray  # int64 [L, P]
    strides: np.ndarray  # int64 [L, P]
    qtypes: np.ndarray  # int64 [L, P]
    rows: np.ndarray  # int64 [L, P]: F, F, D
    row_bytes: np.ndarray  # int64 [L, P]
    addrs: np.ndarray | None = None  # int64 [L, P, E]


class CpuShare:
    """Serves the mailbox from a thread: the pairs whose id it gives, of experts of n_expert per layer."""

    def __init__(
        self,
        kernels: Kernels,
        experts: ExpertBytes,
        n_expert: int,
        box: Mailbox,
        threads: int,
        pin: Any = None,
    ) -> None:
        self.kernels = kernels
        self.experts = experts
        self.n_expert = n_expert
        self.box = box
        self.threads = max(1, threads)
        rows, d = box.h.shape
        a = box.ids.size // rows
        f = int(experts.rows[:, 0].max())
        # each part's kernel [L, P]: the int8-input product where its type has one and its inputs come in
        # whole q8 blocks (qdot_ir.py: 2.4-3x the float kernel a token), else the float one
        widths = (d, d, f)
        dots = [
            [kernels.dot_fn(int(q)) if widths[p] % Q8_BLOCK == 0 else None for p, q in enumerate(row)]
            for row in experts.qtypes
        ]
        self.int8 = np.array([[fn is not None for fn in row] for row in dots], bool)
        self.fns = np.array(
            [
                [ctypes.cast(dot or kernels.fn(int(q)), ctypes.c_void_p).value for q, dot in zip(qs, row)]
                for qs, row in zip(experts.qtypes, dots)
            ],
            np.int64,
        )
        self._wait = Waiter(kernels)
        self._x = np.zeros((rows * a, d), np.float32)  # [p, D] the pairs' rows, grouped by expert
        self._g = np.zeros((rows * a, 2 * f), np.float32)  # [p, 2F] gate | up, then silu(gate) * up in gate
        self._y = np.zeros((rows * a, d), np.float32)  # [p, D]
        self._xq = np.zeros((rows * a, d // Q8_BLOCK * Q8_BYTES), np.uint8)  # their q8 rows
        self._gq = np.zeros((rows * a, f // Q8_BLOCK * Q8_BYTES), np.uint8)
        self._steps = np.arange(rows * a)  # a single row's pairs: each its own expert, at its own pair
        self._ones = np.ones(rows * a, np.int64)
        self._zeros = np.zeros(rows * a, np.int64)
        self.calls = np.zeros(rows, np.int64)  # per mailbox row: CPU expert calls since take_calls
        self.mapped: np.ndarray | None = None  # [L, E] bool: experts read from the file's mapping
        self.mapped_counts = np.zeros((rows, 2), np.int64)  # per row: calls on those, their bytes
        self._expert_bytes = (experts.rows * experts.row_bytes).sum(axis=1)  # [L]
        self._templates = [
            (
                self._template(li, (0, 1), self._x, self._xq, self._g),
                self._template(li, (2,), self._g, self._gq, self._y),
            )
            for li in range(len(experts.bases))
        ]
        # a request runs compiled (share_ir.py): its rows, ids and weights copied in here
        self._hn, self._outn = np.zeros((rows, d), np.float32), np.zeros((rows, d), np.float32)
        self._idsn, self._wn = np.zeros(rows * a, np.int32), np.zeros(rows * a, np.float32)
        # one task table, refilled in place for each round (TaskGroup.run reads a new array's address, ~2 us),
        # and the per-expert coefficients (1, expert, pair offset, rows) the templates are multiplied by
        most = max(t.shape[1] * t.shape[2] for pair in self._templates for t in pair)
        self._table = np.zeros((rows * a * most, TASK_COLS), np.int64)  # the rounds run one after the other
        self._coef = np.ones((rows * a, 4), np.int64)
        self.error: BaseException | None = None
        self._py_requests = 0  # answered in Python (a stand-in, the low-RAM arena) and their time
        self._py_busy_s = 0.0
        self._group = TaskGroup(kernels, self.threads - 1, pin)
        self._request, serve_address, self._silu = kernels.share()
        self._calls_n = np.zeros(rows, np.int64)
        # each layer's arguments before the row count and after it: for `layer` (its inputs copied into
        # _hn, _idsn, _wn) and, as a table, for the compiled server answering from and into the mailbox
        own = (self._idsn, self._wn, self._hn, self._outn, self._calls_n)
        self._request_args = [self._args(kernels, li, *own) for li in range(len(experts.bases))]
        mailbox = (box.ids, box.wts, box.h, box.out, self.calls)
        self._serve_args = np.array(
            [(*x, 0, *y) for x, y in (self._args(kernels, li, *mailbox) for li in range(len(experts.bases)))],
            np.int64,
        )
        self._stats = np.zeros(share_ir.STATS, np.int64)  # the compiled server's counters
        libc = ctypes.CDLL(None)
        self._serve_loop = SHARE_SERVE(serve_address)
        self._serve_fixed = (
            int(box.ctl.ctypes.data),
            kernels.tasks()[2],
            ctypes.cast(libc.usleep, ctypes.c_void_p).value,
            int(self._serve_args.ctypes.data),
            ctypes.cast(self._request, ctypes.c_void_p).value,
            int(self._stats.ctypes.data),
            ctypes.cast(libc.clock_gettime, ctypes.c_void_p).value,
        )
        self._compute: Any = None
        self._stop = False
        self._last = int(box.ctl[MB_REQ])
        self._req = int(box.ctl.ctypes.data) + 8 * MB_REQ
        # the thread holds the server only while it serves a request, so a dropped model stops it
        self._thread = threading.Thread(
            target=_serve, args=(weakref.ref(self), pin, kernels), daemon=True, name="strata-cpu-share"
        )
        self._thread.start()

    def _args(
        self,
        kernels: Kernels,
        li: int,
        ids: np.ndarray,
        wts: np.ndarray,
        h: np.ndarray,
        out: np.ndarray,
        calls: np.ndarray,
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """share_request's arguments for layer li before the row count, and after it."""
        gu, dn = self._templates[li]
        q_gu, q_dn = self.int8[li, :2].any(), self.int8[li, 2]
        return (
            (
                self._group.address,
                kernels.tasks()[1],
                int(self._table.ctypes.data),
                int(gu.ctypes.data),
                gu[0].size,
                int(dn.ctypes.data),
                dn[0].size,
                int(ids.ctypes.data),
                int(wts.ctypes.data),
            ),
            (
                ids.size // h.shape[0],
                int(h.ctypes.data),
                int(self._x.ctypes.data),
                int(self._g.ctypes.data),
                int(self.experts.rows[li, 0]),
                self._g.shape[1],
                int(self._y.ctypes.data),
                h.shape[1],
                int(out.ctypes.data),
                int(calls.ctypes.data),
                int(self._xq.ctypes.data),
                self._xq.shape[1] if q_gu else 0,
                int(self._gq.ctypes.data),
                self._gq.shape[1] if q_dn else 0,
            ),
        )

    @property
    def products(self) -> str:
        """What the share's products take, by quant type, for the start-up line: "int8 inputs (Q4_K, Q6_K)"
        (qdot_ir.py), "float inputs (Q8_0)", or both."""
        qts = np.asarray(self.experts.qtypes)
        parts = []
        for label, mask in (("int8", self.int8), ("float", ~self.int8)):
            names = sorted({T(int(q)).name for q in qts[mask]})
            if names:
                parts.append(f"{label} inputs ({', '.join(names)})")
        return ", ".join(parts)

    @property
    def requests(self) -> int:
        """Requests answered since start (for the benches)."""
        return self._py_requests + int(self._stats[share_ir.STAT_REQUESTS])

    @property
    def busy_s(self) -> float:
        """Time spent answering them, s."""
        return self._py_busy_s + int(self._stats[share_ir.STAT_NS]) / 1e9

    @property
    def compute(self) -> Any:
        """A stand-in for a request's arithmetic, (li, h, ids, wts) -> (y, calls per row), as `layer`: tests
        give it the GPU's own int8 arithmetic, so the share's plumbing can be checked exactly. While one is
        set the compiled server leaves every request to Python."""
        return self._compute

    @compute.setter
    def compute(self, fn: Any) -> None:
        self._compute = fn
        self._stats[share_ir.STAT_YIELD] = fn is not None

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self._group.close()

    def take_calls(self, n: int) -> np.ndarray:
        """CPU expert calls per row [n] since the last take (call after the pass has synced)."""
        out = self.calls[:n].copy()
        self.calls[:n] = 0
        return out

    def take_mapped(self, n: int) -> np.ndarray:
        """Per row [n, 2]: calls on experts read from the file's mapping and their bytes, since the last
        take."""
        out = self.mapped_counts[:n].copy()
        self.mapped_counts[:n] = 0
        return out

    def check(self) -> None:
        """Raise the error a request met (the pass that saw it is wrong), once."""
        if self.error is not None:
            err, self.error = self.error, None
            raise RuntimeError(f"the CPU share of the expert misses failed: {err!r}") from err

    # ---- the server ----
    def serve_once(self) -> None:
        """Serve requests until one waits WAIT_US for the next: compiled (share_ir.py), no GIL, unless the
        request is Python's (a stand-in, or the low-RAM arena's per-expert addresses)."""
        if self.experts.addrs is None:
            mb, wait, usleep, args, request, stats, clock = self._serve_fixed
            t = self._serve_loop(mb, self._last, WAIT_US, wait, usleep, args, request, stats, clock)
        else:
            t = self._wait(self._req, self._last, WAIT_US)
        if t != self._last:
            self._last = t
            if int(self.box.ctl[MB_DONE]) != t:
                self._answer(t)

    def _answer(self, t: int) -> None:
        t0 = time.perf_counter()
        ctl, box = self.box.ctl, self.box
        n, li = int(ctl[MB_ROWS]), int(ctl[MB_LAYER])
        try:
            a = box.ids.size // box.h.shape[0]
            ids = box.ids[: n * a].reshape(n, a)
            y, calls = (self.compute or self.layer)(li, box.h[:n], ids, box.wts[: n * a].reshape(n, a))
            box.out[:n] = y
            self.calls[:n] += calls
        except Exception as err:
            self.error = err
            box.out[:n] = 0.0
        ctl[MB_DONE] = t  # after the answer: x86 keeps stores in order (the share is enabled on x86 only)
        self._py_requests += 1
        self._py_busy_s += time.perf_counter() - t0

    def layer(
        self, li: int, h: np.ndarray, ids: np.ndarray, wts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """sum over the CPU's pairs (t, a) (ids[t, a] >= 0) of wts[t, a] * expert_{ids[t, a]}(h[t])
        -> y [n, D], calls per row [n]."""
        n = h.shape[0]
        if self.experts.addrs is None:  # one place per layer and part: compiled (share_ir.py)
            self._hn[:n] = h
            self._idsn[: ids.size] = ids.reshape(-1)
            self._wn[: wts.size] = wts.reshape(-1)
            self._calls_n[:n] = 0
            before, after = self._request_args[li]
            self._request(*before, n, *after)
            return self._outn[:n], self._calls_n[:n].copy()
        if n == 1:  # a decode row of the low-RAM arena: its experts in routing order, no 2-D search
            mine1 = ids[0] >= 0  # [A]
            es, w = ids[0][mine1], wts[0][mine1]
            if not len(es):
                return np.zeros(h.shape, np.float32), np.zeros(1, np.int64)
            t_of = self._zeros[: len(es)]
        else:
            mine = ids >= 0  # [n, A]
            if not mine.any():
                return np.zeros(h.shape, np.float32), np.zeros(n, np.int64)
            t_of, a_of = np.nonzero(mine)
            es, w = ids[t_of, a_of], wts[t_of, a_of]
        if self.mapped is not None:
            mm = t_of[self.mapped[li][es]]
            np.add.at(self.mapped_counts, (mm, 0), 1)
            np.add.at(self.mapped_counts, (mm, 1), int(self._expert_bytes[li]))
        if n > 1:  # several rows may share an expert: group its rows so its weights are read once
            order = np.argsort(es, kind="stable")
            t_of, es, w = t_of[order], es[order], w[order]
        y = self.pairs(li, h, t_of, es)
        if n == 1:
            return (y * w[:, None]).sum(axis=0, keepdims=True), np.array([len(es)], np.int64)
        out = np.zeros(h.shape, np.float32)
        np.add.at(out, t_of, y * w[:, None])
        return out, np.bincount(t_of, minlength=n).astype(np.int64)

    def pairs(self, li: int, h: np.ndarray, t_of: np.ndarray, es: np.ndarray) -> np.ndarray:
        """[p, D]: expert_{es[i]}(h[t_of[i]]) for pairs grouped by expert (a view of a scratch buffer)."""
        p = len(es)
        self._x[:p] = h[t_of]
        if self.int8[li, :2].any():
            self.kernels.quantize(self._x[:p], out=self._xq[:p])
        if len(t_of) and t_of[-1] == t_of[0]:  # one row: its experts are distinct
            uniq, starts, counts = es, self._steps[:p], self._ones[:p]
        else:
            uniq, starts, counts = np.unique(es, return_index=True, return_counts=True)
        coef = self._coef[: len(uniq)]  # column 0 stays 1
        coef[:, 1], coef[:, 2], coef[:, 3] = uniq, starts, counts
        gate_up, down = self._templates[li]
        self._group.run(self._table, self._tasks(li, gate_up, (0, 1), uniq, coef))
        f = int(self.experts.rows[li, 0])
        g = self._g[:p, :f]
        self._silu(self._g.ctypes.data, p, f, self._g.shape[1])  # silu(g) * u into g, as the request does
        if self.int8[li, 2]:
            self.kernels.quantize(g, out=self._gq[:p])
        self._group.run(self._table, self._tasks(li, down, (2,), uniq, coef))
        return self._y[:p]

    def _tasks(
        self, li: int, tpl: np.ndarray, parts: tuple[int, ...], uniq: np.ndarray, coef: np.ndarray
    ) -> int:
        """Each expert's row-range tasks, written into the task table; returns the rows in use. The layer's
        template moved to the expert, its pair offset and its count, coef [u, 4] @ tpl [4, M], and to the
        expert's own address (the numpy steps serve only arenas that give one per expert; the others run
        compiled)."""
        assert self.experts.addrs is not None
        u, per = len(uniq), tpl.shape[1] * tpl.shape[2]
        t = self._table[: u * per].reshape(u, -1)  # [u, parts * C * TASK_COLS]
        np.dot(coef, tpl.reshape(4, -1), out=t)
        t.reshape(u, len(parts), -1, TASK_COLS)[..., W] += self.experts.addrs[li][list(parts)][:, uniq].T[
            :, :, None
        ]
        return u * per

    def _template(
        self, li: int, parts: tuple[int, ...], x: np.ndarray, xq: np.ndarray, y: np.ndarray
    ) -> np.ndarray:
        """[4, parts, C, TASK_COLS]: the tasks of expert 0 with one row at pair 0, and what one more expert
        id, pair offset and row add to them, so an expert's tasks are one multiply-add away. A part whose
        product takes int8 inputs reads the pairs' q8 rows xq, the others their floats x."""
        ex = self.experts
        rows = int(ex.rows[li, parts[0]])
        step = max(16, -(-rows * len(parts) // self.threads + 15) // 16 * 16)  # whole 16-row register tiles
        r0 = np.arange(0, rows, step)
        t = np.zeros((4, len(parts), len(r0), TASK_COLS), np.int64)
        for j, part in enumerate(parts):
            t[0, j, :, FN], t[0, j, :, W], t[0, j, :, ROW_BYTES] = (
                self.fns[li, part],
                ex.bases[li, part],
                ex.row_bytes[li, part],
            )
            if self.int8[li, part]:
                t[0, j, :, X], t[0, j, :, LDX], t[2, j, :, X] = xq.ctypes.data, xq.shape[1], xq.shape[1]
            else:
                t[0, j, :, X], t[0, j, :, LDX], t[2, j, :, X] = x.ctypes.data, x.shape[1], 4 * x.shape[1]
            t[0, j, :, Y], t[0, j, :, LDY] = y.ctypes.data + 4 * j * rows, y.shape[1]
            t[0, j, :, R0], t[0, j, :, R1] = r0, np.minimum(r0 + step, rows)
            t[1, j, :, W] = ex.strides[li, part]
            t[2, j, :, Y] = 4 * y.shape[1]
        t[3, ..., N_TOK] = 1
        return t

    # ---- the probe ----
    def probe(self, until: Any = None, min_runs: int = 12) -> tuple[float, float]:
        """(bytes/s, fixed s) of this pool on the experts: one-row requests (`layer`, as decode sends them)
        through 1 and through up to 4 experts, timed on experts nothing has read lately (RAM, not the CPU's
        caches: a layer's misses are cold), for at least min_runs each and until `until()` is true (the GPU's
        probe running beside it, so both rates are the ones they reach together, reading the same RAM)."""
        n_l, n_e = len(self.experts.bases), self.n_expert
        a = self.box.ids.size // self.box.h.shape[0]
        big = min(4, a, n_e)
        h = np.random.default_rng(0).standard_normal((1, self.box.h.shape[1])).astype(np.float32)
        wts = np.ones((1, a), np.float32)
        times: dict[int, list[float]] = {1: [], big: []}
        i = 0
        while i < 2 * min_runs or (until is not None and not until()):
            k = 1 if i % 2 == 0 else big
            li = i % n_l
            ids = np.full((1, a), -1, np.int32)
            ids[0, :k] = (np.arange(k) + 4 * (i // n_l)) % n_e
            t0 = time.perf_counter()
            self.layer(li, h, ids, wts)
            times[k].append(time.perf_counter() - t0)
            i += 1
        t1, tk = (float(np.median(times[k][1:])) for k in (1, big))
        per = float(
            np.mean(
                [
                    sum(int(self.experts.rows[li, p] * self.experts.row_bytes[li, p]) for p in range(3))
                    for li in range(n_l)
                ]
            )
        )
        rate = (big - 1) * per / max(tk - t1, 1e-9) if big > 1 else per / max(t1, 1e-9)
        return rate, max(0.0, t1 - per / rate)


def _serve(ref: weakref.ref[CpuShare], pin: Any, kernels: Kernels) -> None:
    """The server's loop; it holds `kernels` (whose engine holds the compiled wait) until it returns."""
    if pin is not None:
        pin()
    while (srv := ref()) is not None and not srv._stop:
        srv.serve_once()
        del srv

"""Fused dequantize-and-multiply kernels for the host CPU, callable from numpy.

    k = Kernels(cache_dir)                     # one per process; compiles lazily, per quant type
    y = k.matmul(raw, qtype, x)                # x [N, C] f32 . dequantize(raw)^T -> y [N, R] f32
    k.matmul(raw, qtype, x, out=y, rows=(r0, r1))   # only rows [r0, r1): how a pool splits work

`raw` is the quantized tensor exactly as GGUFFile.raw gives it (uint8 [R, row_bytes]); nothing is
dequantized outside the kernel. ctypes releases the GIL for the duration of each call, so pool
threads run kernels in parallel. The numpy twin is jit/reference.py.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T

from strata.jit import expert_ir, qdot_ir, share_ir, spin, tasks
from strata.jit import formats_k as _k  # noqa: F401  (registers the K-quant and IQ4 decoders)
from strata.jit.compiler import Compiler
from strata.jit.formats import FORMAT_F16, FORMATS, Format
from strata.jit.host import Host, detect
from strata.jit.matmul_ir import Tiling, build

QMM = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int64,
)
_P, _I = ctypes.c_void_p, ctypes.c_int64
EXPERT = ctypes.CFUNCTYPE(None, _P, _I, _P, _P, _P, _I, *([_P, _P, _I] * 3), _I, _P, _P)
QUANTIZE = ctypes.CFUNCTYPE(None, _P, _I, _I, _I, _P, _I)
SILU = ctypes.CFUNCTYPE(None, _P, _I, _I, _I)
# its ctypes signatures from the IR's own argument lists: pointers as addresses, the rest as int64
SHARE_REQUEST = ctypes.CFUNCTYPE(_I, *(_P if t.is_pointer else _I for t in share_ir.ARGS))
SHARE_SERVE = ctypes.CFUNCTYPE(_I, *(_P if t.is_pointer else _I for t in share_ir.SERVE_ARGS))


class Kernels:
    def __init__(
        self, cache_dir: Path | None = None, host: Host | None = None, tiling: Tiling | None = None
    ) -> None:
        self.host = host or detect()
        self.tiling = tiling or Tiling.for_host(self.host)
        self.compiler = Compiler(self.host, cache_dir)
        self._formats = dict(FORMATS)
        if self.host.has("f16c"):
            self._formats[T.F16] = FORMAT_F16
        self._fns: dict[T, ctypes._CFuncPtr] = {}
        self._dots: dict[T, ctypes._CFuncPtr] = {}
        self._quantize: ctypes._CFuncPtr | None = None
        self._expert: ctypes._CFuncPtr | None = None
        self._share: tuple[ctypes._CFuncPtr, int, ctypes._CFuncPtr] | None = None
        self._spin: tuple[int, int] | None = None
        self._tasks: tuple[int, int, int] | None = None
        self._lock = threading.Lock()

    def supports(self, qtype: T | int) -> bool:
        return T(qtype) in self._formats

    @property
    def types(self) -> frozenset[T]:
        return frozenset(self._formats)

    def fn(self, qtype: T | int) -> ctypes._CFuncPtr:
        """The compiled `qmm` for a quant type (see matmul_ir), compiling it on first use."""
        qt = T(qtype)
        f = self._fns.get(qt)
        if f is None:
            with self._lock:
                f = self._fns.get(qt)
                if f is None:
                    f = self._fns[qt] = QMM(self._address(self._formats[qt]))
        return f

    def dot_fn(self, qtype: T | int) -> ctypes._CFuncPtr | None:
        """The compiled `qdot` on int8 inputs for a quant type (qdot_ir.py), None where it has none."""
        qt = T(qtype)
        if qt not in qdot_ir.TYPES:
            return None
        with self._lock:
            f = self._dots.get(qt)
            if f is None:
                name = f"qdot_{qt.name.lower()}"
                syms = self.compiler.symbols(
                    name, qdot_ir.LAYOUT, lambda: qdot_ir.build(qt, self.host), (name,)
                )
                f = self._dots[qt] = QMM(syms[name])
            return f

    def quantize_fn(self) -> ctypes._CFuncPtr:
        """The compiled q8_quantize (qdot_ir.py)."""
        with self._lock:
            if self._quantize is None:
                name = qdot_ir.QUANTIZE
                syms = self.compiler.symbols(
                    name, qdot_ir.LAYOUT, lambda: qdot_ir.build_quantize(self.host), (name,)
                )
                self._quantize = QUANTIZE(syms[name])
            return self._quantize

    def quantize(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x [N, C] float32 (C a multiple of 256; rows may lie further apart) -> its q8 rows
        [N, C / 256 * Q8_BYTES] uint8."""
        n, c = x.shape
        if c % qdot_ir.Q8_BLOCK or x.dtype != np.float32 or x.strides[1] != 4 or x.strides[0] % 4:
            raise ValueError(f"x must be float32 rows with a multiple of 256 columns, not {x.shape}")
        if out is None:
            out = np.empty((n, c // qdot_ir.Q8_BLOCK * qdot_ir.Q8_BYTES), np.uint8)
        assert out.dtype == np.uint8 and out.shape == (n, c // qdot_ir.Q8_BLOCK * qdot_ir.Q8_BYTES)
        self.quantize_fn()(x.ctypes.data, c, n, x.strides[0] // 4, out.ctypes.data, out.strides[0])
        return out

    def dot(
        self, raw: np.ndarray, qtype: T | int, xq: np.ndarray, rows: tuple[int, int] | None = None
    ) -> np.ndarray:
        """q8 rows xq [N, .] (`quantize`) times the quantized [R, C] matrix `raw`, transposed: y [N, R]."""
        fn = self.dot_fn(qtype)
        n_rows, row_bytes = raw.shape
        block, size = GGML_QUANT_SIZES[T(qtype)]
        cols = row_bytes // size * block
        if (
            fn is None
            or cols % qdot_ir.Q8_BLOCK
            or xq.shape[1] != cols // qdot_ir.Q8_BLOCK * qdot_ir.Q8_BYTES
        ):
            raise ValueError(f"no int8 product for {T(qtype).name} on q8 rows {xq.shape}")
        out = np.zeros((xq.shape[0], n_rows), np.float32)
        r0, r1 = rows or (0, n_rows)
        fn(
            raw.ctypes.data,
            row_bytes,
            xq.ctypes.data,
            xq.shape[1],
            xq.shape[0],
            out.ctypes.data,
            n_rows,
            r0,
            r1,
        )
        return out

    def expert(self) -> ctypes._CFuncPtr:
        """The fused SwiGLU expert (expert_ir.py), compiled on first use."""
        with self._lock:
            if self._expert is None:
                syms = self.compiler.symbols("expert", "", lambda: expert_ir.build(self.host), ("expert",))
                self._expert = EXPERT(syms["expert"])
            return self._expert

    def share(self) -> tuple[ctypes._CFuncPtr, int, ctypes._CFuncPtr]:
        """The CPU share's request, the address of its server loop and its silu step (share_ir.py), compiled
        on first use."""
        with self._lock:
            if self._share is None:
                host, names = self.host, (share_ir.NAME, share_ir.SERVE, share_ir.SILU)
                syms = self.compiler.symbols("share", share_ir.LAYOUT, lambda: share_ir.build(host), names)
                self._share = (
                    SHARE_REQUEST(syms[share_ir.NAME]),
                    syms[share_ir.SERVE],
                    SILU(syms[share_ir.SILU]),
                )
            return self._share

    def spin(self) -> tuple[int, int]:
        """Addresses of the helper-thread loop and its claim function (spin.py), compiled on first use."""
        with self._lock:
            if self._spin is None:
                names = ("spin_worker", "spin_claim")
                syms = self.compiler.symbols("spin", spin.LAYOUT, lambda: spin.build(self.host), names)
                self._spin = (syms["spin_worker"], syms["spin_claim"])
            return self._spin

    def tasks(self) -> tuple[int, int, int]:
        """Addresses of task_worker, task_run and wait_change (tasks.py), compiled on first use."""
        with self._lock:
            if self._tasks is None:
                host = self.host
                syms = self.compiler.symbols("tasks", tasks.LAYOUT, lambda: tasks.build(host), tasks.NAMES)
                self._tasks = (syms["task_worker"], syms["task_run"], syms["wait_change"])
            return self._tasks

    def _address(self, fmt: Format) -> int:
        name = f"qmm_{fmt.qtype.name.lower()}"
        syms = self.compiler.symbols(
            name, self.tiling.key, lambda: build(fmt, self.host, self.tiling), (name,)
        )
        return syms[name]

    def matmul(
        self,
        raw: np.ndarray,
        qtype: T | int,
        x: np.ndarray,
        out: np.ndarray | None = None,
        rows: tuple[int, int] | None = None,
    ) -> np.ndarray:
        """x [N, C] float32 times the quantized [R, C] matrix `raw`, transposed: y [N, R] float32."""
        block, size = GGML_QUANT_SIZES[T(qtype)]
        n_rows, row_bytes = raw.shape
        if row_bytes % size or x.ndim != 2 or x.shape[1] * size != row_bytes * block:
            raise ValueError(
                f"x {x.shape} does not match a {T(qtype).name} matrix of {row_bytes} bytes per row"
            )
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        if not raw.flags.c_contiguous:
            raise ValueError("raw must be C-contiguous")
        if out is None:
            out = np.empty((x.shape[0], n_rows), np.float32)
        assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == (x.shape[0], n_rows)
        r0, r1 = rows or (0, n_rows)
        self.fn(qtype)(
            raw.ctypes.data, row_bytes, x.ctypes.data, x.shape[1], x.shape[0], out.ctypes.data, n_rows, r0, r1
        )
        return out

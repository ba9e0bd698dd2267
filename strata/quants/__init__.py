"""Vectorized numpy dequantization of ggml tensor types, bit-exact with `gguf.quants.dequantize`.

    dequantize(raw, qtype, n_cols=None)              uint8 [rows, row_bytes] -> float32 [rows, n_cols]
    dequantize_rows(gguf_file, name, start, stop)    only rows [start, stop) of a tensor
    dequantize_expert(gguf_file, name, expert)       one expert of a 3-D [n_expert, rows, cols] tensor
    SUPPORTED                                        the ggml types we can dequantize

Each family lives in its own module as `kernel(blocks, out)` functions (see `_common`); this module
holds the registry and the driver, which walks the blocks in cache-sized chunks (spread over a few
threads) so every kernel's temporaries stay in cache and the only full-size allocation is the output.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T

from strata.errors import UnknownQuantTypeError
from strata.quants import floats, iquants, kquants, legacy, lowbit, mxfp4
from strata.quants._common import Kernel

if TYPE_CHECKING:
    from strata.gguf.reader import GGUFFile

__all__ = ["SUPPORTED", "dequantize", "dequantize_expert", "dequantize_rows"]

_KERNELS: dict[T, Kernel] = {
    T.F32: floats.deq_f32,
    T.F16: floats.deq_f16,
    T.BF16: floats.deq_bf16,
    T.Q4_0: legacy.deq_q4_0,
    T.Q4_1: legacy.deq_q4_1,
    T.Q5_0: legacy.deq_q5_0,
    T.Q5_1: legacy.deq_q5_1,
    T.Q8_0: legacy.deq_q8_0,
    T.Q2_K: kquants.deq_q2_k,
    T.Q3_K: kquants.deq_q3_k,
    T.Q4_K: kquants.deq_q4_k,
    T.Q5_K: kquants.deq_q5_k,
    T.Q6_K: kquants.deq_q6_k,
    T.IQ4_NL: iquants.deq_iq4_nl,
    T.IQ4_XS: iquants.deq_iq4_xs,
    T.IQ3_XXS: iquants.deq_iq3_xxs,
    T.IQ3_S: iquants.deq_iq3_s,
    T.IQ2_XXS: iquants.deq_iq2_xxs,
    T.IQ2_XS: iquants.deq_iq2_xs,
    T.IQ2_S: iquants.deq_iq2_s,
    T.IQ1_S: lowbit.deq_iq1_s,
    T.IQ1_M: lowbit.deq_iq1_m,
    T.TQ1_0: lowbit.deq_tq1_0,
    T.TQ2_0: lowbit.deq_tq2_0,
    T.MXFP4: mxfp4.deq_mxfp4,
}

SUPPORTED: frozenset[T] = frozenset(_KERNELS)

# Output elements per kernel call. Each call costs ~15-40 us of Python and small-array numpy work
# on top of its per-element passes, so bigger is better up to cache size; measured on a Zen 4
# (1 MiB L2): 2^16 is 10-25% slower than 2^17; 2^18 is ~5% faster on one thread but doubles each
# worker's working set (~1 MiB at 2^17: 512 KiB of output plus temporaries), which threads share L3 for.
CHUNK_ELEMS = 1 << 17
# Worker threads for tensors of several chunks. numpy releases the GIL inside each pass, and the
# chunks write disjoint slices of the output, so threads change timing only, never the bits.
THREADS = min(8, os.cpu_count() or 1)

_malloc_primed = False
# (pid, size, pool): rebuilt when THREADS changes or after a fork (the child has no worker threads,
# and a ThreadPoolExecutor inherited that way can wait forever for them).
_pool: tuple[int, int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _unsupported(path: str, what: str) -> UnknownQuantTypeError:
    names = ", ".join(sorted(t.name for t in SUPPORTED))
    return UnknownQuantTypeError(path, f"{what} cannot be dequantized; supported types: {names}")


def _qtype(qtype: T | int, path: str) -> T:
    try:
        qt = T(qtype)
    except ValueError:
        raise _unsupported(path, f"unknown ggml type id {qtype!r}") from None
    if qt not in _KERNELS:
        raise _unsupported(path, f"ggml type {qt.name}")
    return qt


def _dequantize(raw: np.ndarray, qt: T, n_cols: int | None, out: np.ndarray | None) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qt]
    raw = np.ascontiguousarray(raw).view(np.uint8)
    lead, row_bytes = (raw.shape[:-1], raw.shape[-1]) if raw.ndim else ((), 0)
    if row_bytes % size:
        raise ValueError(f"{qt.name}: {row_bytes} bytes per row is not a whole number of {size}-byte blocks")
    cols = row_bytes // size * block
    if n_cols is not None and n_cols != cols:
        raise ValueError(f"{qt.name}: n_cols={n_cols} but {row_bytes} bytes per row hold {cols} values")
    shape = (*lead, cols)
    if out is None:
        out = np.empty(shape, np.float32)
    elif (out.shape, out.dtype) != (shape, np.float32) or not (out.flags.c_contiguous & out.flags.writeable):
        raise ValueError(f"out must be a writable C-contiguous float32 {shape}, got {out.dtype} {out.shape}")
    blocks = raw.reshape(-1, size)  # [n_blocks, type_size]
    flat = out.reshape(-1, block)  # [n_blocks, block_size]
    _run_chunks(_KERNELS[qt], blocks, flat, max(1, CHUNK_ELEMS // block))
    return out


def _prime_malloc() -> None:
    """Free one 16 MiB block so glibc raises its mmap/trim thresholds (to 16/32 MiB) right away.

    A kernel call allocates and frees ~1-2 MiB of temporaries. In a fresh process glibc's
    thresholds are 128 KiB (then the largest mmap'd block freed so far), so those frees often
    trim the heap and the next chunk page-faults it back in: 2-3x slower, depending on history.
    glibc's own rule (mallopt(3), dynamic mmap threshold) does the rest; elsewhere this is a no-op.
    """
    global _malloc_primed
    if not _malloc_primed:
        _malloc_primed = True
        np.empty(16 << 20, np.uint8)  # allocated and freed at once


def _run_chunks(kernel: Kernel, blocks: np.ndarray, flat: np.ndarray, step: int) -> None:
    _prime_malloc()
    starts = range(0, blocks.shape[0], step)
    if THREADS <= 1 or len(starts) < 2:
        for i in starts:
            kernel(blocks[i : i + step], flat[i : i + step])
        return
    global _pool
    with _pool_lock:
        if _pool is None or _pool[:2] != (os.getpid(), THREADS):
            _pool = (os.getpid(), THREADS, ThreadPoolExecutor(THREADS, thread_name_prefix="strata-dequant"))
        pool = _pool[2]
    for f in [pool.submit(kernel, blocks[i : i + step], flat[i : i + step]) for i in starts]:
        f.result()  # re-raises a kernel's exception here


def dequantize(
    raw: np.ndarray, qtype: T | int, n_cols: int | None = None, *, out: np.ndarray | None = None
) -> np.ndarray:
    """Dequantize `raw` (uint8 [rows, row_bytes], or any [..., row_bytes]) to float32 [..., n_cols].

    Leading axes are kept, as gguf-py does: a 1-D row gives a 1-D result, GGUFFile.raw() of a 3-D
    expert tensor a 3-D one. `n_cols`, if given, must match the row width (it is a check, not a
    reshape). The result is a new writable array, or `out` (C-contiguous float32 of the result's
    shape) filled and returned: reusing a buffer skips the OS zero-filling a fresh one's pages,
    ~30% of the time here. Bit-identical to gguf.quants.dequantize.
    Raises UnknownQuantTypeError for a type outside SUPPORTED, ValueError for a ragged row width.
    """
    return _dequantize(raw, _qtype(qtype, "<array>"), n_cols, out)


def dequantize_rows(
    gguf_file: GGUFFile, name: str, start: int, stop: int, *, out: np.ndarray | None = None
) -> np.ndarray:
    """Rows [start, stop) of tensor `name` (leading axes flattened) as float32 [stop - start, cols].

    Only those rows' bytes are read from the mmap, so slicing a vocabulary or an expert range never
    pages in the rest of the tensor. `out` as in `dequantize`.
    """
    info = gguf_file.tensors[name]
    qt = _qtype(info.qtype, gguf_file.path)
    if not 0 <= start <= stop <= info.n_rows:
        raise IndexError(f"{name}: rows [{start}, {stop}) out of range for {info.n_rows} rows")
    rows = gguf_file.raw(name).reshape(info.n_rows, info.row_bytes)[start:stop]  # zero-copy view
    return _dequantize(rows, qt, info.shape[-1], out)


def dequantize_expert(
    gguf_file: GGUFFile, name: str, expert: int, *, out: np.ndarray | None = None
) -> np.ndarray:
    """Expert `expert` of a 3-D [n_expert, rows, cols] tensor as float32 [rows, cols] (`out` as in
    `dequantize`)."""
    shape = gguf_file.tensors[name].shape
    if len(shape) != 3:
        raise ValueError(f"{name}: expected a 3-D expert tensor, got shape {shape}")
    if not 0 <= expert < shape[0]:
        raise IndexError(f"{name}: expert {expert} out of range for {shape[0]} experts")
    return dequantize_rows(gguf_file, name, expert * shape[1], (expert + 1) * shape[1], out=out)

"""A host-memory stand-in for the part of cupy that strata/gpu/kv.py uses, so its bookkeeping (the
--kv-resident window's copies, the addresses the kernels are given) runs in CI without a GPU.

"Device" arrays are numpy arrays with cupy's `.data.ptr` and `.get()`; copies are memmoves at once (a single
stream that is always done). Kernels are not emulated: a test reads and writes cells at the addresses the
table gives, as the kernels would.
"""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any

import numpy as np


class _Ptr:
    def __init__(self, a: np.ndarray) -> None:
        self.ptr = int(a.__array_interface__["data"][0])


class FakeArray(np.ndarray):
    """A numpy array that answers `.data.ptr` and `.get()` as a cupy array does."""

    @property
    def data(self) -> _Ptr:  # type: ignore[override]
        return _Ptr(self)

    def get(self, out: np.ndarray | None = None, stream: Any = None) -> np.ndarray:
        if out is None:
            return np.array(self, copy=True).view(np.ndarray)
        out[...] = self
        return out

    def set(self, a: np.ndarray, stream: Any = None) -> None:
        self[...] = a


def _empty(shape: Any, dtype: Any = np.float32) -> FakeArray:
    return np.zeros(shape, dtype).view(FakeArray)


def _asarray(a: Any, dtype: Any = None) -> FakeArray:
    if isinstance(a, FakeArray):
        return a
    return np.array(a, dtype=dtype).view(FakeArray)


class _Stream:
    ptr = 0

    def synchronize(self) -> None:
        pass


class _Pool:
    """cupy's memory pool, with no limit: host arrays go back to the allocator when dropped, so it keeps
    nothing to free."""

    def get_limit(self) -> int:
        return 0

    def total_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        pass


def _memcpy2d(
    dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind: int, s: int
) -> None:
    for r in range(height):
        ctypes.memmove(dst + r * dpitch, src + r * spitch, width)


def module() -> types.ModuleType:
    """The stand-in `cupy` module."""
    cp = types.ModuleType("cupy")
    cp.empty = _empty  # type: ignore[attr-defined]
    cp.zeros = _empty  # type: ignore[attr-defined]
    cp.asarray = _asarray  # type: ignore[attr-defined]
    cp.arange = lambda n, dtype=None: np.arange(n, dtype=dtype).view(FakeArray)  # type: ignore[attr-defined]
    pool = _Pool()
    cp.get_default_memory_pool = lambda: pool  # type: ignore[attr-defined]
    for name in ("float16", "float32", "int8", "int32", "int64", "uint8"):
        setattr(cp, name, getattr(np, name))
    cuda = types.SimpleNamespace(
        get_current_stream=lambda: _Stream(),
        runtime=types.SimpleNamespace(memcpy2DAsync=_memcpy2d),
    )
    cp.cuda = cuda  # type: ignore[attr-defined]
    return cp


def install(monkeypatch: Any) -> types.ModuleType:
    """Point strata.gpu's cupy access (and `import cupyx`) at the stand-in for one test."""
    import strata.gpu.kv as kv
    import strata.gpu.pinned as pinned
    import strata.gpu.runtime as runtime

    cp = module()
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype: np.zeros(shape, dtype)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(runtime, "cupy_module", lambda: cp)
    monkeypatch.setattr(kv, "cupy_module", lambda: cp)
    # snapshots from a pool of this test's own host blocks (the real one asks cupy to pin them)
    pool = pinned.PinnedPool(_host_block)
    monkeypatch.setattr(pinned, "snapshot_pool", lambda: pool)
    monkeypatch.setattr(kv, "snapshot_pool", lambda: pool)
    return cp


def _host_block(n: int) -> tuple[np.ndarray, int]:
    b = np.zeros(n, np.uint8)
    return b, b.ctypes.data

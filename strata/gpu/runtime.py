"""cupy access in one place: availability, NVRTC compilation of our kernel sources, launch args.

cupy is imported only here and only when asked for, so `import strata.gpu` is free on machines
without it (CI). Kernel sources are compiled once per (source, set of template instances); cupy
keeps the cubins in its own disk cache, so a second process starts without NVRTC work.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

OPTIONS: tuple[str, ...] = ()  # NVRTC defaults to C++17; no headers, so no include paths


def cupy_module() -> Any:
    """The cupy module; raises ImportError where cupy is not installed."""
    import cupy

    return cupy


# CUDA errors that leave the process's context unusable (the runtime's "sticky" errors): every later call
# fails with them until the process restarts, so a server that meets one can only say so and be restarted.
STICKY_ERRORS = (
    "cudaErrorIllegalAddress",
    "cudaErrorLaunchFailure",
    "cudaErrorIllegalInstruction",
    "cudaErrorMisalignedAddress",
    "cudaErrorInvalidAddressSpace",
    "cudaErrorInvalidPc",
    "cudaErrorHardwareStackError",
    "cudaErrorAssert",
    "cudaErrorECCUncorrectable",
)


def lost_context(e: BaseException) -> str | None:
    """The sticky CUDA error `e` names (cupy's CUDARuntimeError, or an error raised with its text), or
    None."""
    text = str(e)
    return next((name for name in STICKY_ERRORS if name in text), None)


def available() -> bool:
    """True when cupy imports and sees a CUDA device."""
    try:
        return bool(cupy_module().is_available())
    except (ImportError, RuntimeError, OSError):  # no cupy, or a CUDA driver/runtime error raised by it
        return False


@functools.cache
def _module(source: str, names: tuple[str, ...]) -> Any:
    cp = cupy_module()
    return cp.RawModule(code=source, options=OPTIONS, name_expressions=list(names))


KERNEL_NAMES: dict[int, str] = {}  # id(function) -> its name expression, for profiles


class Kernels:
    """Functions of one source: each template instance named up front (NVRTC needs them at compile)."""

    def __init__(self, source: str, names: Iterable[str]) -> None:
        self.names = tuple(sorted(set(names)))
        self.module = _module(source, self.names)
        self._fn: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        fn = self._fn.get(name)
        if fn is None:
            if name not in self.names:
                raise KeyError(f"kernel {name} was not compiled; compiled: {', '.join(self.names)}")
            fn = self._fn[name] = self.module.get_function(name)
            KERNEL_NAMES[id(fn)] = name
        return fn


class SideBranch:
    """A second stream that launches fork onto and join back from: inside a captured graph the fork and join
    are edges, so the branch's kernels run beside the main stream's (lookahead.py keeps a branch of its own,
    which stays open across the mixer)."""

    def __init__(self) -> None:
        cp = cupy_module()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.forked = cp.cuda.Event(disable_timing=True)
        self.done = cp.cuda.Event(disable_timing=True)

    @contextmanager
    def fork(self) -> Iterator[None]:
        """Launches in the block go on the branch, after what the current stream has queued."""
        cp = cupy_module()
        self.forked.record(cp.cuda.get_current_stream())
        self.stream.wait_event(self.forked)
        with self.stream:
            yield
        self.done.record(self.stream)

    def join(self) -> None:
        """The current stream waits for what the last fork queued."""
        cupy_module().cuda.get_current_stream().wait_event(self.done)


@functools.cache
def side_branch() -> SideBranch:
    """The process's one branch for short forks (passes run one at a time, each joining before it ends)."""
    return SideBranch()


HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 1, 2, 3  # cudaMemcpyKind, for cudaMemcpyAsync


def launch(fn: Any, grid: tuple[int, ...], block: int, args: tuple[Any, ...], smem: int = 0) -> None:
    """Launch on the current stream, raising the kernel's dynamic shared-memory cap when needed."""
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    fn(grid, (block,), args, shared_mem=smem)


def i32(v: int) -> np.int32:
    return np.int32(v)


def i64(v: int) -> np.int64:
    return np.int64(v)


def f32(v: float) -> np.float32:
    return np.float32(v)


NULL = np.uint64(0)


def dev_ptr(v: Any) -> Any:
    """A pointer argument: cupy arrays and np.uint64 pass through; a Python int becomes np.uint64."""
    return np.uint64(v) if isinstance(v, int) else v


def ptr(a: Any, byte_offset: int = 0) -> np.uint64:
    """Device address of a cupy array (plus an offset) as a kernel argument."""
    return np.uint64(a.data.ptr + byte_offset)

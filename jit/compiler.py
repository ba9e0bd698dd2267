"""Compile generated modules with MCJIT at O3, and keep their object code on disk.

Building and optimising a kernel module takes ~0.1-0.5 s; loading its object file takes ~1 ms. The
cache key is the kernel version, the module's name and parameters, and the host (LLVM's CPU name
and feature string), so code compiled for one machine is never run on another.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir

from strata.jit.host import Host, target_machine

# Bump whenever generated code changes meaning: old cache entries then simply stop matching.
KERNEL_VERSION = 2


class Compiler:
    """One per process and host: owns the target machine and every execution engine it loaded."""

    def __init__(self, host: Host, cache_dir: Path | None) -> None:
        self.host = host
        self.cache_dir = cache_dir
        self.tm = target_machine(host)  # emits object code
        # One engine for every module: an engine owns (and frees) the target machine it is given,
        # and a function's address stays valid as long as its engine lives.
        self._engine: llvm.ExecutionEngine | None = None
        self._lock = threading.Lock()
        self.compiled = 0  # modules built from IR (not loaded from the cache): tests look at it

    def symbols(
        self, name: str, params: str, build: Callable[[], ir.Module], names: tuple[str, ...]
    ) -> dict[str, int]:
        """Addresses of `names` in the module `build()` returns, compiled or loaded from the cache."""
        key = f"v{KERNEL_VERSION}|{name}|{params}|{self.host.key}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        path = self.cache_dir / f"{name}-{digest}.o" if self.cache_dir else None
        with self._lock:  # LLVM objects are not thread-safe to build concurrently
            obj = _read(path)
            if obj is None:
                obj = self._compile(build())
                _write(path, obj)
            if self._engine is None:
                self._engine = llvm.create_mcjit_compiler(self._empty(), target_machine(self.host))
            ee = self._engine
            ee.add_object_file(llvm.ObjectFileRef.from_data(obj))
            ee.finalize_object()
            return {n: ee.get_function_address(n) for n in names}

    def _empty(self) -> llvm.ModuleRef:
        mod = llvm.parse_assembly(f'target triple = "{self.host.triple}"\n')
        mod.data_layout = str(self.tm.target_data)
        return mod

    def _compile(self, module: ir.Module) -> bytes:
        module.triple = self.host.triple
        module.data_layout = str(self.tm.target_data)
        mod = llvm.parse_assembly(str(module))
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pb = llvm.create_pass_builder(self.tm, pto)
        pb.getModulePassManager().run(mod, pb)
        self.compiled += 1
        return self.tm.emit_object(mod)

    def asm(self, module: ir.Module) -> str:
        """Assembly for a module (for inspection: does it use zmm registers, vpshufb, ...)."""
        module.triple = self.host.triple
        mod = llvm.parse_assembly(str(module))
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pb = llvm.create_pass_builder(self.tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return self.tm.emit_assembly(mod)


def _read(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError:
        return None


def _write(path: Path | None, data: bytes) -> None:
    """Atomic (write a temp file, rename) so a concurrent process never loads half an object; a
    cache we cannot write is only slower, never an error."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass

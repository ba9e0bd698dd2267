"""The host CPU as LLVM sees it: name, feature string, SIMD width, and the target machine.

Kernels are generated for exactly this CPU (AVX2 on the development machines, AVX-512 on the GPU
host), so the vector width and the x86 intrinsics a kernel may use are decided here, once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llvmlite.binding as llvm


@dataclass(frozen=True, slots=True)
class Host:
    name: str  # LLVM CPU name, e.g. "znver4", "haswell"
    features: str  # "+avx2,+fma,-avx512f,..." exactly as LLVM reports them
    triple: str

    def has(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")

    @property
    def x86(self) -> bool:
        return self.triple.startswith(("x86_64", "i686", "i386"))

    @property
    def lanes(self) -> int:
        """float32 lanes of the widest vector register the kernels may use."""
        if self.has("avx512f"):
            return 16
        if self.has("avx2") or self.has("avx"):
            return 8
        return 4

    @property
    def registers(self) -> int:
        """Vector registers the register-blocking tiles are sized for."""
        return 32 if self.has("avx512f") else 16

    @property
    def key(self) -> str:
        """Identifies code compiled for this host: part of every disk-cache key."""
        return f"{self.triple}|{self.name}|{self.features}"


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def detect() -> Host:
    """The host CPU as LLVM detects it (cheap; callers that need it often keep the result)."""
    _init()
    return Host(llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), llvm.get_process_triple())


def with_features(host: Host, drop: tuple[str, ...]) -> Host:
    """`host` with every feature whose name starts with one of `drop` turned off: tests compile the
    AVX2 or scalar-f16 paths on an AVX-512 machine this way (the code still runs here). A prefix,
    because LLVM re-enables avx512f for any later "+avx512vl" and the like."""
    feats = [f"-{f[1:]}" if f[1:].startswith(drop) else f for f in host.features.split(",")]
    name = "x86-64-v3" if any("avx512".startswith(d) or d.startswith("avx512") for d in drop) else host.name
    return Host(name, ",".join(feats), host.triple)


def target_machine(host: Host) -> llvm.TargetMachine:
    _init()
    target = llvm.Target.from_triple(host.triple)
    return target.create_target_machine(cpu=host.name, features=host.features, opt=3, jit=True)

"""Engine options: what `Engine.load(path, **options)` and the CLI flags accept."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from strata.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EngineOptions:
    n_ctx: int = 0  # 0 = the model's trained context length
    weight_cache_mib: int = 4096  # f32 cache of dequantized weights; beyond it, dequantize per use
    prefill_chunk: int = 512  # tokens per forward call while reading a prompt
    verify: str | None = None  # expected SHA-256 of the GGUF, checked before use
    backend: str = "numpy"  # "jit": fused llvmlite kernels on quantized weights, MoE experts on the CPU pool
    pool_workers: int = 0  # CPU pool threads; 0 = affinity capped by the cgroup CPU quota
    aux_cpus: str = "auto"  # CPUs for helper threads, kept apart from the workers: "auto" or "0,2-3"
    jit_cache: str | None = field(default_factory=lambda: str(Path.home() / ".cache/strata/jit"))  # None: off

    @classmethod
    def from_kwargs(cls, **kw: Any) -> EngineOptions:
        """Build from keyword options, naming the offending option on any bad key or value."""
        known = {f.name for f in fields(cls)}
        for key in kw:
            if key not in known:
                raise ConfigError(key, kw[key], f"unknown engine option; known: {', '.join(sorted(known))}")
        opts = cls(**kw)
        opts.validate()
        return opts

    def validate(self) -> None:
        if self.n_ctx < 0:
            raise ConfigError("n_ctx", self.n_ctx, "must be >= 0 (0 = model default)")
        if self.weight_cache_mib < 0:
            raise ConfigError("weight_cache_mib", self.weight_cache_mib, "must be >= 0")
        if self.prefill_chunk < 1:
            raise ConfigError("prefill_chunk", self.prefill_chunk, "must be >= 1")
        if self.verify is not None and (len(self.verify) != 64 or not _is_hex(self.verify)):
            raise ConfigError("verify", self.verify, "must be a 64-character hex SHA-256")
        if self.backend not in BACKENDS:
            raise ConfigError("backend", self.backend, f"must be one of {', '.join(BACKENDS)}")
        if self.pool_workers < 0:
            raise ConfigError("pool_workers", self.pool_workers, "must be >= 0 (0 = from the CPU quota)")
        if self.aux_cpus != "auto" and not _CPU_LIST.fullmatch(self.aux_cpus):
            raise ConfigError("aux_cpus", self.aux_cpus, "must be 'auto' or a CPU list like 0,2-3")


BACKENDS = ("numpy", "jit")
_CPU_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


def _is_hex(s: str) -> bool:
    try:
        int(s, 16)
    except ValueError:
        return False
    return True

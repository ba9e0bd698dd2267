"""Engine options: what `Engine.load(path, **options)` and the CLI flags accept."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from strata.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EngineOptions:
    n_ctx: int = 0  # 0 = the model's trained context length
    weight_cache_mib: int = 4096  # f32 cache of dequantized weights; beyond it, dequantize per use
    prefill_chunk: int = 512  # tokens per forward call while reading a prompt
    verify: str | None = None  # expected SHA-256 of the GGUF, checked before use

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


def _is_hex(s: str) -> bool:
    try:
        int(s, 16)
    except ValueError:
        return False
    return True

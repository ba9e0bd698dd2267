"""WeightStore: float32 views of GGUF weights, dequantized on first use under a byte budget.

Weights stay quantized in the mmap. A tensor is dequantized when first used and kept while the
f32 cache is under budget; once the budget is spent, further matrices are dequantized block by
block on every use, so memory stays bounded whatever the model size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.errors import UnknownQuantTypeError
from strata.gguf import GGUFFile
from strata.quants import SUPPORTED, dequantize

# Rows dequantized at a time when a matrix is not cached: bounds the transient f32 copy.
ROW_BLOCK = 2048


class WeightStore:
    def __init__(self, gguf: GGUFFile, cache_bytes: int) -> None:
        self.gguf = gguf
        self.cache_bytes = cache_bytes
        self.cached_bytes = 0
        self._cache: dict[tuple[str, int], np.ndarray] = {}
        # Fused JIT kernels (strata.jit.backend.JitBackend) when the engine runs with backend="jit":
        # matmuls then read the quantized bytes directly and never fill the f32 cache.
        self.jit: Any = None
        # The expert tiers (strata.tiers.slots.ExpertCache) when routed experts are read through a slot
        # cache (--expert-cache on the CPU stand-in) instead of straight from the file.
        self.tiers: Any = None
        # How big lookup tables (Qwen4-Exp's PLE n-gram table) are read: strata.tiers.tables' --ple-io modes.
        self.table_io = "mmap"

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return self.gguf.tensors[name].shape

    def _full(self, name: str, expert: int = -1, always: bool = False) -> np.ndarray | None:
        """The whole (expert slice of the) tensor as f32, cached if the budget allows (always: regardless);
        None if not."""
        key = (name, expert)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        info = self.gguf.tensors[name]
        raw = self.gguf.raw(name)
        if expert >= 0:
            raw = raw[expert]
        n_out = int(np.prod(info.shape[1:] if expert >= 0 else info.shape)) * 4
        if self.cached_bytes + n_out > self.cache_bytes and not always:
            return None
        w = dequantize(raw, info.qtype, info.shape[-1])
        self._cache[key] = w
        self.cached_bytes += w.nbytes
        return w

    def vector(self, name: str) -> np.ndarray:
        """A small tensor as a vector (norm weights, biases, DeltaNet's conv kernel): always cached, they are
        tiny (the conv kernel is 2-D: under the budget rule of matrices it failed once experts filled the
        cache)."""
        w = self._full(name, always=True)
        assert w is not None
        return w.reshape(-1)

    def matmul(self, x: np.ndarray, name: str, expert: int = -1) -> np.ndarray:
        """x [T, cols] @ W.T -> [T, rows]; W is `name` (or its `expert` slice for 3-D tensors)."""
        if self.jit is not None and (y := self.jit.matmul(x, name, expert)) is not None:
            return y
        w = self._full(name, expert)
        if w is not None:
            return x @ w.T
        info = self.gguf.tensors[name]
        raw = self.gguf.raw(name)
        if expert >= 0:
            raw = raw[expert]
        rows = raw.shape[0]
        out = np.empty((x.shape[0], rows), np.float32)
        for r0 in range(0, rows, ROW_BLOCK):
            r1 = min(rows, r0 + ROW_BLOCK)
            out[:, r0:r1] = x @ dequantize(raw[r0:r1], info.qtype, info.shape[-1]).T
        return out

    @staticmethod
    def matmul_raw(x: np.ndarray, raw: np.ndarray, qtype: int) -> np.ndarray:
        """x [T, cols] @ W.T for quantized rows raw [rows, row_bytes] found elsewhere (an expert slot)."""
        return x @ dequantize(raw, qtype).T

    def matmul_cat(self, x: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
        """x [T, cols] times several matrices sharing `cols`, outputs side by side: [T, sum rows].

        The JIT backend runs them as one kernel call over rows packed together once (when their
        quant types match); otherwise each is one `matmul`, so the values are the same either way.
        """
        if self.jit is not None and (y := self.jit.matmul_cat(x, names)) is not None:
            return y
        parts = [self.matmul(x, n) for n in names]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a 2-D tensor as f32 [len(ids), cols], reading only those rows' bytes."""
        hit = self._cache.get((name, -1))
        if hit is not None:
            return hit[ids]
        info = self.gguf.tensors[name]
        return dequantize(self.gguf.raw(name)[ids], info.qtype, info.shape[-1])


def check_supported(gguf: GGUFFile) -> None:
    """Fail at load time, naming the tensor, rather than mid-generation."""
    for t in gguf.tensors.values():
        if t.qtype not in SUPPORTED:
            names = ", ".join(sorted(q.name for q in SUPPORTED))
            raise UnknownQuantTypeError(
                gguf.path,
                f"tensor {t.name!r} uses {t.qtype.name}, which we cannot dequantize; supported: {names}",
            )

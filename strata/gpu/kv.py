"""A sequence's attention KV cache in VRAM: K and V [n_layer, n_kv, cap, head_dim] fp16.

It stands in for strata.runtime.kvcache.KVCache inside a SequenceState (copy, truncate, nbytes), so the
scheduler's prefix cache and checkpoints work unchanged. Capacity doubles as the sequence grows;
growing happens between steps on the host side, never inside a captured graph, and kernels find
the buffers through a per-row table (`table_row`), so a grown cache needs no new graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.tiers.budget import Ledger
from strata.gpu.runtime import cupy_module

MIN_CAP = 256


class GpuKV:
    def __init__(self, ledger: Ledger, n_layer: int, n_kv: int, head_dim: int, max_len: int) -> None:
        self.ledger, self.shape = ledger, (n_layer, n_kv, head_dim)
        self.max_len = max_len
        self.length = 0
        self.cap = 0
        self.k: Any = None
        self.v: Any = None

    def _bytes(self, cap: int) -> int:
        n_layer, n_kv, hd = self.shape
        return 2 * n_layer * n_kv * cap * hd * 2

    def reserve(self, n: int) -> None:
        """Make room for n positions (keeping the first `length`)."""
        if n <= self.cap:
            return
        cap = min(max(MIN_CAP, 2 * self.cap, n), max(n, self.max_len))
        cp = cupy_module()
        self.ledger.take(self._bytes(cap) - self._bytes(self.cap), f"KV cache for {cap} positions")
        n_layer, n_kv, hd = self.shape
        k = cp.empty((n_layer, n_kv, cap, hd), cp.float16)
        v = cp.empty_like(k)
        if self.length:
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v, self.cap = k, v, cap

    def table_row(self, pos: int) -> list[int]:
        """(k address, v address, capacity, position) as the kernels read it."""
        return [self.k.data.ptr, self.v.data.ptr, self.cap, pos]

    def truncate(self, n: int) -> None:
        self.length = min(self.length, n)

    def copy(self) -> GpuKV:
        return _filled(self.ledger, self.shape, self.max_len, self.length, self.k, self.v)

    def nbytes(self) -> int:
        return self._bytes(self.cap)

    def to_host(self) -> HostKV:
        """A copy in host RAM (the prefix cache keeps these, not VRAM); its copy() comes back to the GPU."""
        k = self.k[:, :, : self.length].get() if self.length else None
        v = self.v[:, :, : self.length].get() if self.length else None
        return HostKV(self.ledger, self.shape, self.max_len, self.length, k, v)

    def host(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of one layer as float32 [length, n_kv, hd] (tests and debugging)."""
        k = self.k[layer, :, : self.length].transpose(1, 0, 2).astype(np.float32)
        v = self.v[layer, :, : self.length].transpose(1, 0, 2).astype(np.float32)
        return k.get(), v.get()

    def __del__(self) -> None:
        if self.cap:
            self.ledger.give(self._bytes(self.cap))


class HostKV:
    """A GpuKV's first `length` positions in host RAM: K and V [n_layer, n_kv, length, head_dim] fp16."""

    def __init__(self, ledger: Ledger, shape: tuple[int, int, int], max_len: int, length: int, k: Any, v: Any) -> None:
        self.ledger, self.shape, self.max_len, self.length, self.k, self.v = ledger, shape, max_len, length, k, v

    def truncate(self, n: int) -> None:
        self.length = min(self.length, n)

    def copy(self) -> GpuKV:
        return _filled(self.ledger, self.shape, self.max_len, self.length, self.k, self.v)

    def nbytes(self) -> int:
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes


def _filled(ledger: Ledger, shape: tuple[int, int, int], max_len: int, length: int, k: Any, v: Any) -> GpuKV:
    """A new GpuKV holding the first `length` positions of k and v (device or host arrays)."""
    out = GpuKV(ledger, *shape, max_len)
    if length:
        cp = cupy_module()
        out.reserve(length)
        out.k[:, :, :length] = cp.asarray(k[:, :, :length])  # asarray: a no-op for device arrays
        out.v[:, :, :length] = cp.asarray(v[:, :, :length])
        out.length = length
    return out

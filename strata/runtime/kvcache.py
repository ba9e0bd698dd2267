"""Per-sequence attention KV cache: one growable [S, n_kv, head_dim] pair per attention layer."""

from __future__ import annotations

import numpy as np


class KVCache:
    """Keys and values for the layers that attend; capacity doubles so appends are amortised O(1)."""

    def __init__(self, layers: list[int], n_kv: int, head_dim: int, v_dim: int | None = None) -> None:
        self.n_kv, self.head_dim, self.v_dim = n_kv, head_dim, v_dim or head_dim
        self._k: dict[int, np.ndarray] = {i: np.empty((0, n_kv, head_dim), np.float32) for i in layers}
        self._v: dict[int, np.ndarray] = {i: np.empty((0, n_kv, self.v_dim), np.float32) for i in layers}
        self.length = {i: 0 for i in layers}

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add k, v [T, n_kv, d] for `layer`; return views of all keys and values [S, n_kv, d]."""
        n, t = self.length[layer], k.shape[0]
        if n + t > self._k[layer].shape[0]:
            cap = max(16, 2 * (n + t))
            for store in (self._k, self._v):
                old = store[layer]
                grown = np.empty((cap, *old.shape[1:]), np.float32)
                grown[:n] = old[:n]
                store[layer] = grown
        self._k[layer][n : n + t] = k
        self._v[layer][n : n + t] = v
        self.length[layer] = n + t
        return self._k[layer][: n + t], self._v[layer][: n + t]

    def truncate(self, n: int) -> None:
        """Forget everything after the first n positions (rollback of rejected drafts, prefix reuse)."""
        for i in self.length:
            self.length[i] = min(self.length[i], n)

    def copy(self) -> KVCache:
        out = KVCache([], self.n_kv, self.head_dim, self.v_dim)
        for i, n in self.length.items():
            out._k[i], out._v[i] = self._k[i][:n].copy(), self._v[i][:n].copy()
            out.length[i] = n
        return out

    def nbytes(self) -> int:
        return sum((self._k[i][:n].nbytes + self._v[i][:n].nbytes) for i, n in self.length.items())

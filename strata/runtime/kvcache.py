"""Per-sequence attention KV cache: one growable [S, n_kv, head_dim] pair per attention layer.

The cells are stored as `KVType` says: f32 (the reference), f16, or int8 with one float32 scale per
token, head and 32 channels (q8_0's block; symmetric, max |x| / 127, written once when the token is
appended, so a cell's error never compounds). Attention reads float32 either way: `append` returns the
layer's keys and values decoded. int8 holds a long context in 28% of f32's RAM (56% of f16's: 32 codes
and a 4-byte scale a block). tests/test_kv_types.py gives the fidelity measured against f32.

With a `ledger` (the CPU stand-in of --kv-grow: tiers/grow.py) the cells' capacity is charged to it as
the GPU's KV is to the VRAM ledger: growth takes, the cache's end gives back; `to_host` copies (the prefix
cache's, snapshots) are not charged until a restore copies them back.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from strata.errors import ConfigError
from strata.tiers.budget import Ledger


class KVType(StrEnum):
    F32 = "f32"
    F16 = "f16"
    INT8 = "int8"


GROUP = 32  # int8 elements per scale: q8_0's block
KV_TYPES = ("auto", *(t.value for t in KVType))  # auto: the device's own (f32 on the CPU, f16 on the GPU)


def check_kv_type(value: str, flag: str = "--kv-type") -> None:
    if value not in KV_TYPES:
        raise ConfigError(flag, value, f"must be one of {', '.join(KV_TYPES)}")


def group_of(d: int) -> int:
    """Elements per int8 scale in a head of d: GROUP where it divides d, else the whole head."""
    return GROUP if d % GROUP == 0 else d


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., d] float32 -> int8 codes [..., d] and scales [..., d / group] with x ~= codes * scale."""
    g = group_of(x.shape[-1])
    parts = x.reshape(*x.shape[:-1], -1, g)
    scale = (np.max(np.abs(parts), axis=-1) / np.float32(127)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    codes = np.clip(np.rint(parts / safe[..., None]), -127, 127).astype(np.int8)
    return codes.reshape(x.shape), scale


def dequantize_rows(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    g = group_of(codes.shape[-1])
    parts = codes.reshape(*codes.shape[:-1], -1, g).astype(np.float32) * scale[..., None]
    return parts.reshape(codes.shape)


class _Cells:
    """One growable array of [cap, n_kv, d] cells in one KVType."""

    def __init__(self, kind: KVType, n_kv: int, d: int) -> None:
        self.kind = kind
        dtype = {KVType.F32: np.float32, KVType.F16: np.float16, KVType.INT8: np.int8}[kind]
        self.data = np.empty((0, n_kv, d), dtype)
        self.scale = np.empty((0, n_kv, d // group_of(d)), np.float32) if kind is KVType.INT8 else None

    def write(self, n: int, x: np.ndarray) -> None:
        """Store x [T, n_kv, d] at cells n.. (room made by the caller)."""
        t = x.shape[0]
        if self.scale is None:
            self.data[n : n + t] = x
        else:
            self.data[n : n + t], self.scale[n : n + t] = quantize_rows(x)

    def grow(self, n: int, cap: int) -> None:
        """Room for cap cells, keeping the first n."""
        for name in ("data", "scale"):
            old = getattr(self, name)
            if old is None:
                continue
            grown = np.empty((cap, *old.shape[1:]), old.dtype)
            grown[:n] = old[:n]
            setattr(self, name, grown)

    def read(self, n: int) -> np.ndarray:
        """The first n cells as float32 [n, n_kv, d] (a view for f32)."""
        if self.scale is not None:
            return dequantize_rows(self.data[:n], self.scale[:n])
        return self.data[:n] if self.kind is KVType.F32 else self.data[:n].astype(np.float32)

    def copy(self, n: int) -> _Cells:
        out = _Cells.__new__(_Cells)
        out.kind, out.data = self.kind, self.data[:n].copy()
        out.scale = None if self.scale is None else self.scale[:n].copy()
        return out

    def nbytes(self, n: int) -> int:
        return self.data[:n].nbytes + (0 if self.scale is None else self.scale[:n].nbytes)

    def cap_bytes(self) -> int:
        return self.data.nbytes + (0 if self.scale is None else self.scale.nbytes)


class KVCache:
    """Keys and values for the layers that attend; capacity doubles so appends are amortised O(1)."""

    def __init__(
        self,
        layers: list[int],
        n_kv: int,
        head_dim: int,
        v_dim: int | None = None,
        kind: KVType = KVType.F32,
        ledger: Ledger | None = None,
    ) -> None:
        self.n_kv, self.head_dim, self.v_dim, self.kind = n_kv, head_dim, v_dim or head_dim, kind
        self._k = {i: _Cells(kind, n_kv, head_dim) for i in layers}
        self._v = {i: _Cells(kind, n_kv, self.v_dim) for i in layers}
        self.length = dict.fromkeys(layers, 0)
        self.ledger, self.charged = ledger, ledger is not None

    def _grow(self, layer: int, need: int) -> None:
        keys, values = self._k[layer], self._v[layer]
        cap, old = max(16, 2 * need), keys.data.shape[0]
        if self.charged:
            assert self.ledger is not None
            per = self.bytes_per_token(self.kind, 1, self.n_kv, self.head_dim, self.v_dim)
            self.ledger.take((cap - old) * per, f"KV cache for {cap:,} positions")
        keys.grow(self.length[layer], cap)
        values.grow(self.length[layer], cap)

    def reserve(self, n: int) -> None:
        """Room for n positions in every layer (a pass's rows, before it runs: growth takes from the ledger
        between passes, as the GPU's does)."""
        for i in self.length:
            if n > self._k[i].data.shape[0]:
                self._grow(i, n)

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add k, v [T, n_kv, d] for `layer`; return all keys and values [S, n_kv, d] as float32."""
        n, t = self.length[layer], k.shape[0]
        keys, values = self._k[layer], self._v[layer]
        if n + t > keys.data.shape[0]:
            self._grow(layer, n + t)
        keys.write(n, k)
        values.write(n, v)
        self.length[layer] = n + t
        return keys.read(n + t), values.read(n + t)

    def truncate(self, n: int) -> None:
        """Forget everything after the first n positions (rollback of rejected drafts, prefix reuse)."""
        for i in self.length:
            self.length[i] = min(self.length[i], n)

    def _copy(self, charged: bool) -> KVCache:
        out = KVCache([], self.n_kv, self.head_dim, self.v_dim, self.kind)
        for i, n in self.length.items():
            out._k[i], out._v[i] = self._k[i].copy(n), self._v[i].copy(n)
            out.length[i] = n
        out.ledger = self.ledger
        if charged and self.ledger is not None:
            self.ledger.take(out.cap_bytes(), "a copy of a KV cache")
            out.charged = True
        return out

    def copy(self) -> KVCache:
        """An independent copy, charged to the ledger like the original (a restore, a checkpoint)."""
        return self._copy(True)

    def to_host(self) -> KVCache:
        """A copy the ledger does not count (the prefix cache's entries, snapshots); its copy() is counted."""
        return self._copy(False)

    def cap_bytes(self) -> int:
        return sum(self._k[i].cap_bytes() + self._v[i].cap_bytes() for i in self.length)

    def nbytes(self) -> int:
        return sum(self._k[i].nbytes(n) + self._v[i].nbytes(n) for i, n in self.length.items())

    def __del__(self) -> None:
        if getattr(self, "charged", False) and self.ledger is not None:
            self.ledger.give(self.cap_bytes())

    @staticmethod
    def bytes_per_token(
        kind: KVType, n_layer: int, n_kv: int, head_dim: int, v_dim: int | None = None
    ) -> int:
        """What one position costs over n_layer attention layers (the planner's KV line)."""
        per = {KVType.F32: 4, KVType.F16: 2, KVType.INT8: 1}[kind]
        dims = head_dim + (v_dim or head_dim)
        scales = 4 * (head_dim // group_of(head_dim) + (v_dim or head_dim) // group_of(v_dim or head_dim))
        return n_layer * n_kv * (per * dims + (scales if kind is KVType.INT8 else 0))

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
from strata.tiers.kvwindow import KVWindow


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

    def take_rows(self, src: _Cells, s0: int, d0: int, n: int) -> None:
        """Cells d0.. get src's cells s0.. as stored (n of them; room made by the caller)."""
        self.data[d0 : d0 + n] = src.data[s0 : s0 + n]
        if self.scale is not None and src.scale is not None:
            self.scale[d0 : d0 + n] = src.scale[s0 : s0 + n]

    @property
    def cap(self) -> int:
        return int(self.data.shape[0])

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
    """Keys and values for the layers that attend; capacity doubles so appends are amortised O(1).

    With a `window` (--kv-resident, tiers/kvwindow.py) `_k`/`_v` hold the window's cells [base, length) (the
    device's, a numpy stand-in here) and `_hk`/`_hv` every older cell (the host's); attention reads both."""

    def __init__(
        self,
        layers: list[int],
        n_kv: int,
        head_dim: int,
        v_dim: int | None = None,
        kind: KVType = KVType.F32,
        ledger: Ledger | None = None,
        window: KVWindow | None = None,
    ) -> None:
        self.n_kv, self.head_dim, self.v_dim, self.kind = n_kv, head_dim, v_dim or head_dim, kind
        self._k = {i: _Cells(kind, n_kv, head_dim) for i in layers}
        self._v = {i: _Cells(kind, n_kv, self.v_dim) for i in layers}
        self._hk = {i: _Cells(kind, n_kv, head_dim) for i in layers} if window else {}
        self._hv = {i: _Cells(kind, n_kv, self.v_dim) for i in layers} if window else {}
        self.length = dict.fromkeys(layers, 0)
        self.ledger, self.charged = ledger, ledger is not None
        self.window = window

    @property
    def base(self) -> int:
        return self.window.base if self.window is not None else 0

    def _grow(self, layer: int, need: int) -> None:
        """Device room for `need` cells of `layer` (the window's rows past base)."""
        keys, values = self._k[layer], self._v[layer]
        cap, old = max(16, 2 * need), keys.cap
        if self.window is not None:
            cap = max(need, min(cap, self.window.device_cells))
        if self.charged:
            assert self.ledger is not None
            per = self.bytes_per_token(self.kind, 1, self.n_kv, self.head_dim, self.v_dim)
            self.ledger.take((cap - old) * per, f"KV cache for {cap:,} positions")
        keys.grow(self.length[layer] - self.base, cap)
        values.grow(self.length[layer] - self.base, cap)

    def reserve(self, n: int) -> None:
        """Room for n positions in every layer (a pass's rows, before it runs: growth takes from the ledger
        between passes, as the GPU's does)."""
        for i in self.length:
            if n - self.base > self._k[i].cap:
                self._grow(i, n - self.base)

    def before_pass(self, rows: int) -> None:
        """Before a pass appends `rows` cells to every layer: the window gives up its oldest blocks to the
        host if it must, and every layer gets room."""
        n = max(self.length.values(), default=0)
        if self.window is not None:
            ev = self.window.before_pass(n, rows)
            if ev is not None:
                for dev, host in ((self._k, self._hk), (self._v, self._hv)):
                    for i, cells in dev.items():
                        h = host[i]
                        if h.cap < ev.hi:
                            h.grow(ev.lo, max(16, 2 * ev.hi))
                        h.take_rows(cells, 0, ev.lo, ev.hi - ev.lo)
                        cells.take_rows(cells, ev.hi - ev.lo, 0, ev.kept)  # numpy copies overlaps right
        self.reserve(n + rows)

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add k, v [T, n_kv, d] for `layer`; return all keys and values [S, n_kv, d] as float32."""
        n, t = self.length[layer], k.shape[0]
        keys, values = self._k[layer], self._v[layer]
        row = n - self.base
        if row + t > keys.cap:
            if self.window is not None and row + t > self.window.device_cells:
                raise ValueError(f"{t} cells past the window's room: call before_pass first")
            self._grow(layer, row + t)
        keys.write(row, k)
        values.write(row, v)
        self.length[layer] = n + t
        return self._read(layer, n + t)

    def _read(self, layer: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        b = self.base
        if not b:
            return self._k[layer].read(n), self._v[layer].read(n)
        return tuple(  # type: ignore[return-value]
            np.concatenate([host[layer].read(b), dev[layer].read(n - b)])
            for dev, host in ((self._k, self._hk), (self._v, self._hv))
        )

    def truncate(self, n: int) -> None:
        """Forget everything after the first n positions (rollback of rejected drafts, prefix reuse)."""
        if self.window is not None:
            back = self.window.truncate(n)
            if back is not None:
                for dev, host in ((self._k, self._hk), (self._v, self._hv)):
                    for i, cells in dev.items():
                        cells.take_rows(host[i], back.lo, 0, back.hi - back.lo)
        for i in self.length:
            self.length[i] = min(self.length[i], n)

    def _copy(self, charged: bool) -> KVCache:
        out = KVCache([], self.n_kv, self.head_dim, self.v_dim, self.kind)
        b = self.base
        for i, n in self.length.items():
            out._k[i], out._v[i] = self._k[i].copy(n - b), self._v[i].copy(n - b)
            if self.window is not None:
                out._hk[i], out._hv[i] = self._hk[i].copy(b), self._hv[i].copy(b)
            out.length[i] = n
        if self.window is not None:
            out.window = KVWindow(self.window.resident, self.window.chunk)
            out.window.base = b
        out.ledger = self.ledger
        if charged and self.ledger is not None:
            self.ledger.take(out.cap_bytes(), "a copy of a KV cache")
            out.charged = True
        return out

    def copy(self) -> KVCache:
        """An independent copy, charged to the ledger like the original (a restore, a checkpoint)."""
        return self._copy(True)

    def to_host(self, length: int | None = None) -> KVCache:
        """A copy the ledger does not count (the prefix cache's entries, snapshots) of the first `length`
        positions (default: all); its copy() is counted."""
        out = self._copy(False)
        if length is not None:
            out.truncate(length)
        return out

    def cap_bytes(self) -> int:
        """The device cells' bytes (what the ledger counts; the window's host cells are RAM)."""
        return sum(self._k[i].cap_bytes() + self._v[i].cap_bytes() for i in self.length)

    def nbytes(self) -> int:
        b, hosted = self.base, 0
        if self.window is not None:
            hosted = sum(self._hk[i].nbytes(b) + self._hv[i].nbytes(b) for i in self.length)
        return hosted + sum(
            self._k[i].nbytes(n - b) + self._v[i].nbytes(n - b) for i, n in self.length.items()
        )

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

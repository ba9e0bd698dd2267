"""A sequence's attention KV cache in VRAM: K and V [n_layer, n_kv, cap, head_dim] fp16, or (`--kv-type int8`)
int8 codes with float32 scales [n_layer, n_kv, cap, head_dim / 32], strata.runtime.kvcache's cells.

It stands in for strata.runtime.kvcache.KVCache inside a SequenceState (copy, truncate, nbytes), so the
scheduler's prefix cache and checkpoints work unchanged. Capacity doubles as the sequence grows;
growing happens between steps on the host side, never inside a captured graph, and kernels find
the buffers through a per-row table (`table_row`), so a grown cache needs no new graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.gpu.runtime import cupy_module, to_pinned
from strata.runtime.kvcache import KVCache, KVType, dequantize_rows, group_of
from strata.tiers.budget import Ledger

MIN_CAP = 256


class GpuKV:
    def __init__(
        self, ledger: Ledger, n_layer: int, n_kv: int, head_dim: int, max_len: int, kind: KVType = KVType.F16
    ) -> None:
        if kind not in (KVType.F16, KVType.INT8):
            raise ValueError(f"the GPU's attention kernels read f16 or int8 cells, not {kind}")
        self.ledger, self.shape, self.kind = ledger, (n_layer, n_kv, head_dim), kind
        self.max_len = max_len
        self.length = 0
        self.cap = 0
        self.k: Any = None
        self.v: Any = None
        self.ks: Any = None  # int8: the scales, [n_layer, n_kv, cap, head_dim / 32] float32
        self.vs: Any = None

    @property
    def q8(self) -> bool:
        return self.kind is KVType.INT8

    def _bytes(self, cap: int) -> int:
        n_layer, n_kv, hd = self.shape
        return cap * KVCache.bytes_per_token(self.kind, n_layer, n_kv, hd)

    def _arrays(self) -> list[str]:
        return ["k", "v", "ks", "vs"] if self.q8 else ["k", "v"]

    def reserve(self, n: int) -> None:
        """Make room for n positions (keeping the first `length`)."""
        if n <= self.cap:
            return
        cap = min(max(MIN_CAP, 2 * self.cap, n), max(n, self.max_len))
        cp = cupy_module()
        old = self._bytes(self.cap)
        self.ledger.take(self._bytes(cap) - old, f"KV cache for {cap} positions")
        # a move on the device holds the old cells beside the new: when the budget has no room for both (a
        # long context, whose KV the plan holds once), the old cells wait in host RAM instead (2 PCIe copies,
        # once a doubling: ~70 ms for 1.8 GB)
        kept = {}
        if self.length:
            via_host = not self.ledger.fits(old)
            for name in self._arrays():
                a = getattr(self, name)[:, :, : self.length]
                kept[name] = a.get() if via_host else a
                if via_host:
                    setattr(self, name, None)
        n_layer, n_kv, hd = self.shape
        for name in self._arrays():
            scales = name.endswith("s")
            grown = cp.empty(
                (n_layer, n_kv, cap, hd // group_of(hd) if scales else hd),
                cp.float32 if scales else (cp.int8 if self.q8 else cp.float16),
            )
            if name in kept:
                grown[:, :, : self.length] = cp.asarray(kept[name])  # asarray: a no-op for device arrays
            setattr(self, name, grown)
        self.cap = cap

    def table_row(self, pos: int) -> list[int]:
        """(k address, v address, capacity, position) as the kernels read it."""
        return [self.k.data.ptr, self.v.data.ptr, self.cap, pos]

    def scale_cols(self) -> list[int]:
        """The table's columns 7 and 8: the int8 cells' scale addresses (0 for fp16 cells)."""
        return [self.ks.data.ptr, self.vs.data.ptr] if self.q8 else [0, 0]

    def flash_args(self, layer: int) -> tuple[int, int, int, tuple[int, int, int] | None]:
        """The flash kernel's view of one layer: k and v addresses, elements a kv head, and the int8
        scales'."""
        _n_layer, n_kv, hd = self.shape
        es = 1 if self.q8 else 2
        off = layer * n_kv * self.cap * hd * es
        scales = None
        if self.q8:
            ng = hd // group_of(hd)
            soff = layer * n_kv * self.cap * ng * 4
            scales = (self.ks.data.ptr + soff, self.vs.data.ptr + soff, self.cap * ng)
        return self.k.data.ptr + off, self.v.data.ptr + off, self.cap * hd, scales

    def truncate(self, n: int) -> None:
        self.length = min(self.length, n)

    def copy(self) -> GpuKV:
        return _filled(
            self.ledger,
            self.shape,
            self.max_len,
            self.length,
            self.kind,
            {a: getattr(self, a) for a in self._arrays()},
        )

    def nbytes(self) -> int:
        return self._bytes(self.cap)

    def to_host(self) -> HostKV:
        """A copy in host RAM (the prefix cache keeps these, not VRAM); its copy() comes back to the GPU."""
        arrays = (
            {a: to_pinned(getattr(self, a)[:, :, : self.length]) for a in self._arrays()}
            if self.length
            else {}
        )
        return HostKV(self.ledger, self.shape, self.max_len, self.length, self.kind, arrays)

    def host(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of one layer as float32 [length, n_kv, hd], decoded (tests and debugging)."""
        out = []
        for name in ("k", "v"):
            cells = getattr(self, name)[layer, :, : self.length].get().transpose(1, 0, 2)
            if self.q8:
                scales = getattr(self, name + "s")[layer, :, : self.length].get().transpose(1, 0, 2)
                out.append(dequantize_rows(cells, scales))
            else:
                out.append(cells.astype(np.float32))
        return out[0], out[1]

    def __del__(self) -> None:
        if self.cap:
            self.ledger.give(self._bytes(self.cap))


class HostKV:
    """A GpuKV's first `length` positions in host RAM: its arrays [n_layer, n_kv, length, ...] as on the
    GPU."""

    def __init__(
        self,
        ledger: Ledger,
        shape: tuple[int, int, int],
        max_len: int,
        length: int,
        kind: KVType,
        arrays: dict[str, Any],
    ) -> None:
        self.ledger, self.shape, self.max_len, self.length = ledger, shape, max_len, length
        self.kind, self.arrays = kind, arrays

    def truncate(self, n: int) -> None:
        self.length = min(self.length, n)

    def copy(self) -> GpuKV:
        return _filled(self.ledger, self.shape, self.max_len, self.length, self.kind, self.arrays)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def _filled(
    ledger: Ledger,
    shape: tuple[int, int, int],
    max_len: int,
    length: int,
    kind: KVType,
    arrays: dict[str, Any],
) -> GpuKV:
    """A new GpuKV holding the first `length` positions of the arrays (device or host)."""
    out = GpuKV(ledger, *shape, max_len, kind)
    if length:
        cp = cupy_module()
        out.reserve(length)
        for name, a in arrays.items():
            getattr(out, name)[:, :, :length] = cp.asarray(
                a[:, :, :length]
            )  # asarray: a no-op for device arrays
        out.length = length
    return out

"""A sequence's attention KV cache in VRAM: K and V [n_layer, n_kv, cap, head_dim] fp16, or (`--kv-type int8`)
int8 codes with float32 scales [n_layer, n_kv, cap, head_dim / 32], strata.runtime.kvcache's cells.

It stands in for strata.runtime.kvcache.KVCache inside a SequenceState (copy, truncate, nbytes), so the
scheduler's prefix cache and checkpoints work unchanged. Capacity doubles as the sequence grows;
growing happens between steps on the host side, never inside a captured graph, and kernels find
the buffers through a per-row table (`table_row`), so a grown cache needs no new graph.

With a window (`--kv-resident`, strata/tiers/kvwindow.py) the device arrays hold cells [base, length) and
pinned host arrays [n_layer, n_kv, hcap, ...] every older one; `reserve` moves whole blocks there before a
pass (a strided copy per array, then the window's rows move down). The table's k and v addresses are the
window's minus `base` cells, so kernels address a cell at or past `base` as without a window; the cold
columns (`cold_cols`) give the host's cells, which decode reads in place (zero-copy) and a prefill chunk of
more than STAGE_ROWS rows reads from a device copy in the plan's StageRoom (every query block would read
them again over PCIe otherwise): flash through its arguments, QSA's attend through the pass's table rows
(`staged_cold_cols`). `layout` counts address changes, for tables kept on the device between steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.gpu.pinned import snapshot_pool, to_pinned
from strata.gpu.runtime import cupy_module
from strata.runtime.kvcache import KVCache, KVType, dequantize_rows, group_of
from strata.tiers.budget import Ledger, VramBudgetError
from strata.tiers.kvwindow import KVWindow

MIN_CAP = 256
MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction from the addresses (unified addressing)
STAGE_ROWS = 64  # a pass of more rows (past one 4-warp flash block) reads the cold cells from a staged copy
COLD_COL = 10  # the table's first of the six cold columns (kernels/cells.py COLD)
HOST_MOVE_BYTES = 256 << 20  # a growing KV's old cells of at least this many bytes wait in host RAM


class StageRoom:
    """The VRAM the plan keeps for one layer's cells before the window (plan.kv_stage_bytes): a pass of more
    than STAGE_ROWS rows copies them here, and its flash (or QSA's attend) reads them from VRAM. One buffer
    serves every sequence: passes run one at a time on one stream, so a layer's copy is queued after the
    attention that read the layer before. Taken from the pool at start, as the plan counts it: VRAM stays
    where it was when a context first outgrows the window (the flagship's 252 MiB came in at 131k while it
    was taken lazily)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._buf: Any = cupy_module().empty(nbytes, np.uint8) if nbytes else None

    def carve(self, sizes: list[int]) -> list[int] | None:
        """Device addresses of consecutive pieces of these sizes (each 256-byte aligned), or None when they
        do not fit the room."""
        aligned = [-(-n // 256) * 256 for n in sizes]
        if sum(aligned) > self.nbytes:
            return None
        base = int(self._buf.data.ptr)
        return [base + sum(aligned[:i]) for i in range(len(aligned))]


class GpuKV:
    def __init__(
        self,
        ledger: Ledger,
        n_layer: int,
        n_kv: int,
        head_dim: int,
        max_len: int,
        kind: KVType = KVType.F16,
        window: KVWindow | None = None,
        stage: StageRoom | None = None,
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
        self.window, self.stage = window, stage
        self.hcap = 0  # host cells a (layer, kv head), with a window
        self.host_cells: dict[str, np.ndarray] = {}  # pinned, as the device arrays: the cells before `base`
        self.layout = 0  # bumped whenever an address or the base a table row holds changes

    @property
    def q8(self) -> bool:
        return self.kind is KVType.INT8

    @property
    def base(self) -> int:
        return self.window.base if self.window is not None else 0

    def _bytes(self, cap: int) -> int:
        n_layer, n_kv, hd = self.shape
        return cap * KVCache.bytes_per_token(self.kind, n_layer, n_kv, hd)

    def _arrays(self) -> list[str]:
        return ["k", "v", "ks", "vs"] if self.q8 else ["k", "v"]

    def _width(self, name: str) -> tuple[int, Any]:
        """Elements a cell of array `name` holds, and their dtype."""
        hd = self.shape[2]
        if name.endswith("s"):
            return hd // group_of(hd), np.float32
        return hd, np.int8 if self.q8 else np.float16

    def reserve(self, n: int) -> None:
        """Make room for n positions (keeping the first `length`); with a window, the cells past it go to the
        host first."""
        if self.window is not None:
            ev = self.window.before_pass(self.length, max(0, n - self.length))
            if ev is not None:
                self._evict(ev.lo, ev.hi, ev.kept)
        self._device_room(n - self.base)

    def _device_room(self, need: int) -> None:
        """Device rows for `need` cells, keeping the first length - base."""
        if need <= self.cap:
            return
        limit = self.window.device_cells if self.window is not None else self.max_len
        cap = min(max(MIN_CAP, 2 * self.cap, need), max(need, limit))
        cp = cupy_module()
        old, new = self._bytes(self.cap), self._bytes(cap)
        self.ledger.take(new - old, f"KV cache for {cap} positions")
        # a move on the device holds the old cells beside the new: when the budget has no room for both (a
        # long context, whose KV the plan holds once), or the old are big, they wait in host RAM instead (2
        # PCIe copies, once a doubling: ~70 ms for 1.8 GB). Big, because the pool's free room may lie in
        # pieces it cannot join: the 80B's f16 KV growing to 64k asked for 768 MiB beside its old cells and
        # found no piece, though the ledger had room
        kept, rows = {}, self.length - self.base
        pool = cp.get_default_memory_pool()
        pool_limit = pool.get_limit()
        # the pool's own count decides too: what it holds beyond the ledger (workspaces, graphs' buffers) can
        # leave no room for the old cells beside the new where the ledger saw some
        beside = not pool_limit or pool.used_bytes() + new <= pool_limit
        via_host = rows > 0 and (old >= HOST_MOVE_BYTES or not self.ledger.fits(old) or not beside)
        n_layer, n_kv, _ = self.shape
        for name in self._arrays():
            # only `kept` may hold an old array past the loop: a stray name kept its block in use. The moves
            # through host RAM are strided copies, which take no device temporary: a slice's .get() or
            # asarray would hold a contiguous copy of the old cells (0.8 GB at 131k) in the pool
            if rows and via_host:
                kept[name] = self._rows_to_host(getattr(self, name), rows)
            elif rows:
                kept[name] = getattr(self, name)[:, :, :rows]
            if via_host or not rows:
                setattr(self, name, None)
        # cupy's pool counts the blocks it caches against its limit (the budget) and gives them back to the
        # driver only when cudaMalloc fails, never when the limit is reached: old cells' blocks, cached, left
        # no room for new ones (the 80B's int8 KV growing to 256k at 24 GiB asked for 1.5 GiB of K codes
        # beside 0.8 GiB of old cells the pool kept). So where the new cells would pass the limit, the cached
        # blocks go back to the driver first
        if pool_limit and pool.total_bytes() + new > pool_limit:
            pool.free_all_blocks()
        for name in self._arrays():
            width, dtype = self._width(name)
            try:
                grown = cp.empty((n_layer, n_kv, cap, width), dtype)
            except cp.cuda.memory.OutOfMemoryError as e:  # what the pool held against what the plan counted
                raise VramBudgetError(
                    f"KV cache for {cap} positions: no room for {name} ({e}); the pool holds "
                    f"{pool.used_bytes() / 2**20:,.0f} MiB in use and {pool.total_bytes() / 2**20:,.0f} MiB "
                    f"in all under its limit of {pool_limit / 2**20:,.0f} MiB; the plan counts "
                    f"{self.ledger.used / 2**20:,.0f} MiB; the old cells "
                    f"({old / 2**20:,.0f} MiB) {'wait in host RAM' if via_host else 'stay beside'}"
                ) from e
            if via_host:
                cell = grown.strides[2]
                self._copy2d(grown.data.ptr, cap * cell, kept[name].ctypes.data, rows * cell, rows * cell)
            elif name in kept:
                grown[:, :, :rows] = kept[name]
            setattr(self, name, grown)
        self.cap = cap
        self.layout += 1

    def _rows_to_host(self, dev: Any, rows: int) -> np.ndarray:
        """The first `rows` cells of device array `dev` in host RAM, by one strided copy (a method, so that no
        name outlives the move to keep `dev`'s block in use)."""
        n_layer, n_kv, _ = self.shape
        cell = dev.strides[2]
        host = np.empty((n_layer, n_kv, rows, cell // dev.itemsize), dev.dtype)
        self._copy2d(host.ctypes.data, rows * cell, dev.data.ptr, self.cap * cell, rows * cell)
        return host

    # ---- the window (--kv-resident) ----
    def _copy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, rows: int = 0) -> None:
        """width bytes of each of `rows` rows (default: every (layer, kv head)), on the current stream."""
        cp = cupy_module()
        rows = rows or self.shape[0] * self.shape[1]
        stream = cp.cuda.get_current_stream().ptr
        cp.cuda.runtime.memcpy2DAsync(dst, dpitch, src, spitch, width, rows, MEMCPY_DEFAULT, stream)

    def _host_room(self, n: int, keep: int) -> None:
        """Host rows for n cells, keeping the first `keep` (a doubling waits for the copies in flight)."""
        if n <= self.hcap:
            return
        import cupyx

        hcap = min(max(2 * self.hcap, n, MIN_CAP), max(n, self.max_len))
        cupy_module().cuda.get_current_stream().synchronize()  # in-flight copies write the old arrays
        n_layer, n_kv, _ = self.shape
        for name in self._arrays():
            width, dtype = self._width(name)
            grown = cupyx.empty_pinned((n_layer, n_kv, hcap, width), dtype)
            if name in self.host_cells:
                grown[:, :, :keep] = self.host_cells[name][:, :, :keep]
            self.host_cells[name] = grown
        self.hcap = hcap

    def _evict(self, lo: int, hi: int, kept: int) -> None:
        """Cells [lo, hi) (device rows [0, hi - lo)) to the host; the window's other `kept` rows move down."""
        m = hi - lo
        self._host_room(hi, lo)
        for name in self._arrays():
            dev, host = getattr(self, name), self.host_cells[name]
            cell = dev.strides[2]  # bytes a cell
            self._copy2d(
                host.ctypes.data + lo * cell, self.hcap * cell, dev.data.ptr, self.cap * cell, m * cell
            )
            for start in range(0, kept, m):  # pieces no longer than m: source and destination never overlap
                piece = min(m, kept - start)
                src, dst = dev.data.ptr + (m + start) * cell, dev.data.ptr + start * cell
                self._copy2d(dst, self.cap * cell, src, self.cap * cell, piece * cell)
        self.layout += 1

    def _reload(self, lo: int, hi: int) -> None:
        """A rollback's window: cells [lo, hi) back from the host to device rows [0, hi - lo)."""
        for name in self._arrays():
            dev, host = getattr(self, name), self.host_cells[name]
            cell = dev.strides[2]
            src = host.ctypes.data + lo * cell
            self._copy2d(dev.data.ptr, self.cap * cell, src, self.hcap * cell, (hi - lo) * cell)

    # ---- what the kernels read ----
    def _virtual(self, a: Any) -> int:
        """The address of cell 0 as kernels compute cells: the window's minus `base` cells."""
        return int(a.data.ptr) - self.base * int(a.strides[2])

    def table_row(self, pos: int) -> list[int]:
        """(k address, v address, capacity, position) as the kernels read it."""
        return [self._virtual(self.k), self._virtual(self.v), self.cap, pos]

    def scale_cols(self) -> list[int]:
        """The table's columns 7 and 8: the int8 cells' scale addresses (0 for fp16 cells)."""
        return [self._virtual(self.ks), self._virtual(self.vs)] if self.q8 else [0, 0]

    def cold_cols(self) -> list[int]:
        """The table's columns 10-15 (kernels/cells.py COLD): the host cells' k, v, k scale and v scale
        addresses, their cells a kv head, and `base` (all 0 without cells on the host)."""
        if not self.base:
            return [0] * 6
        h = self.host_cells
        scales = [h["ks"].ctypes.data, h["vs"].ctypes.data] if self.q8 else [0, 0]
        return [h["k"].ctypes.data, h["v"].ctypes.data, *scales, self.hcap, self.base]

    def flash_args(
        self, layer: int, rows: int = 0
    ) -> tuple[int, int, int, tuple[int, int, int] | None, tuple[int, int, int, int, int, int] | None]:
        """The flash kernel's view of one layer: k and v addresses, elements a kv head, the int8 scales', and
        the cells before the window (for a pass of `rows` rows: staged on the device past STAGE_ROWS)."""
        _n_layer, n_kv, hd = self.shape
        es = 1 if self.q8 else 2
        off = layer * n_kv * self.cap * hd * es
        scales = None
        if self.q8:
            ng = hd // group_of(hd)
            soff = layer * n_kv * self.cap * ng * 4
            scales = (self._virtual(self.ks) + soff, self._virtual(self.vs) + soff, self.cap * ng)
        cold = self._cold_layer(layer, rows) if self.base else None
        return self._virtual(self.k) + off, self._virtual(self.v) + off, self.cap * hd, scales, cold

    def _cold_layer(self, layer: int, rows: int) -> tuple[int, int, int, int, int, int]:
        """(k, v, cells a kv head, k scales, v scales, base) of one layer's cells before the window: the
        host's, or for a long pass their copy in the StageRoom (the host's when it cannot hold them)."""
        room = self._staged(layer, rows)
        if room is not None:
            ks, vs = (room[2], room[3]) if self.q8 else (0, 0)
            return room[0], room[1], self.base, ks, vs, self.base
        cells = self.host_cells
        h = {n: cells[n].ctypes.data + layer * cells[n].strides[0] for n in self._arrays()}
        return h["k"], h["v"], self.hcap, h.get("ks", 0), h.get("vs", 0), self.base

    def staged_cold_cols(self, layer: int, rows: int) -> list[int] | None:
        """cold_cols for the kernels that find cells through the table (QSA's attend) in one layer of a pass
        of `rows` rows: its cells before the window copied to the StageRoom, the addresses less the layers
        below, as the kernels add layer * n_kv * cells; None where the table's own (the host's) stand."""
        room = self._staged(layer, rows)
        if room is None:
            return None
        b, n_kv = self.base, self.shape[1]
        addrs = [a - layer * n_kv * b * self.host_cells[n].strides[2] for a, n in zip(room, self._arrays())]
        return [*addrs[:2], *(addrs[2:] if self.q8 else [0, 0]), b, b]

    def _staged(self, layer: int, rows: int) -> list[int] | None:
        """A pass of more than STAGE_ROWS rows: the layer's cells before the window copied to the StageRoom
        on the current stream, [n_kv, base] each array; their addresses, or None (a short pass, no cold
        cells, or no room for them)."""
        if not self.base or rows <= STAGE_ROWS or self.stage is None:
            return None
        names, b = self._arrays(), self.base
        room = self.stage.carve([self.shape[1] * b * self.host_cells[n].strides[2] for n in names])
        if room is None:
            return None
        for name, dst in zip(names, room):
            host = self.host_cells[name]
            cell = host.strides[2]
            src = host.ctypes.data + layer * host.strides[0]
            self._copy2d(dst, b * cell, src, self.hcap * cell, b * cell, self.shape[1])
        return room

    def truncate(self, n: int) -> None:
        if self.window is not None:
            was = self.base
            back = self.window.truncate(n)
            if back is not None:
                self._reload(back.lo, back.hi)
            if self.base != was:
                self.layout += 1
        self.length = min(self.length, n)

    def copy(self) -> GpuKV:
        if self.window is not None:  # cells on both sides: through one logical copy on the host
            return self.to_host().copy()
        return _filled(
            self.ledger,
            self.shape,
            self.max_len,
            self.length,
            self.kind,
            {a: getattr(self, a) for a in self._arrays()},
            None,
            self.stage,
        )

    def nbytes(self) -> int:
        return self._bytes(self.cap)

    def host_nbytes(self) -> int:
        """Pinned RAM of the window's host cells."""
        return sum(a.nbytes for a in self.host_cells.values())

    def _logical(self, name: str, length: int | None = None) -> np.ndarray:
        """Array `name`'s first `length` cells (default: all) [n_layer, n_kv, length, ...], from both sides,
        pinned."""
        length = self.length if length is None else length
        dev = getattr(self, name)
        b, rows = min(self.base, length), length - min(self.base, length)
        if not b:
            return to_pinned(dev[:, :, :length])
        out = snapshot_pool().empty((*dev.shape[:2], length, dev.shape[3]), dev.dtype)
        cupy_module().cuda.get_current_stream().synchronize()  # the host cells' copies in flight
        out[:, :, :b] = self.host_cells[name][:, :, :b]
        if rows:
            out[:, :, b:] = to_pinned(dev[:, :, :rows])
        return out

    def to_host(self, length: int | None = None) -> HostKV:
        """A copy in host RAM of the first `length` positions (default: all) (the prefix cache keeps these,
        not VRAM); its copy() comes back to the GPU."""
        length = self.length if length is None else min(length, self.length)
        arrays = {a: self._logical(a, length) for a in self._arrays()} if length else {}
        window = None if self.window is None else (self.window.resident, self.window.chunk)
        return HostKV(self.ledger, self.shape, self.max_len, length, self.kind, arrays, window, self.stage)

    def host(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of one layer as float32 [length, n_kv, hd], decoded (tests and debugging)."""
        out = []
        for name in ("k", "v"):
            cells = self._logical(name)[layer].transpose(1, 0, 2)
            if self.q8:
                scales = self._logical(name + "s")[layer].transpose(1, 0, 2)
                out.append(dequantize_rows(cells, scales))
            else:
                out.append(cells.astype(np.float32))
        return out[0], out[1]

    def __del__(self) -> None:
        if self.cap:
            self.ledger.give(self._bytes(self.cap))


class HostKV:
    """A GpuKV's first `length` positions in host RAM: its arrays [n_layer, n_kv, length, ...] as on the
    GPU, every cell in order whatever side it was on; `window` (resident, chunk) rebuilds one."""

    def __init__(
        self,
        ledger: Ledger,
        shape: tuple[int, int, int],
        max_len: int,
        length: int,
        kind: KVType,
        arrays: dict[str, Any],
        window: tuple[int, int] | None = None,
        stage: StageRoom | None = None,
    ) -> None:
        self.ledger, self.shape, self.max_len, self.length = ledger, shape, max_len, length
        self.kind, self.arrays, self.window, self.stage = kind, arrays, window, stage

    def truncate(self, n: int) -> None:
        self.length = min(self.length, n)

    def copy(self) -> GpuKV:
        return _filled(
            self.ledger,
            self.shape,
            self.max_len,
            self.length,
            self.kind,
            self.arrays,
            self.window,
            self.stage,
        )

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def _filled(
    ledger: Ledger,
    shape: tuple[int, int, int],
    max_len: int,
    length: int,
    kind: KVType,
    arrays: dict[str, Any],
    window: tuple[int, int] | None,
    stage: StageRoom | None,
) -> GpuKV:
    """A new GpuKV holding the first `length` positions of the arrays (device or host, every cell in order);
    with a window, its cells split as a rollback to `length` would leave them."""
    win = None if window is None else KVWindow(*window)
    out = GpuKV(ledger, *shape, max_len, kind, win, stage)
    if not length:
        return out
    cp = cupy_module()
    base = 0
    if win is not None:  # the cells split as a rollback to `length` would leave them
        win.base = base = win.base_for(length)
        if base:
            out._host_room(base, 0)
            for name, a in arrays.items():
                out.host_cells[name][:, :, :base] = np.asarray(a[:, :, :base])
    out.length = base  # the device holds none of its cells yet
    out._device_room(length - base)
    for name, a in arrays.items():
        getattr(out, name)[:, :, : length - base] = cp.asarray(
            a[:, :, base:length]
        )  # asarray: no-op on the device
    out.length = length
    out.layout += 1
    # made on the current stream, used on the model's non-blocking one: finish here, as every other state part
    # does (a pass right after a restore would grow the KV from, or attend to, cells still being copied)
    cp.cuda.get_current_stream().synchronize()
    return out

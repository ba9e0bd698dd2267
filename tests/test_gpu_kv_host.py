"""strata/gpu/kv.py's --kv-resident bookkeeping in CI, over tests/fake_cupy.py (host memory for VRAM).

The kernels are not run; this test plays their part: it writes each pass's cells where the table row says (the
k and v addresses are the window's minus `base` cells) and reads every cell back as kernels/cells.py's
`Cells` does (before `base` from the cold columns' host cells, else from the device), and as flash_attn reads
them from `flash_args` (the host's cells in place for short passes, a staged copy for long ones) and QSA's
attend from `staged_cold_cols` in a long pass's table. Through evictions, a rollback behind the base and host
copies, every cell must read what was written.
"""

from __future__ import annotations

import ctypes

import fake_cupy
import numpy as np
import pytest

from strata.runtime.kvcache import KVType, group_of
from strata.tiers.budget import Ledger
from strata.tiers.kvwindow import BLOCK, KVWindow

N_LAYER, N_KV, HD = 2, 2, 32


def _cell_bytes(kind: KVType) -> tuple[int, int]:
    """(bytes of a cell's codes, of its scales)."""
    return (HD, 4 * (HD // group_of(HD))) if kind is KVType.INT8 else (2 * HD, 0)


def _write(kv, pos: int, cells: dict[str, np.ndarray]) -> None:
    """What qkv_post does: cell (layer, head, pos) at tr[0] + ((layer * KV + head) * cap + pos) * bytes."""
    row = kv.table_row(pos) + [0, 0, 0] + kv.scale_cols()  # columns 0-3, then 7-8 at 7, 8
    cb, sb = _cell_bytes(kv.kind)
    for li in range(N_LAYER):
        for h in range(N_KV):
            cell = (li * N_KV + h) * row[2] + pos
            for col, name in ((0, "k"), (1, "v")):
                src = np.ascontiguousarray(cells[name][li, h])
                ctypes.memmove(row[col] + cell * cb, src.ctypes.data, cb)
                if sb:
                    s = np.ascontiguousarray(cells[name + "s"][li, h])
                    ctypes.memmove(row[7 + col] + cell * sb, s.ctypes.data, sb)


def _read_cells(kv, j: int, cold: list[int] | None = None, layers=range(N_LAYER)) -> dict[str, np.ndarray]:
    """What `Cells` reads for key j of every (layer, head): the host's before base, else the device's; with
    `cold`, the table's cold columns as a long pass's QSA layer has them (staged_cold_cols, these layers)."""
    row = kv.table_row(0) + [0, 0, 0] + kv.scale_cols() + [0] + (kv.cold_cols() if cold is None else cold)
    hk, hv, hks, hvs, hcap, base = row[10:16]
    cb, sb = _cell_bytes(kv.kind)
    out: dict[str, np.ndarray] = {}
    for name, col, hcol, scol, hscol in (("k", 0, hk, 7, hks), ("v", 1, hv, 8, hvs)):
        codes = np.zeros((N_LAYER, N_KV, cb), np.uint8)
        scales = np.zeros((N_LAYER, N_KV, max(sb, 1)), np.uint8)
        for li in layers:
            for h in range(N_KV):
                head = li * N_KV + h
                if j < base:
                    a, s = hcol + (head * hcap + j) * cb, hscol + (head * hcap + j) * sb
                else:
                    a, s = row[col] + (head * row[2] + j) * cb, row[scol] + (head * row[2] + j) * sb
                ctypes.memmove(codes[li, h].ctypes.data, a, cb)
                if sb:
                    ctypes.memmove(scales[li, h].ctypes.data, s, sb)
        out[name] = codes
        if sb:
            out[name + "s"] = scales
    return out


def _flash_reads(kv, layer: int, rows: int, j: int) -> np.ndarray:
    """K codes of key j (kv head 0 and 1) as flash_attn reads them from flash_args(layer, rows)."""
    k, _v, head_stride, _scales, cold = kv.flash_args(layer, rows)
    cb, _ = _cell_bytes(kv.kind)
    es = cb // HD
    out = np.zeros((N_KV, cb), np.uint8)
    for h in range(N_KV):
        if cold is not None and j < cold[5]:
            a = cold[0] + (h * cold[2] + j) * cb
        else:
            a = k + (h * head_stride + j * HD) * es
        ctypes.memmove(out[h].ctypes.data, a, cb)
    return out


def _random_cells(rng: np.random.Generator, kind: KVType) -> dict[str, np.ndarray]:
    cb, sb = _cell_bytes(kind)
    out = {n: rng.integers(0, 256, (N_LAYER, N_KV, cb), dtype=np.uint8) for n in ("k", "v")}
    if sb:
        out.update({n: rng.integers(0, 256, (N_LAYER, N_KV, sb), dtype=np.uint8) for n in ("ks", "vs")})
    return out


@pytest.mark.parametrize("kind", [KVType.F16, KVType.INT8])
def test_every_cell_reads_what_was_written(monkeypatch, kind):
    from strata.gpu.kv import STAGE_ROWS, GpuKV, StageRoom

    fake_cupy.install(monkeypatch)
    rng = np.random.default_rng(0)
    ledger = Ledger(1 << 30, 0)
    kv = GpuKV(ledger, N_LAYER, N_KV, HD, 4096, kind, KVWindow(BLOCK, 128), StageRoom(1 << 24))
    written: list[dict[str, np.ndarray]] = []
    layouts = set()
    for k, rows in enumerate([100, 128, 128, 1, 1, 120, *([1] * 30), 128, 128, 2, 128, 128, 128, 128]):
        n = kv.length
        kv.reserve(n + rows)
        layouts.add(kv.layout)
        for p in range(n, n + rows):
            cells = _random_cells(rng, kind)
            if p < len(written):
                written[p] = cells
            else:
                written.append(cells)
            _write(kv, p, cells)
        kv.length = n + rows
        assert kv.cap <= kv.window.device_cells and kv.length - kv.base <= kv.window.device_cells
        for j in range(kv.length):
            got = _read_cells(kv, j)
            for name, want in written[j].items():
                assert np.array_equal(got[name], want), f"pass {k}: cell {j} {name} (base {kv.base})"
        for rows_ in (1, STAGE_ROWS + 1):  # in place, and staged
            cold = kv.flash_args(1, rows_)[4]
            if cold is not None:  # a staged copy holds just the base's cells a kv head; the host, hcap
                assert cold[2] == (kv.base if rows_ > STAGE_ROWS else kv.hcap)
            staged = kv.staged_cold_cols(1, rows_)  # QSA's view: the same copy, through the table
            assert (staged is not None) == (rows_ > STAGE_ROWS and kv.base > 0)
            for j in (0, kv.base - 1, kv.base, kv.length - 1):
                if 0 <= j < kv.length:
                    assert np.array_equal(_flash_reads(kv, 1, rows_, j), written[j]["k"][1]), (k, rows_, j)
                    if staged is not None:
                        got = _read_cells(kv, j, staged, layers=[1])
                        for name, want in written[j].items():
                            assert np.array_equal(got[name][1], want[1]), (k, j, name, "staged table")
        if k == 37:  # a rollback behind the base: the window's cells come back from the host
            assert kv.base > 0
            back = kv.base - 5
            kv.truncate(back)
            del written[back:]
            assert kv.base <= back
    assert kv.base >= BLOCK and len(layouts) > 3
    kv.stage = StageRoom(0)  # no room: a long pass reads the host's cells in place
    assert kv.flash_args(1, STAGE_ROWS + 1)[4][2] == kv.hcap
    assert kv.staged_cold_cols(1, STAGE_ROWS + 1) is None  # and QSA the table's own columns
    assert np.array_equal(_flash_reads(kv, 1, STAGE_ROWS + 1, 0), written[0]["k"][1])
    copy = kv.copy()  # through one host copy of every cell, and back
    assert copy.window.device_cells == kv.window.device_cells
    for j in range(kv.length):
        got, want = _read_cells(copy, j), _read_cells(kv, j)
        assert all(np.array_equal(got[n], want[n]) for n in want), j
    used = ledger.used
    del copy
    assert ledger.used < used, "a copy's device cells go back to the ledger"


@pytest.mark.parametrize("big", [False, True], ids=["device-move", "via-host"])
def test_growing_keeps_every_cell(monkeypatch, big):
    """Capacity doublings without a window keep every cell, whether the old cells move on the device or, past
    HOST_MOVE_BYTES (or beyond the ledger), wait in host RAM."""
    import strata.gpu.kv as kvmod
    from strata.gpu.kv import GpuKV

    fake_cupy.install(monkeypatch)
    if big:
        monkeypatch.setattr(kvmod, "HOST_MOVE_BYTES", 1)
    rng = np.random.default_rng(1)
    kv = GpuKV(Ledger(1 << 30, 0), N_LAYER, N_KV, HD, 4096, KVType.INT8)
    written = []
    for rows in (100, 300, 700, 1):
        n = kv.length
        kv.reserve(n + rows)
        for p in range(n, n + rows):
            written.append(_random_cells(rng, KVType.INT8))
            _write(kv, p, written[p])
        kv.length = n + rows
    assert kv.cap >= kv.length and kv.cap > 256
    for j in (0, 99, 100, 399, 400, kv.length - 1):
        got = _read_cells(kv, j)
        assert all(np.array_equal(got[name], want) for name, want in written[j].items()), j

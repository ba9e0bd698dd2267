"""QSA's kernels alone on the GPU, at the flagship's shape, against the context: what each costs a decode row
and a prefill chunk as the blocks grow, and what reading the selected keys from host RAM adds (--kv-resident).
Not a test: prints a table (the median of --reps runs of each, CUDA events) and writes it as JSON.

    python perf/bench_qsa.py [--contexts 4096,32768,131072,262144] [--rows 1,4096] [--json OUT.json]

For each context (positions; blocks = context / ratio) and row count: `select` (qsa_score, or for a prefill
chunk qsa_score_tiled and beside it qsa_score, + qsa_pick, which scan every complete block of each row),
`attend` over the selected keys with the cells in VRAM, and `attend` with every cell before the last 32k in
pinned host RAM read in place (the cold columns, as a long context's decode reads them). Rows sit at the
context's last positions, as decode and a prefill chunk at the end do. Random compressed keys and cells: the
selection's cost does not depend on the scores (every complete block is scanned and ranked), nor the
attention's on the values.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from strata.bench.gpu_profile import timed_ms
from strata.bench.report import args_config, run_meta, write_json

TAB = 17  # the row stride the QSA kernels take (layers.TAB's 16 and one spare)
RESIDENT = 32768  # cells kept in VRAM for the cold rows (the flagship's --kv-resident)


def _case(
    ops: Any, cp: Any, a: argparse.Namespace, cache: dict[str, Any], ctx: int, n: int
) -> dict[str, Any]:
    """The three timings of one context and row count; cache: the context's record, cells and host copies."""
    from strata.gpu.kernels import attention
    from strata.gpu.kernels import qsa as qk
    from strata.gpu.ops import GEMV_ROWS, Ops
    from strata.gpu.qwen4exp import SELECT_ROWS

    rng = np.random.default_rng(n)
    hi, d, ratio, top = a.idx_heads, a.idx_dim, a.ratio, a.budget // a.ratio
    h, kv, hd = a.heads, a.kv_heads, a.head_dim
    max_blocks, stride, cap = cache["max_blocks"], cache["stride"], cache["cap"]
    base = max(0, ctx - RESIDENT)
    dev = [cache[x].data.ptr for x in ("k", "v")]
    scales = [cache[x].data.ptr for x in ("ks", "vs")]
    cold = [cache["host_" + x].ctypes.data for x in ("k", "v", "ks", "vs")] + [cap, base]

    def table(with_cold: bool) -> Any:
        rows = []
        for p in range(ctx - n, ctx):
            row = [*dev, cap, p, 0, 0, 0, *scales, 0, *(cold if with_cold else [0] * 6), 0]
            row[qk.QSA_COL] = cache["rec"].data.ptr
            rows.append(row)
        return cp.asarray(np.array(rows, np.int64))

    tab, tab_cold = table(False), table(True)
    iq = cp.asarray(rng.standard_normal((n, hi * d), dtype=np.float32))
    q = cp.asarray(rng.standard_normal((n, h * hd), dtype=np.float32))
    sel, nsel = cp.empty((n, top), cp.int32), cp.empty(n, cp.int32)
    # the model's scratch: score rows as long as its longest context's (a shorter pass fits more rows in it)
    scratch = cp.empty(Ops.qsa_scratch(min(n, SELECT_ROWS), max(a.contexts) // ratio), cp.float32)
    att = cp.empty((n, h * hd), cp.float32)
    part = cp.empty((n, h, attention.SPLITS, hd + 2), cp.float32) if n <= GEMV_ROWS else None
    scale = 1 / np.sqrt(hd)

    def select(seen: int | None) -> Any:
        return lambda: ops.qsa_select(iq, n, tab, TAB, 0, stride, hi, d, ratio, top, sel, nsel, scratch, seen)

    def attend(t: Any) -> Any:
        return lambda: ops.qsa_attend(
            q, t, TAB, 0, n, h, kv, hd, scale, sel, nsel, top, ratio, att, True, part
        )

    row: dict[str, Any] = {"context": ctx, "rows": n, "blocks": max_blocks, "cold_cells": base}
    # as the model calls it: a prefill pass tells its bound (qsa_score_tiled), decode rows do not
    row["select_ms"] = timed_ms(cp, select(ctx // ratio if n > GEMV_ROWS else None), a.reps)
    row["select_untiled_ms"] = timed_ms(cp, select(None), a.reps) if n > GEMV_ROWS else None
    row["attend_ms"] = timed_ms(cp, attend(tab), a.reps)
    row["attend_cold_ms"] = timed_ms(cp, attend(tab_cold), a.reps) if base else None
    return row


def _cells(cp: Any, a: argparse.Namespace, ctx: int) -> dict[str, Any]:
    """A context's random QSA record (layer 0) and int8 cells, in VRAM and as pinned host copies."""
    import cupyx

    from strata.gpu.kernels import qsa as qk
    from strata.runtime.kvcache import group_of

    rng = np.random.default_rng(ctx)
    kv, hd = a.kv_heads, a.head_dim
    max_blocks = -(-ctx // a.ratio)
    stride = qk.qsa_stride(max_blocks, a.ratio, a.idx_dim)
    cap, ng = ctx + 8, hd // group_of(hd)
    out: dict[str, Any] = {"max_blocks": max_blocks, "stride": stride, "cap": cap}
    out["rec"] = cp.asarray(rng.standard_normal(stride, dtype=np.float32))
    out["k"] = cp.asarray(rng.integers(-127, 128, (1, kv, cap, hd), dtype=np.int8))
    out["v"] = cp.asarray(rng.integers(-127, 128, (1, kv, cap, hd), dtype=np.int8))
    out["ks"] = cp.asarray(rng.uniform(0.001, 0.01, (1, kv, cap, ng)).astype(np.float32))
    out["vs"] = cp.asarray(rng.uniform(0.001, 0.01, (1, kv, cap, ng)).astype(np.float32))
    for x in ("k", "v", "ks", "vs"):
        out["host_" + x] = cupyx.empty_pinned(out[x].shape, out[x].dtype)
        out[x].get(out=out["host_" + x])
    return out


def run(a: argparse.Namespace) -> list[dict[str, Any]]:
    import cupy as cp

    from strata.gpu.ops import Ops

    ops = Ops()
    rows = []
    for ctx in a.contexts:
        cache = _cells(cp, a, ctx)
        for n in a.rows:
            row = _case(ops, cp, a, cache, ctx, n)
            rows.append(row)
            cold = "-" if row["attend_cold_ms"] is None else f"{row['attend_cold_ms']:.3f}"
            untiled = row["select_untiled_ms"]
            was = "" if untiled is None else f" ({untiled:.3f} untiled)"
            print(
                f"ctx {ctx:>7,} rows {n:>5}: select {row['select_ms']:.3f} ms{was},"
                f" attend {row['attend_ms']:.3f} ms (cells in VRAM), {cold} ms (all but the last"
                f" {RESIDENT:,} on the host)",
                flush=True,
            )
        del cache
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])

    def ints(s: str) -> list[int]:
        return [int(v) for v in s.split(",")]

    ap.add_argument("--contexts", type=ints, default=[4096, 32768, 131072, 262144])
    ap.add_argument("--rows", type=ints, default=[1, 4096], help="rows a pass (1: decode; 4096: a chunk)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--heads", type=int, default=16, help="attention heads (the flagship's)")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--idx-heads", type=int, default=16, help="indexer heads")
    ap.add_argument("--idx-dim", type=int, default=128)
    ap.add_argument("--ratio", type=int, default=4, help="positions a block")
    ap.add_argument("--budget", type=int, default=1024, help="keys a query selects")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rows = run(a)
    if a.json:
        meta = run_meta(bench="bench_qsa", **args_config(a))
        write_json({"meta": meta, "rows": rows}, a.json)


if __name__ == "__main__":
    main()

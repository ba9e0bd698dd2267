"""The decode miss path alone on the GPU: how fast the int8-input expert kernels (moe_gate_up_q8 and
moe_down_q8, kernels/mmvq.py) read experts that sit in pinned host RAM, against a plain copy of the bytes.
Not a test: prints a table (median of --reps passes, CUDA events) and writes it as JSON.

    python perf/bench_misses.py [--misses 0,1,3,5,7,10] [--rows 1,4] [--json OUT.json]

A pass is --layers decode MoE layers of the 80B shape (512 experts of D 2048 x F 512, Q4_K gate, up and
down, top-10), each routed to experts no other layer of the pass uses, so nothing a layer reads is still in
L2; `m` of each row's 10 experts read from the pinned arena (zero-copy), the rest from VRAM. Per layer:
- `fused`: the decode path as it runs today, moe_q8 reading the misses in place;
- `copy`: gather_rows alone moving the misses' three parts into VRAM (the link's rate for these bytes);
- `engine`: the same bytes by cudaMemcpyAsync, one call per part (the copy engines; not usable inside the
  decode graph, whose misses are known only on the device);
- `staged`: gather_rows into staging slots, then moe_q8 reading them there.
The link's share: miss bytes / (time - the same path's time with no misses).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.bench.gpu_profile import timed_ms
from strata.bench.report import args_config, run_meta, write_json

Q4_K, BLOCK_BYTES = 12, 144  # 256 values a block


def _q4k(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    """Random Q4_K blocks with small finite scales (d, dmin = 2^-10: the kernels' speed does not depend on
    the values, but an inf would make every output nan)."""
    out = rng.integers(0, 256, nbytes, dtype=np.uint8)
    blocks = out.reshape(-1, BLOCK_BYTES)
    blocks[:, 0:4] = np.frombuffer(np.array([2**-10, 2**-10], np.float16).tobytes(), np.uint8)
    return out


PATHS = ("fused", "copy", "engine", "staged")


@dataclass
class Experts:
    """Every expert's three parts (gate and up [F, D], down [D, F], Q4_K) in pinned RAM and in VRAM, and
    staging slots for the misses of one layer."""

    e: int
    top: int
    shapes: list[tuple[int, int]]
    row_bytes: list[int]
    part_bytes: list[int]
    host: list[np.ndarray]
    dev: list[Any]
    stage: list[Any]

    def table(self, cp: Any, p: int, missed: np.ndarray, slots: int, staged: bool) -> Any:
        """Part p's addresses: the missed experts' in the arena (or their staging slot), the rest in VRAM."""
        idx = np.arange(self.e, dtype=np.int64)
        addr = int(self.dev[p].data.ptr) + idx * self.part_bytes[p]
        far = int(self.host[p].ctypes.data) + idx * self.part_bytes[p]
        if staged:
            far = int(self.stage[p].data.ptr) + idx % slots * self.part_bytes[p]
        addr[missed] = far[missed]
        return cp.asarray(addr)


def _case(ops: Any, cp: Any, ex: Experts, ids_np: list[np.ndarray], n: int, m: int, reps: int) -> dict:
    """Each path's time a layer (us) with m of each row's experts missed."""
    from strata.gpu.runtime import HOST_TO_DEVICE, launch
    from strata.gpu.slots import BLOCKS_PER_ROW
    from strata.gpu.weights import DevMatrix

    d, f, top, pb = ex.shapes[1][1], ex.shapes[0][0], ex.top, ex.part_bytes
    slots = n * top
    rng = np.random.default_rng(n)
    h = cp.asarray(rng.standard_normal((n, d)).astype(np.float32))
    x = cp.zeros((n, d), cp.float32)
    hq, hds = cp.empty(n * d, cp.int8), cp.empty(n * d // 16, cp.float32)
    aq, ads = cp.empty(n * top * f, cp.int8), cp.empty(n * top * f // 16, cp.float32)
    ops.q8_rows(h, n, d, hq, hds)
    wts = cp.full(n * top, 1.0 / top, cp.float32)
    ids = [cp.asarray(i, cp.int32) for i in ids_np]
    missed = np.nonzero(np.arange(ex.e) % top < m)[0]
    fused, staged = (
        [
            DevMatrix(
                f"p{p}", Q4_K, *ex.shapes[p], ex.e, ex.row_bytes[p], None, ex.table(cp, p, missed, slots, s)
            )
            for p in range(3)
        ]
        for s in (False, True)
    )
    copies = [  # per layer: (arena address, staging slot, bytes) of each missed part
        [
            (
                int(ex.host[p].ctypes.data) + int(k) * pb[p],
                int(ex.stage[p].data.ptr) + int(k) % slots * pb[p],
                pb[p],
            )
            for k in i[i % top < m]
            for p in range(3)
        ]
        for i in ids_np
    ]
    gathers = [cp.asarray(np.array(c, np.int64).T.copy()) if c else None for c in copies]

    def gather(g: Any) -> None:
        if g is not None:
            launch(ops.tiers["gather_rows"], (BLOCKS_PER_ROW, g.shape[1]), 256, (g[0], g[1], g[2]))

    def run(path: str) -> None:
        s = cp.cuda.get_current_stream().ptr
        for li, g in enumerate(gathers):
            if path in ("copy", "staged"):
                gather(g)
            if path == "engine":
                for src, dst, nb in copies[li]:
                    cp.cuda.runtime.memcpyAsync(dst, src, nb, HOST_TO_DEVICE, s)
            if path in ("fused", "staged"):
                ops.moe_q8(*(fused if path == "fused" else staged), ids[li], wts, top, hq, hds, n, aq, ads, x)

    return {p: 1e3 * timed_ms(cp, lambda p=p: run(p), reps) / len(ids_np) for p in PATHS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--misses", default="0,1,3,5,7,10", help="experts a row reads over PCIe, of --top-k")
    ap.add_argument("--rows", default="1,4", help="decode rows (batch sizes)")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import cupy as cp

    from strata.gpu.ops import Ops

    e, d, f, top = a.experts, a.hidden, a.ffn, a.top_k
    rows = [int(x) for x in a.rows.split(",")]
    misses = sorted({0} | {int(x) for x in a.misses.split(",")})  # 0: each path's time without the link
    ops = Ops(moe_types=[(Q4_K, Q4_K, Q4_K)])
    rng = np.random.default_rng(0)
    shapes = [(f, d), (f, d), (d, f)]
    row_bytes = [c // 256 * BLOCK_BYTES for _, c in shapes]
    part_bytes = [r * rb for (r, _), rb in zip(shapes, row_bytes)]
    pinned = [cp.cuda.alloc_pinned_memory(e * pb) for pb in part_bytes]
    host = [np.frombuffer(mem, np.uint8, e * pb) for mem, pb in zip(pinned, part_bytes)]
    for hn in host:
        hn[:] = _q4k(rng, hn.nbytes)
    dev = [cp.asarray(hn) for hn in host]
    stage = [cp.empty(max(rows) * top * pb, cp.uint8) for pb in part_bytes]
    ex = Experts(e, top, shapes, row_bytes, part_bytes, host, dev, stage)
    results = []
    for n in rows:
        # row t of layer l: the `top` experts of group (l * n + t) mod (e / top), so consecutive layers read
        # other experts (a pass wraps past e only at 4 rows, where a layer's 70 MB leave L2 nothing of it)
        groups = e // top
        ids_np = [
            np.concatenate([top * ((li * n + t) % groups) + np.arange(top) for t in range(n)])
            for li in range(a.layers)
        ]
        base: dict = {}
        for m in misses:
            us = _case(ops, cp, ex, ids_np, n, m, a.reps)
            base = base or us
            miss_bytes = n * m * sum(part_bytes)
            row: dict[str, Any] = {"rows": n, "misses": m, "miss_mb_layer": miss_bytes / 1e6}
            for p in PATHS:
                extra = us[p] - (base[p] if p in ("fused", "staged") else 0.0)  # the copies have no compute
                row[f"{p}_us"] = us[p]
                row[f"{p}_gbps"] = miss_bytes / (extra * 1e-6) / 1e9 if m and extra > 0 else None
            results.append(row)
            print(
                f"rows {n} misses {m:>2} ({row['miss_mb_layer']:5.2f} MB a layer): "
                + "  ".join(
                    f"{p} {row[p + '_us']:7.1f} us"
                    + (f" ({row[p + '_gbps']:5.1f} GB/s)" if row[p + "_gbps"] else "")
                    for p in PATHS
                ),
                flush=True,
            )
    if a.json:
        write_json(
            {
                "meta": run_meta(
                    bench="bench_misses",
                    **args_config(a),
                ),
                "rows": results,
            },
            a.json,
        )


if __name__ == "__main__":
    main()

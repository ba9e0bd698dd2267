"""A decode MoE layer's routing alone on the GPU: where router_topk's time goes. Not a test: prints a table
(median of --reps replays of a CUDA graph of --layers launches, so no Python launch gap counts) and writes it
as JSON.

    python perf/bench_router.py [--rows 1,4] [--json OUT.json]

At the 80B shape (an F32 router of 512 experts x 2048, top-10), per launch:
- `router_topk`: the decode path as it runs (norm, product, and the last block's top-k; with the int8 codes
  of h, as the experts' q8 kernels want them);
- `no_q8`: the same without writing the int8 codes;
- `matvec`: the normed product alone (gemv_split, the same split), no top-k hand-off;
- `topk`: moe_topk alone on the logits (one warp a row, as router_topk's last block);
- `floor`: gated_add on one row, the graph's cost of a launch that does next to nothing.
router_topk - matvec is what the hand-off and the top-k add; compare it with topk - floor.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from strata.bench.gpu_profile import timed_ms
from strata.bench.report import args_config, run_meta, write_json

NAMES = ("router_topk", "no_q8", "matvec", "topk", "floor")


def _graph_us(cp: Any, body: Any, layers: int, reps: int) -> float:
    """Median us a launch of body() over reps replays of a graph of `layers` launches."""
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        body()  # loads the functions outside the capture
        s.synchronize()
        s.begin_capture()
        for _ in range(layers):
            body()
        g = s.end_capture()
        return timed_ms(cp, lambda: g.launch(s), reps) * 1e3 / layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import cupy as cp

    from strata.gpu.ops import Ops
    from strata.gpu.weights import DevMatrix

    e, d, top = a.experts, a.hidden, a.top_k
    ops = Ops()
    rng = np.random.default_rng(0)
    w = cp.asarray((rng.standard_normal((e, d)) * 0.05).astype(np.float32)).view(cp.uint8).reshape(-1)
    router = DevMatrix("router", 0, e, d, 1, 4 * d, w)
    nw = cp.asarray(rng.uniform(0.5, 1.5, d).astype(np.float32))
    rows = []
    for n in (int(x) for x in a.rows.split(",")):
        x = cp.asarray(rng.standard_normal((n, d)).astype(np.float32))
        h, logits = cp.empty((n, d), cp.float32), cp.empty((n, e), cp.float32)
        ids, wts, counter = cp.empty(n * top, cp.int32), cp.empty(n * top, cp.float32), cp.zeros(1, cp.int32)
        hq, hds = cp.empty((n, d), cp.int8), cp.empty((n, d // 16), cp.float32)
        y, g = cp.zeros((n, d), cp.float32), cp.zeros((n, 1), cp.float32)

        def routed(q8: bool, x=x, h=h, logits=logits, ids=ids, wts=wts, counter=counter, hq=hq, hds=hds, n=n):
            ops.router_topk(
                router,
                x,
                n,
                logits,
                nw,
                1e-6,
                h,
                top,
                True,
                ids,
                wts,
                counter,
                hq if q8 else None,
                hds if q8 else None,
            )

        bodies = {
            "router_topk": lambda: routed(True),
            "no_q8": lambda: routed(False),
            "matvec": lambda x=x, logits=logits, h=h, n=n: ops.matvec(
                [router], x, n, logits, norm=nw, eps=1e-6, h_out=h
            ),
            "topk": lambda logits=logits, ids=ids, wts=wts, n=n: ops.topk(logits, n, e, top, True, ids, wts),
            "floor": lambda y=y, g=g: ops.gated_add(y, y, g, 1, d),
        }
        row: dict[str, Any] = {"rows": n}
        for name in NAMES:
            row[f"{name}_us"] = _graph_us(cp, bodies[name], a.layers, a.reps)
        rows.append(row)
        print(f"rows {n}: " + "  ".join(f"{k} {row[k + '_us']:6.2f} us" for k in NAMES), flush=True)
    if a.json:
        meta = run_meta(bench="bench_router", **args_config(a))
        write_json({"meta": meta, "rows": rows}, a.json)


if __name__ == "__main__":
    main()

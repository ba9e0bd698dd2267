"""How many experts one prompt's tokens route to, per MoE layer, in a GGUF (a synth file or a real one). Not a
test: prints a line a layer and a summary.

    python perf/route_spread.py MODEL.gguf [--tokens 512] [--json OUT.json]

Feeds --tokens random token ids in one pass through the CPU model (every expert resident, no routing profile,
`--record-routes`) and counts, per layer, the distinct experts picked and the share of picks the 16 most
picked take. A prefill chunk that stages only its routed misses (llama.cpp copies only the experts its
ubatch routes to) moves distinct / E of what staging every miss moves.

On the synth files, 512 random tokens, 2026-12-05 (~60 s each on 2 cores): the 30B (`strata synth
--arch qwen3moe --shape 30b-a3b --quant q4_k --router-skew 0`, 128 experts, top-8) uses all 128 experts in
layer 0, 73 in layer 1, and from layer 2 on 16-45 (median 24), the top 16 taking 94-100% of the picks: the
random model's states share one direction, so its router, uniform on N(0, I) states (strata/synth/router.py),
is not uniform on a prompt. The 80B (qwen3next, 512 experts, top-10) stays uniform: 511-512 of 512 experts in
every layer, the top 16 taking 5.4-6.6% of the picks. Since the writer's fix (strata/synth/plan.py QK_GAIN)
the 30B file routes the prompt to all 128 experts in every layer, the top 16 taking 16.8-21.7%.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from strata.bench.report import args_config, run_meta, write_json
from strata.synth.locality import measured_routes
from strata.tiers import trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--routes", type=Path, help="where the recorded trace goes (default: a new temp dir)")
    a = ap.parse_args()
    # the engine saves its recorder again at exit: the trace outlives the run (`tiers simulate` replays it)
    out = a.routes or Path(tempfile.mkdtemp(prefix="strata-routes-")) / "routes.npz"
    measured_routes(a.model, out, a.tokens, a.tokens, backend="jit")  # one pass: a prompt
    routes, n_e = trace.load(out)  # [T, L, A]
    print(f"routes: {out}")
    rows = []
    for li in range(routes.shape[1]):
        c = np.bincount(routes[:, li].ravel(), minlength=n_e)
        top = float(np.sort(c)[::-1][:16].sum() / c.sum())
        rows.append(
            {"layer": li, "distinct": int((c > 0).sum()), "max_picks": int(c.max()), "top16_share": top}
        )
        print(f"layer {li:3d}: {rows[-1]['distinct']:4d} of {n_e} experts, top 16 take {100 * top:5.1f}%")
    distinct = np.array([r["distinct"] for r in rows])
    print(
        f"{a.tokens} tokens: median {np.median(distinct):.0f} of {n_e} experts a layer "
        f"(min {distinct.min()}, max {distinct.max()}); routed / all = {distinct.mean() / n_e:.2f}"
    )
    if a.json:
        write_json({"meta": run_meta(), "config": args_config(a), "layers": rows}, a.json)


if __name__ == "__main__":
    main()

"""What the cache that learns can save on the synth locality router, as the GPU's policy bench feeds it.

    python perf/learning_ceiling.py [--prompt 512] [--decode 320] [--scored 64] [--share 0.455] [--seed 0]
        [--experts 128] [--top-k 4] [--budget 4]

Routes of a small CPU qwen3next (8 layers, --experts, top-k, `--router-mode locality`) over a random prompt
and a decode fed random tokens (bench_gpu.py --feed random: 256 warm tokens, then tg64), replayed by
`tiers.sim` with --share of the experts cached and 4-token windows (the engine learns every 4 passes), scored
on the last --scored tokens; --budget experts a window may bring in (the 80B's 64 MiB a pass is ~25 over 8
layers). Each row: hit rate and what crosses the link a token (misses + copies), against static placements:
the cache's share when nothing is learned (the GPU's static rows: its hit rate is the share), and a profile of
the trace itself up to the scored part (the best a static placement could do). If decode time is the resident
step plus the link's part, the ratio of link transfers bounds the speed-up of a learning policy over static.
CPU only, ~1 minute.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as Q
from synth_locality import TOKENIZER, recorded, shape

from strata.synth import write_synth
from strata.tiers import sim

ROWS = (("static", None, "copy"), ("lru", 0, "copy"), ("adaptive", 0, "copy"), ("adaptive", None, "copy"))
ROWS += (("adaptive", 0, "ride"), ("adaptive", None, "ride"))  # 0: --budget


def main() -> None:
    ap = argparse.ArgumentParser()
    for flag, default in (("prompt", 512), ("decode", 320), ("scored", 64), ("seed", 0), ("experts", 128)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--share", type=float, default=0.455, help="the cache's share of the experts (24 GiB)")
    ap.add_argument(
        "--budget", type=int, default=4, help="experts a 4-token window may bring in over the 8 layers"
    )
    a = ap.parse_args()
    s = shape(
        argparse.Namespace(
            arch="qwen3next", layers=8, d_model=256, head_dim=64, experts=a.experts, top_k=a.top_k
        )
    )
    root = Path(tempfile.mkdtemp(prefix="learning_ceiling_"))
    path = write_synth(root / "loc.gguf", s, Q.Q8_0, Q.Q8_0, 0.0, TOKENIZER, seed=1, router_mode="locality")
    rng = np.random.default_rng(a.seed)
    prompt, fed = rng.integers(10, 150_000, a.prompt), rng.integers(10, 150_000, a.decode)
    ids, _ = recorded(path.path, root / "routes.npz", prompt, a.decode, lambda k, _: int(fed[k]))
    n_tok, n_layer, top_k = ids.shape
    slots, picks = int(a.share * s.n_expert), n_layer * top_k
    print(f"{n_tok} tokens x {n_layer} layers x top-{top_k}, {slots} of {s.n_expert} experts cached")
    print(f"static, nothing learned: hit rate {a.share:.1%}, link/token {(1 - a.share) * picks:.2f}")
    for name, budget, admit in ROWS:
        budget = a.budget if budget == 0 else budget
        r = sim.simulate(
            ids,
            s.n_expert,
            slots,
            name,
            profile_share=(n_tok - a.scored) / n_tok,
            windows=np.full(n_tok // 4, 4),
            budget=budget,
            admit=admit,
        )
        miss = (1 - r.hit_rate) * picks
        label = "static, profile of the trace" if name == "static" else f"{name}, budget {budget}, {admit}"
        print(
            f"{label}: hit rate {r.hit_rate:.1%}, misses/token {miss:.2f}, copies/token "
            f"{r.copies / a.scored:.2f}, link/token {miss + r.copies / a.scored:.2f}"
        )


if __name__ == "__main__":
    main()

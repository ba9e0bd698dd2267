"""What the cache that learns can save on the synth locality router, as the GPU's policy bench feeds it.

    python perf/learning_ceiling.py [--prompt 512] [--decode 320] [--scored 64] [--share 0.455] [--seed 0]
        [--layers 8] [--experts 128] [--top-k 4] [--budget N]
    python perf/learning_ceiling.py --shape 80b-a3b [--expert-ff 64]

Routes of a CPU qwen3next with `--router-mode locality`, small (--layers, --experts, --top-k, d_model 256) or
the 80B's shape with narrow experts (synth_locality.py --shape says how), over a random prompt and a decode
fed random tokens (bench_gpu.py --feed random: 256 warm tokens, then tg64), replayed by `tiers.sim` with
--share of the experts cached as the GPU's bench runs: from the static fill (the lowest ids), learning in
windows of 4 passes (the prompt's pass and 3 decode tokens, then 4 tokens) over the prompt and the warm
decode, scored on the last --scored tokens; --budget experts a window may bring in over all layers (default
the 80B's: 64 MiB a pass, 4 passes a window, of 1.77 MB Q4_K experts is ~152 over its 48 layers,
BUDGET_PER_LAYER a layer). Each row: hit rate and what crosses the link a token (misses + copies), against
static placements: the cache's share when nothing is learned (the GPU's static rows: its hit rate is the
share), and a profile of the trace itself up to the scored part (the best a static placement could do). If
decode time is the resident step plus the link's part, the ratio of link transfers bounds the speed-up of a
learning policy over static.
CPU only, ~1 minute (~4 at the 80B's shape).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from synth_locality import add_shape_flags, model, recorded

from strata.gpu.learning import LEARN_EVERY
from strata.tiers import sim

BUDGET_PER_LAYER = (4 * (64 << 20)) / (3 * 2048 * 512 * 144 // 256) / 48  # ~3.16 experts a layer a window
ROWS = (("static", None, "copy"), ("lru", 0, "copy"), ("adaptive", 0, "copy"), ("adaptive", None, "copy"))
ROWS += (("adaptive", 0, "ride"), ("adaptive", None, "ride"))  # 0: --budget


def main() -> None:
    ap = argparse.ArgumentParser()
    add_shape_flags(ap, layers=8, experts=128, top_k=4)
    for flag, default in (("prompt", 512), ("decode", 320), ("scored", 64), ("seed", 0)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--share", type=float, default=0.455, help="the cache's share of the experts (24 GiB)")
    ap.add_argument("--budget", type=int, help="experts a 4-token window may bring in over all layers")
    ap.set_defaults(arch="qwen3next")
    a = ap.parse_args()
    m = model(a)
    s = m.shape
    a.budget = a.budget or round(BUDGET_PER_LAYER * s.n_layer)
    root = Path(tempfile.mkdtemp(prefix="learning_ceiling_"))
    path = m.write(root / "loc.gguf", "locality")
    rng = np.random.default_rng(a.seed)
    prompt, fed = rng.integers(10, 150_000, a.prompt), rng.integers(10, 150_000, a.decode)
    ids, _ = recorded(path, root / "routes.npz", prompt, a.decode, lambda k, _: int(fed[k]), m.backend)
    path.unlink()  # gigabytes at the 80B's shape; the routes stay
    n_tok, n_layer, top_k = ids.shape
    slots, picks = int(a.share * s.n_expert), n_layer * top_k
    print(f"{n_tok} tokens x {n_layer} layers x top-{top_k}, {slots} of {s.n_expert} experts cached")
    print(f"static, nothing learned: hit rate {a.share:.1%}, link/token {(1 - a.share) * picks:.2f}")
    fill = np.zeros((n_layer, s.n_expert), bool)
    fill[:, :slots] = True  # the static fill: the lowest ids (tiers/slots.py)
    # the engine's policy windows are LEARN_EVERY passes: the prompt's pass and 3 decode tokens, then 4 tokens
    first = a.prompt + LEARN_EVERY - 1
    windows = np.array([first] + [LEARN_EVERY] * ((n_tok - first) // LEARN_EVERY))
    windows[-1] += n_tok - windows.sum()
    for name, budget, admit in ROWS:
        budget = a.budget if budget == 0 else budget
        if name == "static":  # a profile of the trace up to the scored part: the best static placement
            r = sim.simulate(ids, s.n_expert, slots, name, profile_share=(n_tok - a.scored) / n_tok)
        else:  # from the static fill, learning over the prompt and the warm decode, as the GPU's bench
            r = sim.simulate(
                ids,
                s.n_expert,
                0,
                name,
                resident=fill,
                windows=windows,
                budget=budget,
                admit=admit,
                scored=a.scored,
            )
        miss = (1 - r.hit_rate) * picks
        label = "static, profile of the trace" if name == "static" else f"{name}, budget {budget}, {admit}"
        print(
            f"{label}: hit rate {r.hit_rate:.1%}, misses/token {miss:.2f}, copies/token "
            f"{r.copies / a.scored:.2f}, link/token {miss + r.copies / a.scored:.2f}"
        )


if __name__ == "__main__":
    main()

"""How local a synthetic model's own routing is (perf/README.md "synth locality router").

    python perf/synth_locality.py [--arch qwen3moe|qwen3next] [--layers 4] [--d-model 256] [--head-dim 64]
        [--experts 128] [--top-k 4] [--tokens 2000] [--decode 200] [--modes skew,locality]
    python perf/synth_locality.py --shape 80b-a3b|30b-a3b [--expert-ff 64] --tokens 1000 --decode 0

For each router mode: writes a small synth file (strata/synth/locality.py), feeds --tokens random tokens
through the CPU model with --record-routes and replays the routes through a per-layer LRU of 1/8 and 1/4 of
the experts and a static profile of 1/16 (tiers/sim.py: learned on the first half, scored on the second); then
greedy-decodes --decode tokens with a 25% expert cache and --prefetch 4 and reports the lookahead's accuracy
(the engine's counters; `tiers simulate --recorded` replays them exactly). CPU only; ~10 s per mode at the
default shape, a few minutes at 12 layers.

`--shape` measures a benchmark shape (48 layers at its real width: the GPU benches' files) with experts
--expert-ff wide instead of the full width, so the file fits this machine's disk and the CPU reads it in ~2
minutes; their down matrices are scaled by sqrt(full / narrow), so each expert adds to the residual what a
full-width one does (random weights: a row's output grows as the square root of its length), and the router
sees the same mix of slow and fast parts as in the full file. The flags --layers to --experts then do not
apply.

`--streams N` (locality mode): why GPU benchmarks feed decode a random stream (perf/bench_gpu.py --feed).
From N random 32-token prompts, 288 decode tokens either greedy or fed random tokens, as bench_gpu.py's warm
decode and tg64; LRU and adaptive with `--share` of the experts warmed on all but the last 64 tokens and
scored on those. A random-weight model's greedy text soon repeats one token, whose routing then never changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

from strata.engine import Engine
from strata.sampling.params import SamplingParams
from strata.synth import write_synth
from strata.synth.blocks import _rescale
from strata.synth.locality import measured_routes
from strata.synth.shapes import SHAPES, Shape
from strata.tiers import sim, trace

TOKENIZER = Path.home() / ".cache/strata/fixtures/qwen3_tokenizer/package/models"


@dataclasses.dataclass(frozen=True)
class Model:
    """A shape to measure, the gain of its experts' down matrices, and the CPU backend that reads it."""

    shape: Shape
    down_gain: float = 1.0
    backend: str = "numpy"

    def write(self, path: Path, mode: str) -> Path:
        """Its synth file with router `mode` at path."""
        path = write_synth(path, self.shape, Q.Q8_0, Q.Q8_0, 0.0, TOKENIZER, seed=1, router_mode=mode).path
        if self.down_gain != 1.0:
            with open(path, "r+b") as f:
                for t in GGUFReader(path).tensors:
                    if t.name.endswith("ffn_down_exps.weight"):
                        qtype = Q(t.tensor_type)
                        f.seek(int(t.data_offset))
                        blocks = np.frombuffer(f.read(int(t.n_bytes)), np.uint8)
                        blocks = blocks.reshape(-1, GGML_QUANT_SIZES[qtype][1]).copy()
                        _rescale(blocks, qtype, self.down_gain)
                        f.seek(int(t.data_offset))
                        f.write(blocks.tobytes())
        return path


def model(a: argparse.Namespace) -> Model:
    """The tiny fixture shape of --arch, resized by the flags; or --shape with --expert-ff wide experts."""
    if a.shape:
        full = next(s for (_, name), s in SHAPES.items() if name == a.shape)
        narrow = dataclasses.replace(full, name="locality", expert_ff=a.expert_ff, n_ctx=8192)
        return Model(narrow, math.sqrt(full.expert_ff / a.expert_ff), "jit")
    return Model(
        dataclasses.replace(
            SHAPES[(a.arch, "tiny")],
            name="locality",
            n_layer=a.layers,
            d_model=a.d_model,
            head_dim=a.head_dim,
            n_expert=a.experts,
            top_k=a.top_k,
            n_ctx=8192,
        )
    )


def add_shape_flags(ap: argparse.ArgumentParser, layers: int, experts: int, top_k: int) -> None:
    """The flags `model` reads, with these defaults for the tiny shape."""
    ap.add_argument("--arch", default="qwen3moe")
    for flag, default in (("layers", layers), ("d-model", 256), ("head-dim", 64), ("experts", experts)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--top-k", type=int, default=top_k)
    ap.add_argument("--shape", choices=("80b-a3b", "30b-a3b"), help="a benchmark shape, narrow experts")
    ap.add_argument("--expert-ff", type=int, default=64, help="--shape: the experts' width")


def main() -> None:
    ap = argparse.ArgumentParser()
    add_shape_flags(ap, layers=4, experts=128, top_k=4)
    for flag, default in (("tokens", 2000), ("decode", 200)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--modes", default="skew,locality")
    ap.add_argument("--streams", type=int, default=0, help="greedy against fed decode from this many prompts")
    ap.add_argument("--share", type=float, default=0.455, help="--streams: the cache's share of the experts")
    a = ap.parse_args()
    m = model(a)
    s, e = m.shape, m.shape.n_expert
    root = Path(tempfile.mkdtemp(prefix="synth_locality_"))
    if a.streams:
        streams(a, m, root)
        return
    for mode in a.modes.split(","):
        path = m.write(root / f"{mode}.gguf", mode)
        ids = measured_routes(path, root / f"{mode}.npz", a.tokens, 256, m.backend)
        lru = [sim.simulate(ids, e, n, "lru") for n in (e // 8, e // 4)]
        static = sim.simulate(ids, e, e // 16, "static")
        print(
            f"{s.arch} {s.n_layer} layers, D {s.d_model}, {mode}: LRU-{e // 8} {lru[0].hit_rate:.1%} "
            f"{[round(x, 2) for x in lru[0].per_layer]}, LRU-{e // 4} {lru[1].hit_rate:.1%} "
            f"{[round(x, 2) for x in lru[1].per_layer]}, static-{e // 16} {static.hit_rate:.1%}"
        )
        if a.decode:
            eng = Engine.load(
                path, device="cpu", backend=m.backend, expert_cache="25%", prefetch=4, routing_profile="off"
            )  # the static fill, not a profile of the last run
            eng.generate(
                list(range(30, 62)),
                max_tokens=a.decode,
                params=SamplingParams(temperature=0.0),
                ignore_eos=True,
            ).run()
            print(f"  decode {a.decode} tokens, 25% cache: {eng.expert_cache.prefetch.line()}")
        path.unlink()  # gigabytes at the benchmark shapes; the routes (.npz) stay


def recorded(
    path: Path,
    out: Path,
    prompt: np.ndarray,
    n: int,
    next_token: Callable[[int, np.ndarray], int],
    backend: str = "numpy",
) -> tuple[np.ndarray, list[int]]:
    """The CPU model's routes (`--record-routes` into `out`) over `prompt`, then n decode tokens, the k-th
    next_token(k, the last logits): (ids [tokens, layers, top-k], the decode tokens)."""
    eng = Engine.load(
        path,
        device="cpu",
        backend=backend,
        expert_cache="off",
        prefetch=0,
        routing_profile="off",
        record_routes=str(out),
    )
    st = eng.new_state()
    logits = eng.model.forward(prompt, st, all_logits=False)
    toks: list[int] = []
    for k in range(n):
        toks.append(next_token(k, logits))
        logits = eng.model.forward(np.array([toks[-1]]), st, all_logits=False)
    eng.expert_cache.recorder.save()
    return trace.load(out)[0], toks


def streams(a: argparse.Namespace, m: Model, root: Path, prompt: int = 32, decode: int = 288) -> None:
    path, e = m.write(root / "locality.gguf", "locality"), m.shape.n_expert
    slots = int(a.share * e)
    for seed in range(a.streams):
        rng = np.random.default_rng(seed)
        ids = rng.integers(10, 150_000, prompt)
        for how in ("greedy", "random"):
            fed = rng.integers(10, 150_000, decode)
            routes, toks = recorded(
                path,
                root / f"{how}{seed}.npz",
                ids,
                decode,
                lambda k, logits: int(logits[-1].argmax()) if how == "greedy" else int(fed[k]),  # noqa: B023
                m.backend,
            )
            warm = (len(routes) - 64) / len(routes)
            hits = [
                sim.simulate(routes, e, slots, p, profile_share=warm).hit_rate for p in ("lru", "adaptive")
            ]
            distinct = len(set(toks[-64:]))
            print(
                f"prompt {seed}, {how}: {distinct} of the last 64 tokens distinct, {slots} slots: "
                f"LRU {hits[0]:.1%}, adaptive {hits[1]:.1%}",
                flush=True,
            )


if __name__ == "__main__":
    main()

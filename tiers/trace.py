"""Routing traces: which experts every token routed to in every MoE layer, saved as .npz, and synthetic ones
whose locality matches published measurements, so cache policies can be compared without a model.

A trace is `ids` int16 [T, L, A] (token, MoE layer, routed slot) plus `n_expert`. The synthetic router gives
each layer a popularity that drifts (a Zipf-like skew over a slowly rotating ranking) and each token a
chance to reuse experts the last few tokens used: real routing is both skewed and bursty (llama.cpp PR
#24524: 10% of experts take 80% of hits in some traces; PR #27861: on Qwen3.8-Flash-Next, 512 experts, a
per-layer LRU of 64 slots hits ~67%, of 128 ~81%, while a static top-32 learned on half a workload covers
~10% of the other half). `CALIBRATED` comes close to those figures (tests/test_tier_sim.py checks them):
measured on 2,000 tokens, LRU-64 66.8%, LRU-128 85.9% (4 points over the published 81%), static top-32
10.7%.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, slots=True)
class Synthetic:
    n_expert: int = 512
    top_k: int = 10
    layers: int = 4
    skew: float = 1.0  # Zipf exponent of each layer's popularity
    reuse: float = 0.6  # chance a routed slot reuses an expert of the recent window
    window: int = 8  # tokens whose experts count as recent
    drift: int = 200  # tokens per step of the popularity ranking's rotation (topic drift)


CALIBRATED = Synthetic(skew=0.4, reuse=0.8, window=16, drift=64)


def synthetic(spec: Synthetic, tokens: int, seed: int = 0) -> np.ndarray:
    """ids [T, L, A] routed by the synthetic router."""
    rng = np.random.default_rng(seed)
    e, a = spec.n_expert, spec.top_k
    weights = 1.0 / np.arange(1, e + 1) ** spec.skew
    weights /= weights.sum()
    out = np.empty((tokens, spec.layers, a), np.int16)
    for li in range(spec.layers):
        rank = rng.permutation(e)  # rank[i]: the expert at popularity i
        recent: list[np.ndarray] = []
        for t in range(tokens):
            if spec.drift and t and t % spec.drift == 0:  # the workload moves on: a few ranks change places
                i, j = rng.integers(0, e, 2)
                rank[[i, j]] = rank[[j, i]]
                rank = np.roll(rank, 1) if rng.random() < 0.5 else rank
            pool = np.unique(np.concatenate(recent)) if recent else np.empty(0, np.int64)
            chosen: list[int] = []
            while len(chosen) < a:
                if len(pool) and rng.random() < spec.reuse:
                    c = int(pool[rng.integers(len(pool))])
                else:
                    c = int(rank[rng.choice(e, p=weights)])
                if c not in chosen:
                    chosen.append(c)
            out[t, li] = chosen
            recent = (recent + [out[t, li].astype(np.int64)])[-spec.window :]
    return out


@dataclass(frozen=True, slots=True)
class Ahead:
    """A recorded run's lookahead: its K, the experts each (token, layer) predicted [T, L, A] (best first;
    -1 for tokens whose pass did not predict: prefill), and each layer's expert bytes [L]."""

    k: int
    pred: np.ndarray
    expert_bytes: np.ndarray


def save(
    path: Path,
    ids: np.ndarray,
    n_expert: int,
    resident: np.ndarray | None = None,
    windows: np.ndarray | None = None,
    budget: int | None = None,
    ahead: Ahead | None = None,
) -> None:
    """`resident` [L, E] bool: the cache's placement when the recording started; `windows`: tokens per policy
    window (the cache changes between them: every pass on the CPU, every LEARN_EVERY passes on the GPU when a
    policy learns); `budget`: experts the cache could bring in per window (None: any);
    `ahead`: the lookahead's predictions (--prefetch K), so a replay stages what the engine staged."""
    extra: dict[str, np.ndarray] = {} if resident is None else {"resident": resident.astype(bool)}
    if windows is not None:
        extra["windows"] = np.asarray(windows, np.int64)
    if budget is not None:
        extra["budget"] = np.int64(budget)
    if ahead is not None:
        extra.update(
            prefetch=np.int64(ahead.k),
            pred=ahead.pred.astype(np.int16),
            expert_bytes=np.asarray(ahead.expert_bytes, np.int64),
        )
    np.savez_compressed(path, ids=ids.astype(np.int16), n_expert=np.int64(n_expert), **extra)


def load(path: Path) -> tuple[np.ndarray, int]:
    with np.load(path) as z:
        return z["ids"].astype(np.int64), int(z["n_expert"])


def load_recorded(path: Path) -> tuple[np.ndarray | None, np.ndarray | None, int | None]:
    """The placement, the windows and the swap budget a --record-routes trace carries (None for synthetic
    traces)."""
    with np.load(path) as z:
        resident, windows = (z[k] if k in z.files else None for k in ("resident", "windows"))
        return resident, windows, int(z["budget"]) if "budget" in z.files else None


def load_ahead(path: Path) -> Ahead | None:
    """The lookahead a --record-routes trace carries (None: recorded without --prefetch, or synthetic)."""
    with np.load(path) as z:
        if "pred" not in z.files:
            return None
        return Ahead(int(z["prefetch"]), z["pred"].astype(np.int64), z["expert_bytes"].astype(np.int64))


class Recorder:
    """`--record-routes FILE`: every pass's routed ids, layer by layer, kept in order and written on `save`
    (at exit, or when asked), with the placement the cache had and its policy windows (`passes` each: a
    replay that learned after every pass of the GPU's, with the budget of four, admitted 4x what it did)."""

    def __init__(
        self,
        path: Path,
        n_expert: int,
        resident: np.ndarray,
        budget: int | None = None,
        prefetch: int = 0,
        expert_bytes: np.ndarray | None = None,
        passes: int = 1,
    ) -> None:
        self.path, self.n_expert, self.resident, self.budget = path, n_expert, resident.copy(), budget
        self.prefetch, self.expert_bytes, self.passes = prefetch, expert_bytes, passes
        self._passes: list[np.ndarray] = []  # [T, L, A] per pass: the cache changes between them
        self._preds: list[np.ndarray] = []  # [T, L, A] per pass, -1 where a layer did not predict

    def end_pass(self, layers: list[np.ndarray | None], preds: list[np.ndarray | None] | None = None) -> None:
        """A pass is over: its routed ids [T, A] of every MoE layer, in layer order, and what each layer's
        lookahead predicted [T, A] (None: it did not)."""
        if not layers or any(x is None for x in layers):
            return
        ids = np.stack(layers, axis=1).astype(np.int16)  # type: ignore[arg-type]
        self._passes.append(ids)
        pred = np.full_like(ids, -1)
        for li, p in enumerate(preds or []):
            if p is not None:
                pred[:, li] = p
        self._preds.append(pred)

    def save(self) -> None:
        if self._passes:
            ahead = None
            if self.prefetch and self.expert_bytes is not None:
                ahead = Ahead(self.prefetch, np.concatenate(self._preds), self.expert_bytes)
            save(
                self.path,
                np.concatenate(self._passes),
                self.n_expert,
                self.resident,
                np.add.reduceat([len(p) for p in self._passes], np.arange(0, len(self._passes), self.passes)),
                self.budget,
                ahead,
            )

"""Replay a routing trace through a cache policy: hit rates per layer and overall, and the swaps it made.

`simulate(ids, n_expert, slots, policy)`: each layer gets `slots` slots (one policy covers them all); the
static policy's set comes from the first `profile_share` of the trace (a profile learned on part of the
workload), and every policy is scored on the rest, so they are compared on the same tokens.

`admit` says how newcomers come in (tiers/ride.py). "copy" (the CPU stand-in; the GPU with a pageable arena):
copied between windows, resident from the next window on, each copy crossing the link. "ride" (the GPU): a
newcomer stays a miss until a token routes it, whose read lands it, so it hits from the next token on and is
never copied. `copies` counts the experts copied over the link.

With the predictions a --prefetch run recorded (trace.Ahead), each scored window's layers also stage their
first K predicted misses against the cache as the window found it (lookahead.pick, as the engine picks), and
the result counts what the engine's PrefetchCounts count: parts staged, parts the routing used, their bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from strata.tiers import policy
from strata.tiers.lookahead import PrefetchCounts, pick, score
from strata.tiers.ride import ADMISSIONS
from strata.tiers.trace import Ahead


@dataclass(frozen=True, slots=True)
class Result:
    policy: str
    slots: int  # per layer
    lookups: int
    hits: int
    swaps: int  # experts brought into slots between windows
    per_layer: list[float]  # hit rate of each layer
    prefetch: dict[str, float | int] | None = None  # PrefetchCounts.status() of the replayed lookahead
    copies: int = 0  # of the swaps, those copied over the link (riders that landed were read as misses)
    admit: str = "copy"

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def json(self) -> dict[str, object]:
        return {**asdict(self), "hit_rate": self.hit_rate}


def simulate(
    ids: np.ndarray,
    n_expert: int,
    slots: int,
    name: str,
    profile_share: float = 0.5,
    resident: np.ndarray | None = None,
    windows: np.ndarray | None = None,
    budget: int | None = None,
    ahead: Ahead | None = None,
    admit: str = "copy",
    scored: int | None = None,
) -> Result:
    """ids [T, L, A]: the trace; slots per layer; each token its own window unless `windows` (tokens per
    window, as the engine's passes were) says otherwise; `budget`: experts brought in per window at most.
    `resident` [L, E]: the placement the engine started from (then the whole trace is scored, as the engine's
    own counters were, or its last `scored` tokens: the windows before them learn from that start, as the
    engine's warm-up did, unscored). `ahead`: replay a lookahead of ahead.k experts a layer from its
    predictions. `admit`: "copy" or "ride" (see the module)."""
    if admit not in ADMISSIONS:
        raise ValueError(f"admit: one of {ADMISSIONS}, not {admit!r}")
    t, n_l, a = ids.shape
    split = 0 if resident is not None else int(t * profile_share)
    head, tail = ids[:split], ids[split:]
    first = t - scored if resident is not None and scored else 0  # tail tokens before it learn unscored
    counts = np.stack([np.bincount(head[:, li].reshape(-1), minlength=n_expert) for li in range(n_l)])
    p = policy.make(name, slots, n_expert, counts, resident)
    for row in head:  # warm the cache on the profile part; not scored
        p.update(row[None], budget)
    bounds = np.cumsum(windows if windows is not None else np.ones(t, np.int64))[:-1]
    cuts = bounds[bounds > split] - split if resident is None else bounds
    pf = PrefetchCounts() if ahead is not None and ahead.k else None
    preds = np.split(ahead.pred[split:], cuts) if pf is not None else None  # type: ignore[union-attr]
    hits, swaps, copies, pos = np.zeros(n_l, np.int64), 0, 0, 0
    riding = np.zeros((n_l, n_expert), bool)  # [L, E] riders not landed yet ("ride")
    for i, w in enumerate(np.split(tail, cuts)):
        per_token = _ride_hits(p.resident, riding, w) if admit == "ride" else policy.window_hits(p, w)
        hits += per_token[max(0, first - pos) :].sum(axis=0)
        pos += len(w)
        scoring = pos > first  # else a warm-up window: it learns, and nothing it moves counts
        if pf is not None and scoring:
            _stage(pf, p.resident & ~riding, preds[i], w, ahead)  # type: ignore[index, arg-type]
        before = p.resident.copy()
        p.update(w, budget)
        new = p.resident & ~before
        if admit == "ride":  # leavers stop riding; newcomers start
            riding = (riding & p.resident) | new
        if scoring:
            swaps += int(new.sum())
            copies += int(new.sum()) if admit == "copy" else 0  # copied in between windows
    per_layer = (hits / max((len(tail) - first) * a, 1)).tolist()
    status = None
    if pf is not None:
        status = {k: v for k, v in pf.status().items() if k != "copy_seconds"}
    return Result(
        name, slots, (len(tail) - first) * n_l * a, int(hits.sum()), swaps, per_layer, status, copies, admit
    )


def _ride_hits(resident: np.ndarray, riding: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per token and layer [T, L], a window's hits [T, L, A] token by token, each rider a token routes
    landing for the next (riding [L, E] updated in place)."""
    layer = np.arange(w.shape[1])[:, None]
    hits = np.zeros(w.shape[:2], np.int64)
    for i, tok in enumerate(w):  # [L, A]
        hits[i] = (resident[layer, tok] & ~riding[layer, tok]).sum(axis=1)
        riding[layer, tok] = False
    return hits


def _stage(pf: PrefetchCounts, resident: np.ndarray, pred: np.ndarray, ids: np.ndarray, ahead: Ahead) -> None:
    """One window's lookahead: each layer that predicted (pred [T, L, A], -1: not) stages its first K
    predicted misses against `resident` [L, E]; counted against the window's routed ids [T, L, A]."""
    for li in range(ids.shape[1]):
        rows = pred[:, li]
        rows = rows[(rows >= 0).all(axis=1)]
        if len(rows):
            pf.add(*score(pick(rows, ~resident[li], ahead.k), ids[:, li], int(ahead.expert_bytes[li])))


def sweep(
    ids: np.ndarray,
    n_expert: int,
    sizes: list[int],
    names: tuple[str, ...] = policy.POLICIES,
    windows: np.ndarray | None = None,
    budget: int | None = None,
    admit: str = "copy",
) -> list[Result]:
    """The hit-rate vs cache-size curve of every policy (windows, budget, admit: as simulate's)."""
    kw = {"windows": windows, "budget": budget, "admit": admit}
    return [simulate(ids, n_expert, s, n, **kw) for s in sizes for n in names]  # type: ignore[arg-type]

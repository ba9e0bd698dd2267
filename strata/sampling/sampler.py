"""Token sampling: small pure functions chained in a fixed order.

Order: penalties -> temperature -> top_k -> top_p -> min_p -> draw (temperature first, as HF,
vLLM and the OpenAI API define top_p over the tempered distribution). Temperature 0 is greedy.

Randomness is counter-based: the draw at sequence position p under seed s comes from Philox
keyed by s with counter p, so the same (seed, position) always gives the same draw regardless
of batching, retries or what other requests are doing.

Any logits and any in-range parameters give a token id in range without looping: NaN counts as a
masked token (-inf), +inf as the largest float, penalties never push a finite logit to -inf, and
logits are shifted so their maximum is 0 before dividing by the temperature, so even 5e-324 gives
finite values (the draw then is the argmax). Every token masked is a SamplingError.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from strata.sampling.params import SamplingError, SamplingParams


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """Repetition penalty over the last `repeat_last_n` tokens, then OpenAI presence/frequency."""
    if not history or (p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0):
        return logits
    window = history[-p.repeat_last_n :] if p.repeat_last_n > 0 else history
    counts = Counter(window)
    ids = np.fromiter(counts, dtype=np.int64)
    n = np.fromiter(counts.values(), dtype=np.float32)
    out = logits.copy()
    sel = out[ids]
    with np.errstate(all="ignore"):  # overflow, and 1e-320 rounding to 0 in float32, are clipped below
        new = (
            np.where(sel > 0, sel / p.repeat_penalty, sel * p.repeat_penalty)
            if p.repeat_penalty != 1.0
            else sel
        )
        new = new - n * p.frequency_penalty - p.presence_penalty
    big = np.finfo(out.dtype).max
    # a penalty may make a logit huge or tiny but never masks a token (-inf) nor unmasks one
    out[ids] = np.where(np.isneginf(sel), sel, np.clip(new, -big, big))
    return out


def candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and normalised probabilities that survive top_k, top_p and min_p, most likely first
    (ties by id).

    Only a prefix of the sorted vocabulary can survive, so the work is sized by that prefix, not by the
    vocabulary: a sort of 152k float64 logits costs ~17 ms a token, more than a GPU decode step. The
    prefix is found by thresholds (a compare and a count over the vocabulary, ~0.05 ms each) and only it
    is sorted; the probabilities are still normalised over the whole vocabulary, as the definition says.
    """
    z = _tempered(logits, p.temperature)
    if 0 < p.top_k < z.size:
        ids = _top_k(z, p.top_k)
        probs = np.exp(z[ids] - z[ids[0]])
        probs /= probs.sum()
    else:
        e, total = _weights(z)
        ids = _surviving_prefix(z, e, total, p)
        probs = e[ids] / total
    if p.top_p < 1.0:
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        ids, probs = ids[:keep], probs[:keep]
    if p.min_p > 0.0:
        keep = probs >= p.min_p * probs[0]
        ids, probs = ids[keep], probs[keep]
    return ids, probs / probs.sum()


def _sorted(z: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ids (ascending) ordered by descending z, ties by id."""
    return ids[np.argsort(-z[ids], kind="stable")]


def _finite(logits: np.ndarray) -> np.ndarray:
    """float64 logits with NaN as -inf (masked) and +inf as the largest float; raises when all are masked."""
    z = np.nan_to_num(logits.astype(np.float64), nan=-np.inf, posinf=np.finfo(np.float64).max, neginf=-np.inf)
    if z.size == 0 or np.isneginf(z.max()):
        raise SamplingError("no token can be sampled: every logit is -inf or NaN")
    return z


def _tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    """(z - max z) / temperature: the maximum is exactly 0, so no temperature overflows it to inf or NaN."""
    z = _finite(logits)
    with np.errstate(over="ignore", invalid="ignore"):  # a tiny temperature sends the rest to -inf
        return (z - z.max()) / temperature


_MAX_WIDENINGS = 24  # 1.5**24 ~ 17k: past that, the threshold search admits the whole vocabulary


def _top_k(z: np.ndarray, k: int) -> np.ndarray:
    """The k largest of z, sorted, ties by id: a threshold low enough to admit k tokens, then a sort of
    those."""
    top, step = z.max(), 1.0
    for _ in range(_MAX_WIDENINGS):  # -inf logits (grammar masks) are admitted last
        if np.count_nonzero(z >= top - step) >= k:
            break
        step *= 1.5  # gently: overshooting admits most of the vocabulary to the partition below
    else:
        step = np.inf  # fewer than k tokens within reach (a tiny temperature): take them all
    cand = np.flatnonzero(z >= top - step)
    if cand.size > k:  # narrow to the k-th largest value, keeping its ties: they are cut by id below
        kth = np.partition(z[cand], cand.size - k)[cand.size - k]
        cand = cand[z[cand] >= kth]
    return _sorted(z, cand)[:k]


def _weights(z: np.ndarray) -> tuple[np.ndarray, float]:
    """exp(z - max z) over the whole vocabulary, and its sum: the unnormalised probabilities."""
    e = np.exp(z - z.max())
    return e, float(e.sum())


def _prefix_with_mass(z: np.ndarray, e: np.ndarray, mass: float) -> np.ndarray:
    """The sorted tokens with e above a threshold, lowered (by 4x) until their summed e reaches `mass`:
    a prefix of the sorted vocabulary holding that much mass (all of it at worst)."""
    thr = 0.5
    for _ in range(_MAX_WIDENINGS):  # down to ~1.8e-15: tokens below that hold no mass worth a search
        cand = np.flatnonzero(e >= thr)
        if e[cand].sum() >= mass:
            return _sorted(z, cand)
        thr /= 4.0
    return _sorted(z, np.arange(z.size))


def _surviving_prefix(z: np.ndarray, e: np.ndarray, total: float, p: SamplingParams) -> np.ndarray:
    """A sorted prefix of the vocabulary holding every token top_p / min_p can keep (all of it when
    neither is set). e = exp(z - max z), total = e.sum()."""
    if p.top_p >= 1.0 and p.min_p <= 0.0:
        return _sorted(z, np.arange(z.size))
    if p.top_p >= 1.0:  # min_p keeps e >= min_p; half of it leaves room for rounding
        return _sorted(z, np.flatnonzero(e >= p.min_p * 0.5))
    # the nucleus is inside once the prefix's mass passes top_p (with room for rounding)
    return _prefix_with_mass(z, e, p.top_p * total * (1.0 + 1e-9))


def _draw_untruncated(logits: np.ndarray, temperature: float, u: float) -> int:
    """The draw over the whole tempered vocabulary: the first token in sorted order whose cumulative mass
    passes u. Only the sorted prefix holding that mass is sorted (all of it when u is near 1 or the
    logits are flat)."""
    z = _tempered(logits, temperature)
    e, total = _weights(z)
    ids = _prefix_with_mass(z, e, u * total * (1.0 + 1e-9))
    i = int(np.searchsorted(np.cumsum(e[ids]), u * total, side="right"))
    return int(ids[min(i, len(ids) - 1)])


def uniform(seed: int, position: int) -> float:
    """The counter-based draw in [0, 1) for (seed, position)."""
    # as uint64: a Python list goes through int64, which garbles (and warns on) seeds >= 2**63
    key = np.array([seed & (2**64 - 1), 0], dtype=np.uint64)
    bitgen = np.random.Philox(key=key, counter=[position, 0, 0, 0])
    return float(np.random.Generator(bitgen).random())


# A draw the decode graph can make on the device (strata/gpu/kernels/sample.py): greedy, or top_k up to this
# many candidates, without penalties. Other draws need the whole vocabulary sorted or the history, on the
# host.
DEVICE_TOP_K = 256
DRAW_COLS = 8  # a device draw row: temperature, top_k, top_p, min_p, u, then zeros


def device_drawable(p: SamplingParams, vocab: int) -> bool:
    """Whether the device's sampler picks the same token as `sample` for these parameters."""
    no_penalty = p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
    return no_penalty and (p.greedy or 0 < p.top_k <= min(DEVICE_TOP_K, vocab - 1))


def draw_row(p: SamplingParams, seed: int, position: int) -> list[float]:
    """The device sampler's row for the draw at `position` (the uniform is computed here, on the host, from
    the same counter-based Philox as `sample`: the device needs no RNG of its own)."""
    u = 0.0 if p.greedy else uniform(seed, position)
    return [p.temperature, float(p.top_k), p.top_p, p.min_p, u, 0.0, 0.0, 0.0]


def sample(logits: np.ndarray, history: Sequence[int], p: SamplingParams, seed: int, position: int) -> int:
    """Pick the next token from logits [vocab] for a sequence at `position`."""
    logits = apply_penalties(logits, history, p)
    if p.greedy:
        return int(np.argmax(_finite(logits)))
    if not 0 < p.top_k < logits.size and p.top_p >= 1.0 and p.min_p <= 0.0:
        return _draw_untruncated(logits, p.temperature, uniform(seed, position))
    ids, probs = candidates(logits, p)
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, uniform(seed, position) * cdf[-1], side="right"))
    return int(ids[min(i, len(ids) - 1)])

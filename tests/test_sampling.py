"""Sampling chain: each filter against a brute-force definition, seeded determinism, penalties."""

from __future__ import annotations

import numpy as np
import pytest

from strata.sampling.params import SamplingError, SamplingParams
from strata.sampling.sampler import apply_penalties, candidates, sample, uniform
from strata.text.stops import StopMatcher

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=1000).astype(np.float32) * 3


def test_greedy_is_argmax() -> None:
    assert sample(LOGITS, [], SamplingParams(temperature=0.0), seed=1, position=0) == int(np.argmax(LOGITS))


def test_same_seed_and_position_same_draw_and_positions_differ() -> None:
    p = SamplingParams(temperature=1.0)
    a = [sample(LOGITS, [], p, seed=42, position=i) for i in range(50)]
    b = [sample(LOGITS, [], p, seed=42, position=i) for i in range(50)]
    c = [sample(LOGITS, [], p, seed=43, position=i) for i in range(50)]
    assert a == b
    assert a != c
    assert len(set(a)) > 5  # draws vary with position


def test_uniform_is_counter_based() -> None:
    assert uniform(7, 3) == uniform(7, 3)
    assert uniform(7, 3) != uniform(7, 4)
    assert 0.0 <= uniform(2**63, 10**9) < 1.0


def test_top_k_keeps_exactly_k_most_likely() -> None:
    ids, probs = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=5))
    assert set(ids) == set(np.argsort(-LOGITS)[:5])
    assert np.isclose(probs.sum(), 1.0)


def test_top_p_is_smallest_prefix_reaching_p() -> None:
    p = 0.6
    ids, _ = candidates(LOGITS, SamplingParams(temperature=1.0, top_p=p))
    z = np.exp(LOGITS.astype(np.float64) - LOGITS.max())
    probs = np.sort(z / z.sum())[::-1]
    need = int(np.argmax(np.cumsum(probs) >= p)) + 1
    assert len(ids) == need


def test_min_p_relative_to_best() -> None:
    ids, _probs = candidates(LOGITS, SamplingParams(temperature=1.0, min_p=0.1))
    z = np.exp(LOGITS.astype(np.float64) - LOGITS.max())
    assert set(ids) == set(np.flatnonzero(z >= 0.1))


def test_temperature_sharpens() -> None:
    _, hot = candidates(LOGITS, SamplingParams(temperature=2.0))
    _, cold = candidates(LOGITS, SamplingParams(temperature=0.5))
    assert cold[0] > hot[0]


def test_sampling_frequencies_follow_distribution() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    p = SamplingParams(temperature=1.0)
    draws = np.bincount([sample(logits, [], p, 5, i) for i in range(4000)], minlength=3) / 4000
    assert np.allclose(draws, [0.5, 0.3, 0.2], atol=0.03)


def test_penalties() -> None:
    logits = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    out = apply_penalties(logits, [0, 1, 0], SamplingParams(repeat_penalty=2.0))
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]
    out = apply_penalties(logits, [0, 1, 0], SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    assert np.allclose(out, [2.0 - 0.5 - 0.5, -2.0 - 0.5 - 0.25, 1.0, 0.5])


@pytest.mark.parametrize(
    "bad",
    [{"temperature": -1}, {"top_p": 0.0}, {"min_p": 2}, {"top_k": -1}, {"presence_penalty": 3}, {"seed": -1}],
)
def test_out_of_range_params_raise_naming_the_param(bad: dict) -> None:
    with pytest.raises(SamplingError, match=next(iter(bad))):
        SamplingParams(**bad).validate()


def test_stop_matcher_holds_back_prefixes_and_cuts_at_stop() -> None:
    m = StopMatcher(["</s>", "STOP"])
    out = []
    for piece in ["Hello <", "/", "x> wor", "ld ST", "OP after"]:
        text, hit = m.push(piece)
        out.append(text)
        if hit:
            break
    assert "".join(out) == "Hello </x> world "
    assert hit


def test_stop_matcher_flushes_held_text_without_stop() -> None:
    m = StopMatcher(["abc"])
    assert m.push("xxab") == ("xx", False)
    assert m.flush() == "ab"


def _full_sort_candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The definition, by brute force: sort the whole vocabulary, normalise, cut top_k / top_p / min_p."""
    z = logits.astype(np.float64) / p.temperature
    ids = np.argsort(-z, kind="stable")
    if 0 < p.top_k < z.size:
        ids = ids[: p.top_k]
    probs = np.exp(z[ids] - z[ids[0]])
    probs /= probs.sum()
    if p.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        ids, probs = ids[:keep], probs[:keep]
    if p.min_p > 0.0:
        keep = probs >= p.min_p * probs[0]
        ids, probs = ids[keep], probs[keep]
    return ids, probs / probs.sum()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # the server's defaults
        SamplingParams(temperature=0.7, top_k=20, top_p=0.8),  # Qwen's recommended
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.6, top_p=0.999),
        SamplingParams(temperature=1.3, min_p=0.02),
        SamplingParams(temperature=0.9, top_k=1000, min_p=0.1),
        SamplingParams(temperature=1.0),
    ],
)
def test_prefix_selection_equals_a_full_sort(params: SamplingParams) -> None:
    """candidates() sorts only the prefix of the vocabulary that can survive; the same ids, order and
    probabilities (to rounding) as sorting all of it, on a 152k vocabulary with peaked and flat logits,
    masked (-inf) tokens and exact ties."""
    rng = np.random.default_rng(5)
    for trial in range(9):
        scale = (0.3, 3.0, 12.0)[trial % 3]
        logits = (rng.standard_normal(151_936) * scale).astype(np.float32)
        logits[rng.integers(0, logits.size, 5000)] = -np.inf
        logits[rng.integers(0, logits.size, 50)] = logits.max()  # ties at the top
        ids, probs = candidates(logits, params)
        ref_ids, ref_probs = _full_sort_candidates(logits, params)
        assert np.array_equal(ids, ref_ids), f"trial {trial}: {len(ids)} vs {len(ref_ids)} candidates"
        np.testing.assert_allclose(probs, ref_probs, rtol=1e-12, atol=1e-15)
        draws = [sample(logits, [], params, 9, pos) for pos in range(20)]
        assert draws == [
            int(
                ref_ids[
                    min(
                        int(
                            np.searchsorted(
                                np.cumsum(ref_probs), uniform(9, pos) * np.cumsum(ref_probs)[-1], side="right"
                            )
                        ),
                        len(ref_ids) - 1,
                    )
                ]
            )
            for pos in range(20)
        ]

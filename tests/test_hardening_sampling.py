"""Issue 13, item 2: sampling cannot loop or index past the end for any logits and any in-range
parameters (property-tested with hypothesis), and the issue's own inputs finish at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from strata.sampling.params import SamplingError, SamplingParams
from strata.sampling.sampler import sample

F32_MAX = float(np.finfo(np.float32).max)
EXTREME = [0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, F32_MAX, -F32_MAX, float("inf"), float("-inf"), float("nan")]


def within(seconds: float, fn: Callable[[], int]) -> int:
    """fn() in a daemon thread; fails the test if it does not return in time (an endless loop)."""
    out: list[int | BaseException] = []

    def go() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # re-raised on the test's thread
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"sampling did not return within {seconds} s"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


logit_values = st.one_of(st.sampled_from(EXTREME), st.floats(width=32), st.floats(-50, 50, width=32))
positive = st.one_of(
    st.sampled_from([5e-324, 1e-320, 1e-40, 1e-6, 0.5, 1.0, 2.0, 100.0]),
    st.floats(min_value=5e-324, max_value=1e6, allow_nan=False, allow_infinity=False),
)
params = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.floats(min_value=5e-324, max_value=100.0)),
    top_k=st.integers(0, 600),
    top_p=st.one_of(st.just(1.0), st.floats(min_value=5e-324, max_value=1.0, exclude_min=False)),
    min_p=st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=1.0)),
    repeat_penalty=positive,
    repeat_last_n=st.integers(0, 64),
    presence_penalty=st.floats(-2.0, 2.0),
    frequency_penalty=st.floats(-2.0, 2.0),
    seed=st.integers(0, 2**64 - 1),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    logits=arrays(np.float32, st.integers(1, 300), elements=logit_values),
    p=params,
    history=st.lists(st.integers(0, 299), max_size=80),
    position=st.integers(0, 2**31),
)
def test_any_logits_and_parameters_give_an_unmasked_token_in_range(
    logits: np.ndarray, p: SamplingParams, history: list[int], position: int
) -> None:
    p.validate()
    history = [h % logits.size for h in history]
    allowed = ~(np.isnan(logits) | np.isneginf(logits))
    if not allowed.any():
        with pytest.raises(SamplingError):
            within(5, lambda: sample(logits, history, p, seed=p.seed or 0, position=position))
        return
    tok = within(5, lambda: sample(logits, history, p, seed=p.seed or 0, position=position))
    assert 0 <= tok < logits.size
    assert allowed[tok], (tok, logits[tok])  # never a masked (-inf / NaN) token while others exist


@settings(max_examples=200, deadline=None)
@given(
    logits=arrays(
        np.float32, st.integers(2, 200), elements=st.floats(-F32_MAX, F32_MAX, width=32), unique=True
    ),
    seed=st.integers(0, 2**63),
    top_k=st.sampled_from([0, 1, 40]),
)
def test_the_smallest_temperature_is_the_argmax(logits: np.ndarray, seed: int, top_k: int) -> None:
    p = SamplingParams(temperature=5e-324, top_k=top_k, top_p=0.95, min_p=0.05)
    assert within(5, lambda: sample(logits, [], p, seed, 3)) == int(np.argmax(logits))


VOCAB = np.random.default_rng(1).normal(size=49152).astype(np.float32) * 4  # SmolLM2's vocabulary size


@pytest.mark.parametrize(
    "p",
    [
        SamplingParams(temperature=5e-324, top_k=40, top_p=0.95, min_p=0.05),  # issue: sampling indexed []
        SamplingParams(
            temperature=1.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1e-40
        ),  # issue: froze
        SamplingParams(temperature=1.0, repeat_penalty=1e-320),
        SamplingParams(temperature=100.0, top_k=49151, top_p=1e-300),
        SamplingParams(
            temperature=5e-324, repeat_penalty=1e-40, presence_penalty=2.0, frequency_penalty=-2.0
        ),
    ],
    ids=["temp-5e-324", "repeat-1e-40", "repeat-1e-320", "hot-wide", "all-extremes"],
)
def test_the_issues_inputs_sample_at_full_vocabulary_size_quickly(p: SamplingParams) -> None:
    history = list(range(0, 49152, 7))[:64]
    for pos in range(5):
        tok = within(2, lambda pos=pos: sample(VOCAB, history, p, seed=11, position=pos))
        assert 0 <= tok < VOCAB.size


def test_non_finite_parameters_are_out_of_range() -> None:
    for field in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty"):
        for bad in (float("nan"), float("inf")):
            with pytest.raises(SamplingError, match=field):
                SamplingParams(**{field: bad}).validate()


def test_seeds_above_2_63_are_their_own_streams() -> None:
    from strata.sampling.sampler import uniform

    draws = {uniform(s, 5) for s in (2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1)}  # warned and collided before
    assert len(draws) == 4

"""Engine invariants on every architecture: prefill == token-by-token decode, chunking is invisible,
seeds replay, state checkpoints restore exactly, batched == solo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flagship_checks import build
from oracle import flagship

from strata.engine import Engine
from strata.sampling.params import SamplingParams

FLAGSHIPS = {"qwen3next": flagship.tiny_qwen3next, "qwen4exp": flagship.tiny_qwen4exp}


@pytest.fixture(scope="module", params=["qwen3moe", "llama", *FLAGSHIPS])
def engine(request: pytest.FixtureRequest, tiny_qwen3moe: dict, smollm2_path: Path) -> Engine:
    if request.param == "qwen3moe":
        return Engine.load(tiny_qwen3moe["f32"])
    if request.param in FLAGSHIPS:
        return Engine.load(build(FLAGSHIPS[request.param])["f32"])
    return Engine.load(smollm2_path)


IDS = [1, 504, 2415, 3117, 6341, 359, 30, 1115, 314, 253, 1837, 3158, 28, 2580, 281, 5261, 17, 64, 199, 1000]


def test_prefill_equals_single_token_decode(engine: Engine) -> None:
    full = engine.logits(IDS)
    state = engine.new_state()
    steps = np.concatenate([engine.model.forward(np.array([t]), state) for t in IDS])
    assert np.abs(full - steps).max() <= 1e-4


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_chunked_prefill_equals_one_shot(engine: Engine, chunk: int) -> None:
    full = engine.logits(IDS)
    state = engine.new_state()
    parts = [engine.model.forward(np.array(IDS[i : i + chunk]), state) for i in range(0, len(IDS), chunk)]
    assert np.abs(full - np.concatenate(parts)).max() <= 1e-4


def test_same_seed_same_tokens(engine: Engine) -> None:
    p = SamplingParams(temperature=1.0, seed=1234)
    a = engine.generate(IDS, max_tokens=12, params=p, ignore_eos=True).run().tokens
    b = engine.generate(IDS, max_tokens=12, params=p, ignore_eos=True).run().tokens
    c = engine.generate(IDS, max_tokens=12, params=SamplingParams(temperature=1.0, seed=99), ignore_eos=True)
    assert a == b
    assert a != c.run().tokens


def test_checkpoint_restore_continues_identically(engine: Engine) -> None:
    state = engine.new_state()
    engine.model.forward(np.array(IDS[:10]), state)
    snap = state.checkpoint()
    a = engine.model.forward(np.array(IDS[10:]), state)
    state.restore(snap)
    b = engine.model.forward(np.array(IDS[10:]), state)
    assert np.array_equal(a, b)


def _prime(engine: Engine, history: list[int]):  # type: ignore[no-untyped-def]
    s = engine.new_state()
    if history:
        engine.model.forward(np.array(history), s)
    return s


def test_batched_forward_equals_solo(engine: Engine) -> None:
    """Sequences of different lengths and histories in one window give their solo logits.

    Not bit-exact: BLAS runs gemv for one row and gemm for many, summing in another order; over
    SmolLM2's 30 layers that moves logits (|logit| ~ 20) by ~2e-4, hence 1e-3.
    """
    prompts = [IDS[:5], IDS[3:15], IDS[7:8]]
    solo = [engine.model.forward(np.array(p[-1:]), _prime(engine, p[:-1]))[-1] for p in prompts]
    states = [_prime(engine, p[:-1]) for p in prompts]
    batched = engine.model.forward_batch([np.array(p[-1:]) for p in prompts], states)
    for a, b in zip(solo, batched):
        assert np.abs(a - b).max() <= 1e-3
    # a mixed window: whole prompts of different lengths prefill together
    mixed = engine.model.forward_batch([np.array(p) for p in prompts], [engine.new_state() for _ in prompts])
    for p, got in zip(prompts, mixed):
        assert np.abs(engine.logits(p)[-1] - got).max() <= 1e-3

"""Checks shared by the qwen3next and qwen4exp oracle tests: logits and greedy tokens against the
transformers fp32 oracle, chunked prefill against token-by-token decode, checkpoint/restore."""

from __future__ import annotations

import warnings

import numpy as np

from strata.engine import Engine
from strata.sampling.params import SamplingParams

TOL = 1e-3  # max |dlogit| against transformers fp32 (logits have std ~4 on these models)


def build(fn):  # type: ignore[no-untyped-def]
    # Builders run transformers/torch, which warn freely; the suite has filterwarnings=error.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def worst(ours: np.ndarray, ref: np.ndarray) -> tuple[float, int]:
    """max |ours - ref| and the row (position) where it occurs."""
    err = np.abs(ours - ref).max(axis=1)
    return float(err.max()), int(err.argmax())


def check_prompt_logits(engine: Engine, ref: dict) -> float:
    ours = engine.logits(ref["prompt_ids"].tolist())
    err, pos = worst(ours, ref["logits"])
    assert err <= TOL, f"prompt: max |dlogit| {err:.2e} at position {pos}"
    assert np.array_equal(ours.argmax(1), ref["logits"].argmax(1)), "argmax differs at some prompt position"
    return err


def check_greedy(engine: Engine, ref: dict) -> float:
    ids, want = ref["prompt_ids"].tolist(), ref["greedy"].tolist()
    got = engine.generate(ids, max_tokens=len(want), params=SamplingParams(temperature=0.0), ignore_eos=True)
    assert got.run().tokens == want
    # the logits that chose each greedy token, computed by one prefill over prompt + continuation
    cont = engine.logits(ids + want[:-1])[len(ids) - 1 :]
    err, pos = worst(cont, ref["greedy_logits"])
    assert err <= TOL, f"greedy continuation: max |dlogit| {err:.2e} at step {pos}"
    return err


def forward_in_chunks(engine: Engine, ids: list[int], chunk: int) -> np.ndarray:
    state = engine.new_state()
    parts = [engine.model.forward(np.asarray(ids[i : i + chunk]), state) for i in range(0, len(ids), chunk)]
    return np.concatenate(parts)


def check_chunked_prefill(engine: Engine, ref: dict, chunk: int, tol: float) -> float:
    """Prefill in chunks of `chunk` tokens == token-by-token decode, at every prompt position.

    chunk 1 *is* token-by-token decode, so it is held against the transformers oracle instead.
    """
    ids = ref["prompt_ids"].tolist()
    chunked = forward_in_chunks(engine, ids, chunk)
    if chunk == 1:
        err, pos = worst(chunked, ref["logits"])
        assert err <= TOL, f"token-by-token: max |dlogit| {err:.2e} vs transformers at position {pos}"
        return err
    err, pos = worst(chunked, forward_in_chunks(engine, ids, 1))
    assert err <= tol, f"chunk {chunk}: max |dlogit| {err:.2e} vs token-by-token at position {pos}"
    return err


def check_checkpoint_restore(engine: Engine, ids: list[int], split: int, n_new: int = 8) -> None:
    """Snapshot mid-sequence, run on, restore, run again: identical logits and greedy continuation."""
    state = engine.new_state()
    engine.model.forward(np.asarray(ids[:split]), state)
    snap = state.checkpoint()

    def continue_greedy() -> tuple[list[int], np.ndarray]:
        logits = engine.model.forward(np.asarray(ids[split:]), state)
        out, rows = [], [logits]
        for _ in range(n_new):
            out.append(int(rows[-1][-1].argmax()))
            rows.append(engine.model.forward(np.asarray(out[-1:]), state))
        return out, np.concatenate(rows)

    first = continue_greedy()
    state.restore(snap)
    second = continue_greedy()
    assert first[0] == second[0]
    assert np.array_equal(first[1], second[1])
    # the snapshot itself was not advanced by either run
    fresh = engine.new_state()
    fresh.restore(snap)
    assert fresh.n_past == split and fresh.tokens == ids[:split]

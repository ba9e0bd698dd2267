"""SmolLM2-135M-Instruct Q4_1 against transformers fp32 loaded from the same GGUF."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata.engine import Engine
from strata.sampling.params import SamplingParams


@pytest.fixture(scope="module")
def engine(smollm2_path: Path) -> Engine:
    return Engine.load(smollm2_path)


def test_prompt_logits_match_transformers(engine: Engine, smollm2_oracle: dict) -> None:
    ids = smollm2_oracle["prompt_ids"].tolist()
    ours = engine.logits(ids)
    ref = smollm2_oracle["logits"]
    assert ours.shape == ref.shape and ours.dtype == np.float32
    err = np.abs(ours - ref)
    pos = int(np.argmax(err.max(axis=1)))
    assert err.max() <= 1e-2, f"max |dlogit| {err.max():.2e} at position {pos}"


def test_greedy_continuation_matches_transformers(engine: Engine, smollm2_oracle: dict) -> None:
    ids = smollm2_oracle["prompt_ids"].tolist()
    want = smollm2_oracle["greedy"].tolist()
    r = engine.generate(
        ids, max_tokens=len(want), params=SamplingParams(temperature=0.0), ignore_eos=True
    ).run()
    assert r.tokens == want
    full = engine.logits(ids + want[:-1])[len(ids) - 1 :]
    err = np.abs(full - smollm2_oracle["greedy_logits"]).max()
    assert err <= 1e-2, f"max |dlogit| along the greedy continuation {err:.2e}"


def test_prompt_tokenization_matches_oracle(engine: Engine, smollm2_oracle: dict) -> None:
    assert engine.tokenizer.encode("The three primary colors are") == smollm2_oracle["prompt_ids"].tolist()


def test_cli_chat_answers_paris(smollm2_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "strata",
            "generate",
            "--model",
            str(smollm2_path),
            "--chat",
            "--prompt",
            "What is the capital of France?",
            "--max-tokens",
            "24",
            "--temperature",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout

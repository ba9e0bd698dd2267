"""Tiny random qwen3next (llama.cpp's converter, --no-mtp) and qwen4exp (hyper-connections, QSA,
PLE) against transformers fp32, plus the hybrid-state invariants: chunked prefill ==
token-by-token decode, checkpoint/restore."""

from __future__ import annotations

import pytest
from flagship_checks import (
    build,
    check_checkpoint_restore,
    check_chunked_prefill,
    check_greedy,
    check_prompt_logits,
)
from oracle import assets, flagship

from strata.engine import Engine

# Chunked vs recurrent DeltaNet, and GEMM vs GEMV in every projection, differ only in float32
# summation order: measured <= 1e-4 on logits of std ~4.
CHUNK_TOL = 2.5e-4

BUILDERS = {"qwen3next": flagship.tiny_qwen3next, "qwen4exp": flagship.tiny_qwen4exp}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def model(request: pytest.FixtureRequest) -> tuple[Engine, dict]:
    fixture = build(BUILDERS[request.param])
    return Engine.load(fixture["f32"]), assets.load_npz(fixture["oracle"])


def test_prompt_logits_match_transformers(model: tuple[Engine, dict]) -> None:
    check_prompt_logits(*model)


def test_greedy_continuation_matches_transformers(model: tuple[Engine, dict]) -> None:
    check_greedy(*model)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_prefill_equals_token_by_token(model: tuple[Engine, dict], chunk: int) -> None:
    check_chunked_prefill(*model, chunk, CHUNK_TOL)


def test_checkpoint_restore_mid_sequence(model: tuple[Engine, dict]) -> None:
    engine, ref = model
    check_checkpoint_restore(engine, ref["prompt_ids"].tolist(), split=37)

"""Tiny random qwen3next (llama.cpp's converter, --no-mtp) against transformers fp32, plus the
hybrid-state invariants: chunked prefill == token-by-token decode, checkpoint/restore."""

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


@pytest.fixture(scope="module")
def fixture() -> dict:
    return build(flagship.tiny_qwen3next)


@pytest.fixture(scope="module")
def engine(fixture: dict) -> Engine:
    return Engine.load(fixture["f32"])


@pytest.fixture(scope="module")
def ref(fixture: dict) -> dict:
    return assets.load_npz(fixture["oracle"])


def test_prompt_logits_match_transformers(engine: Engine, ref: dict) -> None:
    check_prompt_logits(engine, ref)


def test_greedy_continuation_matches_transformers(engine: Engine, ref: dict) -> None:
    check_greedy(engine, ref)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_prefill_equals_token_by_token(engine: Engine, ref: dict, chunk: int) -> None:
    check_chunked_prefill(engine, ref, chunk, CHUNK_TOL)


def test_checkpoint_restore_mid_sequence(engine: Engine, ref: dict) -> None:
    check_checkpoint_restore(engine, ref["prompt_ids"].tolist(), split=37)

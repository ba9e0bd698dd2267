"""qwen4exp specifics: PLE table traffic per token and `strata info`'s PLE lines. The oracle
comparison and the state invariants it shares with qwen3next are in test_oracle_flagship.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from flagship_checks import build
from oracle import assets, flagship

from strata.engine import Engine


@pytest.fixture(scope="module")
def fixture() -> dict:
    return build(flagship.tiny_qwen4exp)


@pytest.fixture(scope="module")
def engine(fixture: dict) -> Engine:
    return Engine.load(fixture["f32"])


@pytest.fixture(scope="module")
def ref(fixture: dict) -> dict:
    return assets.load_npz(fixture["oracle"])


def test_ple_rows_counted_per_token(engine: Engine, ref: dict) -> None:
    """Every token reads exactly one row per n-gram head from the table, and nothing else."""
    model = engine.model
    before = (model.ple_stats.tokens, model.ple_stats.rows, model.ple_stats.bytes)  # type: ignore[attr-defined]
    ids = ref["prompt_ids"].tolist()
    engine.logits(ids)
    stats = model.ple_stats  # type: ignore[attr-defined]
    heads = model.ple.heads_per_ngram * (model.ple.ngram - 1)  # type: ignore[attr-defined]
    row_bytes = engine.gguf.tensors["per_layer_token_embd.weight"].row_bytes
    assert stats.tokens - before[0] == len(ids)
    assert stats.rows - before[1] == len(ids) * heads
    assert stats.bytes - before[2] == len(ids) * heads * row_bytes


def test_info_shows_ple_table(fixture: dict) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "strata", "info", str(fixture["f32"])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"^architecture: +qwen4exp$", out.stdout, re.M)
    table = next(line for line in out.stdout.splitlines() if line.startswith("PLE table:"))
    assert "per_layer_token_embd.weight 12,160 rows x 16 F32 = 0.7 MiB" in table
    assert "byte offset" in out.stdout and "memory-mapped" in out.stdout
    assert re.search(r"per token: +4 rows = 256 bytes", out.stdout)

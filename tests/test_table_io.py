"""`--ple-io`: the PLE n-gram table read from RAM (locked), the page cache, or with O_DIRECT gives the same
bytes, so the same logits and greedy tokens on the qwen4exp fixture; direct reads count the aligned bytes
they read from disk; auto picks ram when the table fits in half the free RAM."""

from __future__ import annotations

import numpy as np
import pytest
from flagship_checks import build
from oracle import flagship

from strata.blocks.ple import TABLE
from strata.engine import Engine
from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.tiers import tables


@pytest.fixture(scope="module")
def path() -> str:
    return str(build(flagship.tiny_qwen4exp)["f32"])


def test_every_mode_reads_the_same_rows(path) -> None:
    g = GGUFFile(path)
    n_rows = g.tensors[TABLE].n_rows
    rows = np.random.default_rng(0).integers(0, n_rows, (7, 6))
    rows[0, :3] = [
        0,
        1,
        n_rows - 1,
    ]  # the first rows and the last (its block may run past the end of the file)
    want = g.raw(TABLE)[rows.reshape(-1)]
    for mode in ("mmap", "ram", "direct"):
        t = tables.TableReader(g, TABLE, mode)
        got = t.take(t.prefetch(rows), 7)
        np.testing.assert_array_equal(got, want, err_msg=mode)
        assert (t.stats.tokens, t.stats.rows, t.stats.bytes) == (7, 42, want.nbytes)
        if t.mode == "direct":
            assert t.stats.disk_bytes >= want.nbytes and t.stats.disk_bytes % tables.BLOCK in (
                0,
                g.file_size % tables.BLOCK,
            )
        else:
            assert t.stats.disk_bytes == 0
        t.close()


def test_engine_tokens_equal_across_modes(path) -> None:
    prompt = list(range(40, 70))
    runs = {}
    for mode in ("mmap", "ram", "direct"):
        eng = Engine.load(path, ple_io=mode)
        logits = eng.logits(prompt)
        st = eng.new_state()
        eng.model.forward(np.array(prompt), st, all_logits=False)
        toks = []
        for _ in range(6):
            toks.append(
                int(eng.model.forward(np.array(toks[-1:] or [prompt[-1]]), st, all_logits=False)[-1].argmax())
            )
        runs[mode] = (logits, toks, eng.model.ple_stats.rows)
    for mode in ("ram", "direct"):
        np.testing.assert_array_equal(runs[mode][0], runs["mmap"][0], err_msg=mode)
        assert runs[mode][1] == runs["mmap"][1] and runs[mode][2] == runs["mmap"][2]


def test_auto_and_bad_values() -> None:
    assert tables.choose("auto", 10 << 30, 32 << 30) == "ram"
    assert (
        tables.choose("auto", 28 << 30, 32 << 30) == "direct"
    )  # the seeds' 28.8 GiB table on a 32 GB machine
    assert tables.choose("mmap", 1, 1 << 40) == "mmap"
    with pytest.raises(ConfigError, match="ple_io"):
        Engine.load(None, ple_io="fast")  # refused before anything loads


def test_planner_shows_the_tables_tier(path, capsys) -> None:
    """`strata plan` on qwen4exp: the GPU placement without the PLE table (it stays on the host), and the
    table's tier."""
    import json

    from strata.cli import main

    assert main(["plan", path, "--vram-gib", "1", "--ram-gib", "0.000001", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ple_io"] == "direct" and out["ple_table_bytes"] > 0
    assert not any("per_layer" in k or "PLE table" in k for k in out["parts"])
    assert out["dense_bytes"] < out["vram_budget_bytes"]
    assert main(["plan", path, "--vram-gib", "1", "--ple-io", "mmap"]) == 0
    text = capsys.readouterr().out
    assert "QSA and PLE state" in text and "-> mmap" in text

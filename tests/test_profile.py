"""Routing profiles (strata/tiers/profile.py): the engine counts routing while it runs, saves the counts in
the cache dir under the model's SHA-256, and the next start fills the expert cache with each layer's most used
experts; `strata profile` builds one ahead of time. The cache only moves bytes, so tokens stay those of the
all-resident model; a profile of the workload hits at least as often as the static fill."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest
from test_tiers import _fixture, _greedy

from strata.engine import Engine
from strata.tiers import profile


def test_save_load_round_trip_and_bad_files(tmp_path) -> None:
    p = profile.Profile(np.zeros((2, 8)))
    p.add(0, np.array([[1, 2], [1, 3]]))
    p.add(1, np.array([[7, 7]]))
    assert p.tokens == 2 and p.uses[0, 1] == 2 and p.uses[1, 7] == 2
    q = profile.Profile(np.zeros((2, 8)))
    q.add_all(np.array([[[1, 2], [7, 7]], [[1, 3], [0, 0]]]))  # [T, L, A]: the same ids, layer by layer
    q.uses[1, 0] -= 2
    assert q.tokens == 2 and np.array_equal(q.uses, p.uses)
    profile.save(tmp_path, "ab" * 32, p)
    got = profile.load(tmp_path, "ab" * 32, (2, 8))
    assert got is not None and got.tokens == 2 and np.array_equal(got.uses, p.uses)
    assert profile.load(tmp_path, "ab" * 32, (3, 8)) is None  # another model's shape: ignored
    assert profile.load(tmp_path, "cd" * 32, (2, 8)) is None
    profile.path_for(tmp_path, "ef" * 32).write_bytes(b"not an npz")
    assert profile.load(tmp_path, "ef" * 32, (2, 8)) is None
    assert p.top(np.array([2, 1])).tolist() == [
        [False, True, True, False] + [False] * 4,  # ties: the lower id
        [False] * 7 + [True],
    ]


def test_digest_from_sidecar_then_computed_once(tmp_path) -> None:
    from strata.gguf import GGUFFile

    path = _fixture("qwen3moe")
    d = profile.Digests(tmp_path)
    want = hashlib.sha256(path.read_bytes()).hexdigest()
    assert d.known(str(path)) in (None, want)
    assert d.compute(GGUFFile(path)) == want
    assert profile.Digests(tmp_path).known(str(path)) == want


def test_the_next_start_fills_from_the_profile(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv(profile.CACHE_ENV, str(tmp_path))
    path = _fixture("qwen3moe")
    ids = [int(v) for v in np.random.default_rng(3).integers(10, 5000, 40)]
    want = _greedy(Engine.load(path, device="cpu", backend="numpy", routing_profile="off"), ids, 8).tokens
    first = Engine.load(path, device="cpu", backend="numpy", expert_cache="25%")
    got = _greedy(first, ids, 8)
    assert got.tokens == want
    keeper = first.profile_keeper
    assert keeper is not None and keeper.saved is None
    keeper.wait()
    saved = keeper.save()
    assert saved is not None and saved.parent == tmp_path / "profiles"
    counted = first.expert_cache.profile
    assert counted.tokens == len(ids) + 8 - 1  # every token fed, prompt and decode
    static_hits = got.timings.experts.prefill.hits + got.timings.experts.decode.hits
    with caplog.at_level(logging.INFO, logger="strata"):
        second = Engine.load(path, device="cpu", backend="numpy", expert_cache="25%")
    assert "pre-filled" in caplog.text
    cache = second.expert_cache
    per = (cache.where >= 0).sum(axis=1)
    assert np.array_equal(cache.where >= 0, counted.top(per))  # each layer's most used experts
    again = _greedy(second, ids, 8)
    assert again.tokens == want
    assert again.timings.experts.prefill.hits + again.timings.experts.decode.hits >= static_hits
    # the counts go on from the saved ones
    assert second.expert_cache.profile.tokens == 2 * counted.tokens


def test_off_neither_reads_nor_counts(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(profile.CACHE_ENV, str(tmp_path))
    eng = Engine.load(
        _fixture("qwen3moe"), device="cpu", backend="numpy", expert_cache="25%", routing_profile="off"
    )
    assert eng.profile_keeper is None and eng.expert_cache.profile is None
    from strata.errors import ConfigError

    with pytest.raises(ConfigError, match="routing_profile"):
        Engine.load(_fixture("qwen3moe"), device="cpu", routing_profile="sometimes")


def test_profile_command_builds_one_ahead(tmp_path, monkeypatch, capsys) -> None:
    from strata.cli import main

    monkeypatch.setenv(profile.CACHE_ENV, str(tmp_path))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\n\nwrite a function that adds two numbers\n")
    path = _fixture("qwen3moe")
    assert (
        main(
            [
                "profile",
                str(path),
                "--prompts",
                str(prompts),
                "-n",
                "4",
                "--backend",
                "numpy",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "of 2 prompts" in out and str(tmp_path / "profiles") in out
    eng = Engine.load(path, device="cpu", backend="numpy", expert_cache="25%")
    assert eng.profile_keeper is not None and eng.profile_keeper.saved is not None
    assert main(["profile", str(path), "--prompts", str(tmp_path / "none.txt")]) == 1

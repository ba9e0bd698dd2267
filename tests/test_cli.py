"""CLI: --json output shape, info, and one-line errors with a non-zero exit (never a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def strata(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata", *args], capture_output=True, text=True, timeout=300
    )


def test_generate_json(smollm2_path: Path) -> None:
    out = strata(
        "generate",
        "--model",
        str(smollm2_path),
        "--prompt",
        "The three primary colors are",
        "--max-tokens",
        "5",
        "--temperature",
        "0",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    assert set(obj) >= {"prompt_ids", "tokens", "text", "timings"}
    assert len(obj["tokens"]) == 5 and obj["text"]
    assert obj["timings"]["prompt_n"] == len(obj["prompt_ids"])


def test_info(smollm2_path: Path) -> None:
    out = strata("info", str(smollm2_path))
    assert out.returncode == 0, out.stderr
    assert "Q4_1" in out.stdout
    labelled = [ln for ln in out.stdout.splitlines() if not ln.startswith(" ") and ":" in ln]
    values = {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in labelled}
    assert values["architecture"].strip() == "llama" and values["chat template"].strip() == "yes"
    # every value starts in one column, after at least one space (embedding_length:576 did not)
    assert len({len(ln) - len(ln.split(":", 1)[1].lstrip()) for ln in labelled}) == 1
    assert all(v.startswith(" ") for v in values.values())


def test_info_verify_known_digest(smollm2_path: Path) -> None:
    out = strata("info", str(smollm2_path), "--verify")
    assert out.returncode == 0, out.stderr
    assert "verified" in out.stdout


def _assert_one_line_error(out: subprocess.CompletedProcess[str], needle: str) -> None:
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr and needle in lines[0]


@pytest.mark.parametrize("kind", ["garbage", "truncated", "missing"])
def test_bad_files_give_one_line(tmp_path: Path, smollm2_path: Path, kind: str) -> None:
    p = tmp_path / "bad.gguf"
    if kind == "garbage":
        p.write_bytes(b"\x00garbage" * 100)
    elif kind == "truncated":
        with open(smollm2_path, "rb") as f:
            p.write_bytes(f.read(5_000_000))
    for cmd in (["info", str(p)], ["generate", "--model", str(p), "--prompt", "hi"]):
        _assert_one_line_error(strata(*cmd), "bad.gguf")


def test_unknown_architecture_one_line(tmp_path: Path) -> None:
    import numpy as np
    from gguf import GGUFWriter

    p = tmp_path / "arch.gguf"
    w = GGUFWriter(str(p), "notamodel")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_one_line_error(strata("generate", "--model", str(p), "--prompt", "x"), "supported:")


def test_bad_flag_value_names_the_flag(smollm2_path: Path) -> None:
    _assert_one_line_error(
        strata("generate", "--model", str(smollm2_path), "--prompt", "x", "--temperature", "-3"),
        "--temperature",
    )


def test_usage_errors_are_one_line_and_exit_1(smollm2_path: Path) -> None:
    for args in (
        ["generate", "--model", str(smollm2_path)],
        ["generate", "--prompt", "hi", "--max-tokens", "x"],
        ["plan"],
        ["no-such-command"],
    ):
        out = strata(*args)
        assert out.returncode == 1, (args, out.stderr)
        _assert_one_line_error(out, "strata: error:")


def test_public_api_and_the_default_model(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import strata as pkg
    from strata.hub import default_model

    assert {"Engine", "SamplingParams"} <= set(pkg.__all__)
    monkeypatch.setattr(default_model, "pull", lambda: smollm2_path)  # the default model, already fetched
    eng = pkg.Engine.load()
    assert eng.gguf.path == str(smollm2_path)
    text = eng.generate("Hi", max_tokens=3, params=pkg.SamplingParams(temperature=0.0)).run().text
    assert text


def test_generate_without_model_uses_strata_model(smollm2_path: Path) -> None:
    import os

    env = {**os.environ, "STRATA_MODEL": str(smollm2_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "strata",
            "generate",
            "--prompt",
            "hi",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["prompt_ids"]

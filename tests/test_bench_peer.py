"""strata.bench.peer reads llama.cpp's bench output into the benches' speed keys: on stand-in tools that
print what llama-bench and llama-batched-bench print (their JSON fields as the sdist's tools/ write them), and
on the real llama-bench when the peer is built (../shared/peer/build-cpu.sh)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from strata.bench import peer

LLAMA_BIN = Path("~/.cache/strata-peer/build/bin").expanduser()


def _tool(tmp_path: Path, name: str, stdout: str, stderr: str = "", rc: int = 0) -> Path:
    """An executable that records its arguments and prints the given output."""
    (tmp_path / f"{name}.out").write_text(stdout)
    (tmp_path / f"{name}.err").write_text(stderr)
    path = tmp_path / name
    path.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > "{tmp_path}/{name}.args"\n'
        f'cat "{tmp_path}/{name}.out"; cat "{tmp_path}/{name}.err" >&2; exit {rc}\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_bench_speeds_keys_prefill_and_decode(tmp_path: Path) -> None:
    rows = [
        {"n_prompt": 512, "n_gen": 0, "avg_ts": 787.5, "flash_attn": True},
        {"n_prompt": 4096, "n_gen": 0, "avg_ts": 2466.0},
        {"n_prompt": 0, "n_gen": 64, "avg_ts": 65.3},
        {"n_prompt": 0, "n_gen": 0, "avg_ts": 0.0},  # a `-n 0` decode test llama-bench still lists
    ]
    tool = _tool(tmp_path, "llama-bench", json.dumps(rows), stderr="load_tensors: offloading 48 layers\n")
    speeds = peer.bench_speeds(tool, Path("m.gguf"), ["-ngl", "99", "-p", "512,4096", "-n", "64"])
    assert speeds == {"pp512": 787.5, "pp4096": 2466.0, "tg64_b1": 65.3}
    args = (tmp_path / "llama-bench.args").read_text().split()
    assert args[:2] == ["-m", "m.gguf"] and args[-2:] == ["-o", "json"] and "-ngl" in args


def test_batched_speeds_reads_the_jsonl_lines_beside_the_log(tmp_path: Path) -> None:
    lines = [
        {"n_kv_max": 4096, "pp": 128, "tg": 64, "pl": 1, "speed_tg": 296.1},
        {"n_kv_max": 4096, "pp": 128, "tg": 64, "pl": 4, "speed_tg": 672.7},
    ]
    log = "main: n_kv_max = 4096\n" + "".join(json.dumps(x) + "\n" for x in lines)
    tool = _tool(tmp_path, "llama-batched-bench", "", stderr=log)
    speeds = peer.batched_speeds(tool, Path("m.gguf"), 64, [1, 4], ["-ngl", "99"])
    assert speeds == {"batched_tg64_b1": 296.1, "batched_tg64_b4": 672.7}
    args = (tmp_path / "llama-batched-bench.args").read_text().split()
    assert args[args.index("-npl") + 1] == "1,4" and args[args.index("-ntg") + 1] == "64"


def test_a_failed_run_says_why(tmp_path: Path) -> None:
    err = "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 22000.00 MiB on device 0: out of memory\n"
    tool = _tool(tmp_path, "llama-bench", "", stderr="loading\n" + err, rc=1)
    with pytest.raises(peer.PeerError, match="llama-bench exit 1: .*out of memory"):
        peer.bench_speeds(tool, Path("m.gguf"), [])


def test_the_real_llama_bench(tiny_qwen3moe: dict[str, Path]) -> None:
    tool = LLAMA_BIN / "llama-bench"
    if not os.access(tool, os.X_OK):
        pytest.skip(f"llama.cpp is not built (no llama-bench in {LLAMA_BIN})")
    speeds = peer.bench_speeds(tool, tiny_qwen3moe["q8_0"], ["-t", "2", "-p", "8", "-n", "4", "-r", "1"])
    assert set(speeds) == {"pp8", "tg4_b1"} and all(v > 0 for v in speeds.values())

"""llama.cpp, the speed peer, run by the perf benches: `llama-bench` and `llama-batched-bench` on a GGUF,
their JSON read into one vocabulary of speeds (tok/s) keyed `pp{N}` (prefill of N tokens), `tg{N}_b1` (decode
of N tokens, one sequence: llama-bench's tg) and `batched_tg{N}_b{B}` (llama-batched-bench's S_TG, B
sequences)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path


class PeerError(RuntimeError):
    """llama.cpp exited non-zero: out of memory at a VRAM cap, or a file it cannot read."""


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        tail = " | ".join(run.stderr.strip().splitlines()[-3:])
        raise PeerError(f"{Path(cmd[0]).name} exit {run.returncode}: {tail}")
    return run


def bench_speeds(tool: Path, model: Path, flags: Sequence[str]) -> dict[str, float]:
    """`llama-bench -m MODEL FLAGS -o json`: the average tok/s of each test it ran (a `-p 0` or `-n 0` test
    is not one)."""
    speeds = {}
    for r in json.loads(_run([str(tool), "-m", str(model), *flags, "-o", "json"]).stdout):
        if r["n_prompt"] and not r["n_gen"]:
            speeds[f"pp{r['n_prompt']}"] = float(r["avg_ts"])
        elif r["n_gen"] and not r["n_prompt"]:
            speeds[f"tg{r['n_gen']}_b1"] = float(r["avg_ts"])
    return speeds


def batched_speeds(
    tool: Path, model: Path, gen: int, batches: Sequence[int], flags: Sequence[str] = ()
) -> dict[str, float]:
    """`llama-batched-bench` decoding `gen` tokens after a 128-token prompt for each batch size: S_TG."""
    run = _run(
        [
            str(tool),
            "-m",
            str(model),
            *flags,
            "-c",
            "4096",
            "-npp",
            "128",
            "-ntg",
            str(gen),
            "-npl",
            ",".join(map(str, batches)),
            "--output-format",
            "jsonl",
        ]
    )
    speeds = {}
    for line in (run.stdout + run.stderr).splitlines():  # the jsonl lines may come beside the log
        if line.startswith('{"n_kv_max"'):
            r = json.loads(line)
            speeds[f"batched_tg{r['tg']}_b{r['pl']}"] = float(r["speed_tg"])
    return speeds

"""perf/bench_long.py without a GPU: `--replot` reads saved runs (strata bench's envelope, as the run writes
after every length) and draws one series per setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from strata.bench.report import engine_result, run_meta, write_json

BENCH = Path(__file__).resolve().parents[1] / "perf" / "bench_long.py"


def test_saved_runs_are_plotted(tmp_path):
    rows = [
        {
            "context": n,
            "splits": 32,
            "kv_type": "int8",
            "kv_resident": res,
            "kv_grow": False,
            "ttft_s": n / 4000,
            "pp_tok_s": 4000.0,
            "tg_tok_s": 50.0,
        }
        for res in (0, 32768)
        for n in (4096, 32768)
    ]
    saved = tmp_path / "long.json"
    write_json(engine_result(run_meta(bench="bench_long"), {"long_context": rows}), saved)
    png = tmp_path / "long.png"
    run = subprocess.run(
        [sys.executable, str(BENCH), "--replot", str(saved), "--plot", str(png)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    none = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, check=False)
    assert none.returncode == 2 and "--model" in none.stderr

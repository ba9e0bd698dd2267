"""`strata bench`: the decode rate from timestamps (TTFT not spread over the tokens), the flags' errors, and
the whole command against the CPU server on SmolLM2 writing its JSON and PNGs."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata.bench.run import add_joules
from strata.bench.sampler import Sampler
from strata.bench.server import listening_pid
from strata.bench.stats import Stream, decode_rate, percentile, windowed_rates
from strata.cli import main
from strata.conf.bench import SCENARIOS, BenchConfig
from strata.errors import ConfigError


def test_decode_rate_leaves_ttft_out() -> None:
    # sent at 0, the first token at 2.0 s (a long prefill), then ten more 0.1 s apart
    s = Stream(sent=0.0, stamps=[2.0 + 0.1 * i for i in range(11)])
    assert s.ttft == pytest.approx(2.0)
    assert s.decode_tok_s == pytest.approx(10.0)  # 10 tokens after the first in 1.0 s
    amortised = s.tokens / s.stamps[-1]  # what the seeds warn about: 11 / 3.0 = 3.7 tok/s
    assert s.decode_tok_s > 2.5 * amortised
    summary = s.summary()
    assert summary["itl_p50_ms"] == pytest.approx(100.0) and summary["itl_p99_ms"] == pytest.approx(100.0)


def test_decode_rate_counts_the_servers_tokens() -> None:
    # 3 chunks carrying 5 tokens (usage.completion_tokens): 4 tokens after the first over 2 s
    s = Stream(sent=0.0, stamps=[1.0, 2.0, 3.0], usage_tokens=5)
    assert s.decode_tok_s == pytest.approx(2.0)
    assert decode_rate([1.0], 1) == 0.0 and decode_rate([], 0) == 0.0  # nothing after the first to time
    assert math.isnan(Stream(sent=0.0).ttft)


def test_percentile_and_windows() -> None:
    xs = [float(i) for i in range(101)]
    assert percentile(xs, 0.5) == 50.0 and percentile(xs, 0.99) == 99.0 and percentile(xs, 0.0) == 0.0
    assert math.isnan(percentile([], 0.5))
    # 8 gaps of 0.1 s then 8 of 0.2 s: windows of 8 read 10 and 5 tok/s
    stamps = [0.1 * i for i in range(9)] + [0.8 + 0.2 * i for i in range(1, 9)]
    assert windowed_rates(stamps, 8) == pytest.approx([10.0, 5.0])


class FakeNVML:
    """Two GPUs at 50% busy and 100 W each: what nvidia-ml-py answers, without a GPU."""

    class NVMLError(Exception):
        pass

    nvmlInit = nvmlShutdown = staticmethod(lambda: None)
    nvmlDeviceGetCount = staticmethod(lambda: 2)
    nvmlDeviceGetHandleByIndex = staticmethod(lambda i: i)
    nvmlDeviceGetUtilizationRates = staticmethod(lambda h: SimpleNamespace(gpu=50))
    nvmlDeviceGetPowerUsage = staticmethod(lambda h: 100_000)  # milliwatts
    nvmlDeviceGetMemoryInfo = staticmethod(lambda h: SimpleNamespace(used=(h + 1) << 30))


def test_sampler_gpu_series_andadd_joules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML)
    sampler = Sampler(os.getpid(), hz=40)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    s = sampler.series
    assert sampler.notes() == {"process": None, "gpu": None}
    assert len(s.t) >= 5 and len(s.gpu_power_w) == len(s.gpu_util_pct) == len(s.rss_bytes) == len(s.t)
    assert s.gpu_mem_bytes[0] == [1 << 30, 2 << 30] and s.gpu_util_pct[0] == [50.0, 50.0]
    assert sampler.power_w(s.t[0], s.t[-1]) == pytest.approx(200.0)  # both GPUs
    rows = {"x": {"rows": [{"t0": s.t[1], "t1": s.t[1] + 2.0, "tokens": 100}, {"note": "no span"}]}}
    add_joules(sampler, rows)
    assert rows["x"]["rows"][0]["j_per_token"] == pytest.approx(4.0)  # 200 W x 2 s / 100 tokens
    assert "j_per_token" not in rows["x"]["rows"][1]


def test_sampler_without_nvml_or_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    sampler = Sampler(None, hz=40)
    sampler.start()
    time.sleep(0.1)
    sampler.stop()
    notes = sampler.notes()
    assert "nvidia-ml-py is not installed" in str(notes["gpu"]) and "--pid" in str(notes["process"])
    assert sampler.series.t and not sampler.series.gpu_power_w and not sampler.series.rss_bytes
    assert sampler.power_w(0.0, 1.0) is None


def test_listening_pid_finds_the_server_by_its_port() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert listening_pid(f"http://127.0.0.1:{port}") == os.getpid()
    assert listening_pid("http://192.0.2.1:8080") is None  # not loopback: not ours to see


@pytest.mark.parametrize(
    ("cfg", "flag"),
    [
        (BenchConfig(scenarios=("concurrency", "nope")), "--scenarios"),
        (BenchConfig(concurrency=(0, 2)), "--concurrency"),
        (BenchConfig(tokens=1), "--tokens"),
        (BenchConfig(efforts=("max",)), "--efforts"),
        (BenchConfig(url="localhost:8080"), "--url"),
        (BenchConfig(url="http://127.0.0.1:8080", model="m.gguf"), "--url"),
        (BenchConfig(sample_hz=0), "--sample-hz"),
    ],
)
def test_bad_flags_name_themselves(cfg: BenchConfig, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        cfg.validate()


@pytest.mark.slow
def test_bench_json_and_plots(smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_dir = tmp_path / "bench.json", tmp_path / "plots"
    rc = main(
        [
            "bench",
            "--model",
            str(smollm2_path),
            "--serve-args",
            "--parallel 2 --ctx-size 1024",
            "--scenarios",
            ",".join(SCENARIOS),
            "--concurrency",
            "1,2",
            "--tokens",
            "8",
            "--contexts",
            "64,256",
            "--long-tokens",
            "24",
            "--long-prompt",
            "200",
            "--tool-rounds",
            "2",
            "--efforts",
            "none",
            "--sample-hz",
            "4",
            "--json",
            str(out_json),
            "--out",
            str(out_dir),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0
    res = json.loads(out_json.read_text())
    assert set(res) >= {"meta", "warmup", "scenarios", "samples", "notes", "overhead"}
    assert list(res["scenarios"]) == list(SCENARIOS)
    assert "no vision" in res["scenarios"]["images"]["skipped"]  # SmolLM2 reads text only
    sweep = res["scenarios"]["concurrency"]["rows"]
    assert [r["concurrency"] for r in sweep] == [1, 2] and all(r["failures"] == 0 for r in sweep)
    requests = [q for r in sweep for q in r["requests"]]
    requests += [
        r for name in ("context", "long", "thinking", "tools") for r in res["scenarios"][name]["rows"]
    ]
    for q in requests:
        assert q["error"] is None and q["ttft_s"] > 0, q
        # a tool call arrives as one chunk: no gap to time (null in the JSON)
        assert q["itl_p50_ms"] <= q["itl_p99_ms"] if q["itl_p50_ms"] is not None else "calls" in q, q
    assert all(q["decode_tok_s"] > 0 and q["tokens"] == 8 for q in requests[:3])  # the sweep's 3 requests
    assert res["scenarios"]["long"]["rows"][0]["tokens"] == 24
    assert res["scenarios"]["tools"]["rows"][0]["calls"] >= 1
    assert res["scenarios"]["prefix"]["rows"][0]["repeat_cached_tokens"] > 0
    s = res["samples"]
    assert len(s["t"]) >= 4 and len(s["rss_bytes"]) == len(s["t"]) and min(s["rss_bytes"]) > 10 << 20
    assert res["notes"]["process"] is None and res["overhead"]["chunks"] > 0
    for png in ("concurrency.png", "timeline.png"):
        assert (out_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "== concurrency" in printed and "bench overhead" in printed


def test_engine_benches_share_the_bench_envelope(tiny_qwen3moe: dict, tmp_path: Path) -> None:
    """perf/bench_cpu.py on the tiny model: its JSON opens as `strata bench --json` does (meta, scenarios of
    rows) and its table prints the same way."""
    import subprocess

    out = tmp_path / "cpu.json"
    run = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[1] / "perf/bench_cpu.py"),
            "--model",
            str(tiny_qwen3moe["f32"]),
            "--engines",
            "numpy",
            "--prompt",
            "8",
            "--gen",
            "4",
            "--reps",
            "1",
            "--threads",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    res = json.loads(out.read_text())
    assert {"started", "cpus"} <= set(res["meta"]) and res["meta"]["bench"] == "perf/bench_cpu.py"
    (row,) = res["scenarios"]["throughput"]["rows"]
    assert row["engine"] == "strata numpy" and row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0
    assert row["decode_vs_llama"] is None  # no llama.cpp asked for
    lines = run.stdout.splitlines()
    assert "== throughput" in lines and lines[lines.index("== throughput") + 1].split()[:2] == [
        "model",
        "engine",
    ]


def test_engine_tables_print_each_scenario_as_the_bench_does() -> None:
    from strata.bench.report import engine_result, engine_tables, run_meta

    res = engine_result(
        run_meta(bench="x"),
        {"decode": [{"test": "tg64 b=1", "tok_s": 123.4}], "prefill": []},
        strata={"pp512": 1.0},
    )
    assert res["strata"] == {"pp512": 1.0} and res["scenarios"]["prefill"] == {"rows": []}
    assert engine_tables("title", res).splitlines() == [
        "title",
        "",
        "== decode",
        "    test  tok_s",
        "tg64 b=1    123",
        "",
        "== prefill",
        "(no rows)",
    ]

"""perf/bench_tiers.py without a GPU: each cap runs once per cache policy and --pcie-frac (a learning policy
after its warm-up), llama.cpp once per cap, and the table, JSON and plot carry every run, with the plan
(uniform routing) beside static runs only."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "perf" / "bench_tiers.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_tiers", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _strata(hit: float, tok_s: float) -> dict:
    miss = (1 - hit) * 400e6
    return {
        "tiers": {
            "pcie_frac": 1.0,
            "rates": None,
            "pcie": {"zero_copy": 50e9, "copy_engine": 55e9},
            "layers": 48,
            "expert_bytes": 40e9,
        },
        **{f"tiers_b{b}": {"hit_rate": hit, "pcie_bytes_per_token": miss} for b in (1, 4)},
        **{f"bytes_b{b}": b * (miss + 1.5e9) for b in (1, 4)},
        "copy_bw": 3e12,
        "vram_used_mib": 22000.0,
        "pp512": 900.0,
        "tg64_b1": tok_s,
        "tg64_b4": 2 * tok_s,
    }


def test_each_cap_runs_every_policy_beside_one_llama_sweep(tmp_path, monkeypatch, capsys):
    bt = _load()
    runs, llama_caps = [], []

    def strata_at(a, cap, policy, frac, out):
        runs.append((cap, policy, frac))
        return _strata(0.9 if policy != "static" else 0.45, 150.0 if policy != "static" else 90.0)

    def llama_at(a, cap, *_):
        llama_caps.append(cap)
        return {"tg64_b1": 60.0, "pp512": 800.0}

    monkeypatch.setattr(bt, "strata_at", strata_at)
    monkeypatch.setattr(bt, "plan_at", lambda *_: {"decode_tok_s": 95.0, "dense_bytes": 3e9})
    monkeypatch.setattr(bt, "llama_at", llama_at)
    argv = ["bench_tiers.py", "--model", str(tmp_path / "m.gguf"), "--caps", "22528,11264"]
    argv += ["--prompts", "512", "--gen", "64", "--pcie-fracs", "auto,1", "--policies", "static,adaptive,lru"]
    argv += ["--llama-bin", str(tmp_path), "--out", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", argv)
    bt.main()

    want = [(22528, p, f) for p in ("static", "adaptive", "lru") for f in ("auto", "1")]
    assert runs == want + [(11264, p, f) for _, p, f in want]
    assert llama_caps == [22528, 11264]  # once a cap, whatever the runs
    rows = json.loads((tmp_path / "out" / "tiers.json").read_text())["scenarios"]["tiers"]["rows"]
    tg = [r for r in rows if r["test"] == "tg64_b1" and r["cap_mib"] == 22528]
    assert [r["policy"] for r in tg] == ["static", "static", "adaptive", "adaptive", "lru", "lru"]
    ada = tg[3]
    assert ada["ratio"] == pytest.approx(150.0 / 60.0) and ada["hit_rate"] == pytest.approx(0.9)
    assert ada["planner_tok_s"] is None and tg[0]["planner_tok_s"] == pytest.approx(95.0)
    md = (tmp_path / "out" / "tiers.md").read_text()
    assert "| 22,528 | adaptive | 1.00 | 90.0% | tg64_b1 | 150.0 | 60.0 | 2.50 |" in md
    assert "adaptive" in capsys.readouterr().out
    assert (tmp_path / "out" / "tiers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_learning_policy_warms_up_first(tmp_path, monkeypatch):
    bt = _load()
    calls = []

    class Done(Exception):
        pass

    def run(cmd, check):
        calls.append(cmd)
        raise Done

    monkeypatch.setattr(bt.subprocess, "run", run)
    a = bt.argparse.Namespace(
        model=tmp_path / "m.gguf",
        prompts=[512],
        gen=64,
        batches=[1],
        chunk=4096,
        warm_decode=128,
        swap_budget_mib=32,
    )
    for policy in ("static", "adaptive"):
        with pytest.raises(Done):
            bt.strata_at(a, 22528, policy, "1", tmp_path)
    static, ada = calls
    assert "--warm-decode" not in static and static[static.index("--cache-policy") + 1] == "static"
    assert ada[ada.index("--warm-decode") + 1] == "128" and ada[ada.index("--swap-budget-mib") + 1] == "32"


def test_the_bound_counts_a_learning_policys_swaps_against_the_link():
    """Swaps run on a side stream beside decode but cross the link the misses use: the bound holds a token
    to at least its misses and swaps over the link (PCIe and the CPU pool, or PCIe alone), and to its serial
    VRAM and miss time, whichever is longer: a policy that buys hits with copies is held to what it moved."""
    bt = _load()
    s = _strata(0.9, 150.0)  # 40 MB of misses a token, 1.5 GB read from VRAM at 3 TB/s (0.5 ms)
    s["tiers"]["rates"] = {"cpu": 30e9}
    miss, vram = 0.1 * 400e6, 1.5e9
    plain = bt.bound(s, 1, 64)
    assert plain == pytest.approx(1 / (vram / 3e12 + miss / 80e9))
    s["swaps_b1"] = {"swaps": 100, "bytes": 64 * 1e6}  # 1 MB a token: it fits beside the VRAM reads
    assert bt.bound(s, 1, 64) == pytest.approx(plain)
    s["swaps_b1"] = {"swaps": 1_000, "bytes": 64 * 60e6}  # 60 MB a token over 64 steps of one row
    assert bt.bound(s, 1, 64) == pytest.approx(80e9 / (miss + 60e6))
    assert bt.bound(s, 1, 64, cpu_too=False) == pytest.approx(50e9 / (miss + 60e6))
    s["swaps_b1"] = {"swaps": 1_000, "bytes": 64 * 90e6}  # more than PCIe moves in the link-bound time
    assert bt.bound(s, 1, 64) == pytest.approx(50e9 / 90e6)
    s["swaps_b4"] = {"swaps": 1_000, "bytes": 4 * 64 * 60e6}  # per token: the steps' rows count
    assert bt.bound(s, 4, 64, cpu_too=False) == pytest.approx(50e9 / (miss + 60e6))
    # riders crossed the link as the misses they were: only the copied rest counts
    s["swaps_b1"] = {"swaps": 1_000, "bytes": 64 * 90e6, "rides": 900, "ride_bytes": 64 * 30e6}
    assert bt.bound(s, 1, 64) == pytest.approx(80e9 / (miss + 60e6))

"""The expert tiers as a server user sees them (CPU stand-in): per-response timings, /v1/status, /metrics and
the log line, and the same tokens as a server without a cache."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fixture import running_server

from strata.tiers.layout import ExpertLayout


@pytest.fixture(scope="module")
def tiny_moe(tiny_qwen3moe):
    return tiny_qwen3moe["q8_0"]


def _ask(srv, n: int = 6) -> dict:
    with srv.client() as c:
        r = c.post(
            "/v1/completions", json={"prompt": "The tiers move bytes", "max_tokens": n, "temperature": 0}
        )
        assert r.status_code == 200, r.text
        return r.json()


def test_tier_counters_reach_every_surface(tiny_moe):
    from strata.gguf import GGUFFile

    layout = ExpertLayout.from_gguf(GGUFFile(tiny_moe))
    with running_server(tiny_moe, "--device", "cpu", "--ctx-size", "1024") as plain:
        want = _ask(plain)
    with running_server(tiny_moe, "--device", "cpu", "--ctx-size", "1024", "--expert-cache", "50%") as srv:
        got = _ask(srv)
        assert got["choices"][0]["text"] == want["choices"][0]["text"]  # the cache only moves bytes
        t = got["timings"]
        per_token = layout.top_k * len(layout.layers)
        assert t["prompt_expert_lookups"] == t["prompt_n"] * per_token
        # the decode pipeline (sched/ahead.py) feeds the last token too, before the host sees the request end
        assert t["expert_lookups"] == t["predicted_n"] * per_token
        assert 0 < t["expert_hits"] < t["expert_lookups"] and t["pcie_bytes"] > 0
        assert "expert_lookups" not in want["timings"]
        with srv.client() as c:
            status = c.get("/v1/status").json()["expert_cache"]
            metrics = c.get("/metrics").text
        assert status["slots"] == layout.n_total // 2 and status["decode"]["lookups"] == t["expert_lookups"]
        got = {
            (m.name, m.labels.get("phase", "")): m.value
            for fam in text_string_to_metric_families(metrics)
            for m in fam.samples
        }
        for name, key in (
            ("strata_expert_lookups_total", "expert_lookups"),
            ("strata_expert_hits_total", "expert_hits"),
            ("strata_pcie_bytes_total", "pcie_bytes"),
            ("strata_cpu_expert_calls_total", "cpu_expert_calls"),
        ):
            assert got[(name, "decode")] == t[key], name
            assert got[(name, "prefill")] == t["prompt_" + key], name
        assert got[("strata_expert_misses_total", "decode")] == t["expert_lookups"] - t["expert_hits"]
        assert got[("strata_expert_cache_slots", "")] == layout.n_total // 2
        assert got[("strata_expert_cache_bytes", "")] == status["bytes"]
        assert status["policy"] == "static" and status["swaps"] == 0
        assert got[("strata_expert_swaps_total", "")] == 0
        assert len(status["per_layer_hit_rate"]) == len(layout.layers)
        assert all(0.0 <= r <= 1.0 for r in status["per_layer_hit_rate"])
        pf = status["prefetch"]  # the CPU stand-in's lookahead (default --prefetch 4) stages decode misses
        assert pf["staged_parts"] > 0 and pf["saved_bytes"] + pf["wasted_bytes"] == pf["copied_bytes"]
        assert got[("strata_prefetch_staged_total", "")] == pf["staged_parts"]
        assert got[("strata_prefetch_used_total", "")] == pf["used_parts"]
        assert "decode expert cache hit rate" in srv.output()


def test_the_mmap_tier_reaches_every_surface(tiny_moe):
    """--ram-budget-mib with room for the ring and two experts: the same text, and the experts read from the
    file's mapping counted alike in the timings, /v1/status and /metrics."""
    from strata.gguf import GGUFFile
    from strata.tiers.budget import MIB
    from strata.tiers.ram import ring_bytes

    layout = ExpertLayout.from_gguf(GGUFFile(tiny_moe))
    mib = f"{(ring_bytes(layout) + 2 * layout.slot_bytes + 1) / MIB:.6f}"
    args = ("--device", "cpu", "--ctx-size", "1024", "--expert-cache", "50%", "--routing-profile", "off")
    with running_server(tiny_moe, *args) as plain:
        want = _ask(plain)
    with running_server(tiny_moe, *args, "--ram-budget-mib", mib) as srv:
        got = _ask(srv)
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        t = got["timings"]
        assert t["mmap_expert_reads"] > 0 and t["prompt_mmap_expert_reads"] > 0
        assert t["cpu_expert_calls"] == t["mmap_expert_reads"]  # the CPU stand-in reads them in place
        with srv.client() as c:
            status = c.get("/v1/status").json()["expert_cache"]
            metrics = c.get("/metrics").text
        ram = status["ram"]
        assert ram["arena_experts"] == 2 and ram["mmap_experts"] == layout.n_total - 2
        assert ram["arena_bytes"] == 2 * layout.slot_bytes and ram["bounce_bytes"] > 0
        assert status["decode"]["mmap_expert_reads"] == t["mmap_expert_reads"]
        assert status["prefill"]["mmap_bytes"] == t["prompt_mmap_bytes"]
        got = {
            (m.name, m.labels.get("phase", "")): m.value
            for fam in text_string_to_metric_families(metrics)
            for m in fam.samples
        }
        for name, key in (
            ("strata_mmap_expert_reads_total", "mmap_expert_reads"),
            ("strata_mmap_bytes_total", "mmap_bytes"),
        ):
            assert got[(name, "decode")] == t[key], name
            assert got[(name, "prefill")] == t["prompt_" + key], name
        assert got[("strata_mmap_experts", "")] == layout.n_total - 2
        assert got[("strata_bounce_bytes_total", "")] == ram["bounce_bytes"]
        assert "from the file's mapping" in srv.output()

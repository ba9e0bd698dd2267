"""The low-RAM mode (`--ram-budget-mib`) on the CPU stand-in: three tiers (numpy slots for VRAM, numpy rows
for the pinned arena, the file's mapping), the same tier manager and bounce ring the GPU runs.

Invariants: a budget with room for a handful of experts (or only the ring) gives the all-resident greedy
tokens, through a prompt that borrows slots and through short passes; the counters are exact (decode lookups
= hits + PCIe reads + CPU calls, the CPU calls being the misses only the mapping holds; prefill counts what
was staged from the mapping); borrowed slots get their bytes back; the arena takes the likeliest misses, then
the borrowed slots' experts; the ring cuts and merges copies correctly; an impossible budget is refused with
the flag and the numbers; the planner shows the three tiers; the flag means the same everywhere.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata.engine import Engine
from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.sampling.params import SamplingParams
from strata.tiers.budget import MIB
from strata.tiers.layout import ExpertLayout
from strata.tiers.profile import Profile
from strata.tiers.ram import arena_rows, choose_held, ring_bytes
from strata.tiers.ring import batches, host_ring, merged, split_rows

PROMPT = 300  # > BORROW_MIN, one chunk of the CPU's 512


def _fixture(arch: str):
    from flagship_checks import build
    from oracle import assets, flagship

    return build(assets.tiny_qwen3moe if arch == "qwen3moe" else flagship.tiny_qwen3next)["q8_0"]


def _budget(path, experts: int) -> float:
    """A RAM budget in MiB with room for the ring and `experts` arena rows."""
    lay = ExpertLayout.from_gguf(GGUFFile(path))
    return (ring_bytes(lay) + experts * lay.slot_bytes + 1) / MIB


def _greedy(engine: Engine, ids: list[int], n: int = 6):
    gen = engine.generate(ids, max_tokens=n, params=SamplingParams(temperature=0.0), ignore_eos=True)
    return gen.run()


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_a_tiny_ram_budget_gives_the_all_resident_tokens(arch):
    path = _fixture(arch)
    rng = np.random.default_rng(0)
    long, short = ([int(v) for v in rng.integers(10, 5000, n)] for n in (PROMPT, 20))
    plain = Engine.load(path, device="cpu", backend="numpy", routing_profile="off")
    ref_long, ref_short = _greedy(plain, long), _greedy(plain, short)
    for rows in (3, 0):
        eng = Engine.load(
            path,
            device="cpu",
            backend="numpy",
            expert_cache="50%",
            routing_profile="off",
            ram_budget_mib=_budget(path, rows),
        )
        cache = eng.expert_cache
        assert cache is not None and cache.low_ram and int(cache.in_ram.sum()) == rows
        assert cache.borrow_min == 9, "every pass past 8 rows stages, as the GPU's past its decode rows"
        assert not (cache.in_ram & (cache.where >= 0)).any(), "the arena holds no copy of a slot's expert"
        before = [a.copy() for a in cache.slots.arrays]
        st = cache.staging()
        assert st is not None and st.complete
        staged_mapped = int((st.staged & ~cache.in_ram).sum())
        restored_mapped = sum(not cache.in_ram[li, e] for _, li, e in st.restore)
        res = _greedy(eng, long)
        assert res.tokens == ref_long.tokens, f"{arch} with {rows} arena rows"
        assert _greedy(eng, short).tokens == ref_short.tokens, f"{arch} with {rows} arena rows, short prompt"
        assert all(np.array_equal(a, b) for a, b in zip(before, cache.slots.arrays)), "slots restored"
        t = res.timings.to_dict()
        n_l, k = len(cache.layout.layers), cache.layout.top_k
        per = int(cache.expert_bytes[0])  # every layer alike here
        assert t["prompt_expert_lookups"] == PROMPT * k * n_l
        assert t["expert_lookups"] == (len(res.tokens) - 1) * k * n_l
        over_pcie = t["pcie_bytes"] // per
        assert t["expert_lookups"] == t["expert_hits"] + over_pcie + t["cpu_expert_calls"]
        assert t["cpu_expert_calls"] == t["mmap_expert_reads"] > 0
        assert t["mmap_bytes"] == t["mmap_expert_reads"] * per
        assert t["prompt_mmap_expert_reads"] == staged_mapped
        assert t["prompt_mmap_bytes"] == staged_mapped * per
        assert t["prompt_pcie_bytes"] == int(st.staged.sum()) * per and t["prompt_cpu_expert_calls"] == 0
        ring = cache.slots.ring
        # through the ring: the fill, then per staged pass (the long prompt's, the short one's) what it staged
        # from the mapping and what it restored from there
        assert ring is not None
        assert ring.bytes == (cache.n_slots + 2 * (staged_mapped + restored_mapped)) * per
        before_five = ring.bytes
        five = _greedy(eng, long[:5])  # a pass of decode rows: mapped-only misses read in place, the CPU's
        assert five.tokens == _greedy(plain, long[:5]).tokens
        tf = five.timings.to_dict()
        assert tf["prompt_cpu_expert_calls"] == tf["prompt_mmap_expert_reads"] > 0
        assert ring.bytes == before_five, "nothing staged"


def test_no_budget_or_a_budget_for_everything_keeps_every_expert_in_ram():
    path = _fixture("qwen3moe")
    lay = ExpertLayout.from_gguf(GGUFFile(path))
    for mib in (0, lay.n_total * lay.slot_bytes / MIB):
        eng = Engine.load(
            path, device="cpu", backend="numpy", expert_cache="50%", routing_profile="off", ram_budget_mib=mib
        )
        assert not eng.expert_cache.low_ram and eng.expert_cache.slots.ring is None
        t = _greedy(eng, list(range(30, 50))).timings.to_dict()
        assert t["mmap_expert_reads"] == t["prompt_mmap_expert_reads"] == t["cpu_expert_calls"] == 0


def test_the_arena_takes_the_likeliest_misses_then_the_borrowed_slots():
    resident = np.zeros((3, 6), bool)
    resident[:, :2] = True  # the static fill: the lowest ids
    borrowed = np.zeros((3, 6), bool)
    borrowed[:, 1] = True
    held = choose_held(resident, borrowed, 4)  # uniform: expert-major, so layers share the rows
    assert held.sum() == 4 and not (held & resident).any()
    assert held[:, 2].all() and held[0, 3] and not held[1:, 3].any()
    held = choose_held(resident, borrowed, 12 + 2)  # every miss, then two borrowed residents
    assert held[~resident].all() and (held & borrowed).sum() == 2
    uses = np.zeros((3, 6))
    uses[2, 5], uses[1, 4] = 9, 5  # a profile: its most used misses first
    held = choose_held(resident, borrowed, 2, Profile(uses, 10))
    assert held[2, 5] and held[1, 4] and held.sum() == 2


def test_the_ring_cuts_and_merges_copies():
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, 10_000, dtype=np.uint8)
    dst = np.zeros_like(src)
    s0, d0 = int(src.ctypes.data), int(dst.ctypes.data)
    rows = np.array([[s0, d0, 3000], [s0 + 3000, d0 + 3000, 500], [s0 + 5000, d0 + 6000, 4000]], np.int64)
    loads = batches(rows, 1024)
    assert all(sum(p[3] for p in load) <= 1024 for load in loads)
    assert sum(p[3] for load in loads for p in load) == 7500
    assert len(merged(loads[2])) == 1, "pieces that continue each other in buffer and destination: one copy"
    ring, _bufs = host_ring(1024)
    ring.copy(rows)
    assert np.array_equal(dst[:3500], src[:3500]) and np.array_equal(dst[6000:], src[5000:9000])
    assert not dst[3500:6000].any() and ring.bytes == 7500 and ring.loads == len(loads)
    inside, outside = split_rows(rows, [(s0 + 2000, s0 + 4000)])
    assert inside.tolist() == rows[1:2].tolist() and outside.tolist() == rows[[0, 2]].tolist()


def test_an_impossible_budget_is_refused_with_the_flag_and_the_numbers():
    path = _fixture("qwen3moe")
    lay = ExpertLayout.from_gguf(GGUFFile(path))
    with pytest.raises(
        ConfigError,
        match=r"ram_budget_mib=0\.01: .*0\.11 MiB for every expert.*bounce ring.*"
        r"0\.053 MiB \(2 buffers of 4 experts",
    ):
        Engine.load(path, device="cpu", backend="numpy", expert_cache="50%", ram_budget_mib=0.01)
    with pytest.raises(ConfigError, match="ram_budget_mib=-1"):
        Engine.load(path, device="cpu", ram_budget_mib=-1)
    assert arena_rows(lay, 0) is None and arena_rows(lay, 1e6) is None
    assert arena_rows(lay, _budget(path, 5)) == 5


def test_cli_refuses_a_bad_budget_naming_the_flag(capsys):
    from strata.cli import main

    path = str(_fixture("qwen3moe"))
    assert main(["generate", "--model", path, "--prompt", "x", "--ram-budget-mib", "-2"]) != 0
    assert "--ram-budget-mib" in capsys.readouterr().err


def test_the_flag_means_the_same_on_serve_generate_and_the_api():
    from strata.cli import build_parser
    from strata.conf import EngineOptions
    from strata.conf.engine import backend_options
    from strata.conf.server import server_config

    argv = ["--model", str(_fixture("qwen3moe")), "--ram-budget-mib", "512.5", "--expert-cache", "40%"]
    cfg = server_config(build_parser().parse_args(["serve", *argv]), env={})
    gen = backend_options(build_parser().parse_args(["generate", "--prompt", "x", *argv]))
    assert cfg.engine == gen and gen["ram_budget_mib"] == 512.5
    assert EngineOptions.from_kwargs(**gen).ram_budget_mib == 512.5


def test_the_planner_shows_three_tiers(capsys):
    from strata.cli import main

    path = str(_fixture("qwen3moe"))
    base = ["plan", path, "--vram-gib", "0.5", "--expert-cache", "50%", "--json"]
    assert main(base) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["mmap_experts"] == 0 and full["ring_bytes"] == 0
    assert full["arena_experts"] == full["experts_total"]
    assert main([*base, "--ram-budget-mib", str(_budget(path, 3))]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["arena_experts"] == 3
    assert p["expert_slots"] + p["arena_experts"] + p["mmap_experts"] == p["experts_total"]
    assert p["mmap_bytes"] == p["mmap_experts"] * 6528 and p["ring_bytes"] > 0 and p["disk_gbps"] == 3.0
    share = p["mmap_experts"] / p["experts_total"]
    assert p["mmap_bytes_per_token"] == pytest.approx(share * p["routed_bytes_per_token"])
    assert p["pcie_bytes_per_token"] + p["mmap_bytes_per_token"] == pytest.approx(
        (1 - p["hit_rate_uniform"]) * p["routed_bytes_per_token"]
    )
    assert set(p["tiers"]) == {"vram", "pinned", "mmap"}
    for name, t in p["tiers"].items():
        assert {"experts", "bytes", "bytes_per_token", "gbps", "ms_per_token"} <= set(t), name
        assert t["ms_per_token"] == pytest.approx(t["bytes_per_token"] / (t["gbps"] * 1e9) * 1e3)
    assert p["tiers"]["mmap"]["bytes_per_token"] == p["mmap_bytes_per_token"]
    assert p["decode_tok_s"] < full["decode_tok_s"] and p["pcie_frac"] < 1, "the mapped misses are the CPU's"
    assert main([*base, "--ram-budget-mib", str(_budget(path, 3)), "--disk-gbps", "30"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_tok_s"] > p["decode_tok_s"]
    assert main(base[:-1] + ["--ram-budget-mib", str(_budget(path, 3))]) == 0
    text = capsys.readouterr().out
    assert "\nmmap " in text and "only in the file's mapping" in text and "per decode token: vram" in text
    assert main([*base, "--ram-budget-mib", "0.01"]) == 1
    assert "--ram-budget-mib=0.01" in capsys.readouterr().err


def test_the_cpu_share_reads_each_expert_at_its_own_address(tmp_path):
    """The low-RAM arena gives the CPU share an address per expert (a pinned row or the mapping): the answer
    is the one the per-layer base and stride give, and calls on mapped experts are counted apart."""
    from dataclasses import replace

    from gguf.constants import GGMLQuantizationType as T
    from test_cpu_share import _box, _experts

    from strata.jit.kernels import Kernels
    from strata.jit.share import CpuShare

    kernels = Kernels(tmp_path)
    raws, ex = _experts((T.Q8_0, T.Q8_0, T.Q8_0))
    copies = [[r[::-1].copy() for r in row] for row in raws]  # experts in reverse order elsewhere
    n_l, n_e = ex.bases.shape[0], raws[0][0].shape[0]
    addrs = np.array(
        [
            [
                [int(copies[li][p].ctypes.data) + (n_e - 1 - e) * int(ex.strides[li, p]) for e in range(n_e)]
                for p in range(3)
            ]
            for li in range(n_l)
        ],
        np.int64,
    )
    per_expert = replace(ex, bases=np.zeros_like(ex.bases), strides=np.zeros_like(ex.strides), addrs=addrs)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((3, ex.rows[0, 2])).astype(np.float32)
    ids = np.array([[0, 1, 2], [3, 4, 5], [5, 0, 2]], np.int32)
    wts = rng.random((3, 3)).astype(np.float32)
    a, b = CpuShare(kernels, ex, n_e, _box(), 2), CpuShare(kernels, per_expert, n_e, _box(), 2)
    try:
        b.mapped = np.zeros((n_l, n_e), bool)
        b.mapped[:, 5] = True
        for li in range(n_l):
            ya, _ = a.layer(li, h, ids, wts)
            yb, _ = b.layer(li, h, ids, wts)
            np.testing.assert_array_equal(ya, yb)
        got = b.take_mapped(3)
        per = int((ex.rows[0] * ex.row_bytes[0]).sum())
        assert got[:, 0].tolist() == [0, n_l, n_l] and got[:, 1].tolist() == [0, n_l * per, n_l * per]
    finally:
        a.close()
        b.close()


def test_mapped_only_misses_are_always_the_cpus_share():
    from strata.tiers.layout import ExpertLayer, Part
    from strata.tiers.slots import ExpertCache, NumpyBytes

    parts = tuple(Part(f"p{p}", 8, 32, 32, 34) for p in range(3))
    layout = ExpertLayout(8, 2, (ExpertLayer(0, parts), ExpertLayer(1, parts)), (1088, 1088, 1088))

    class Arena:
        memory = np.zeros((2, 3, 8, 1088), np.uint8)
        addrs = int(memory.ctypes.data) + np.arange(2 * 3 * 8, dtype=np.int64).reshape(2, 3, 8) * 1088
        held = np.zeros((2, 8), bool)
        held[:, 2:4] = True  # two misses of each layer in RAM, four only in the mapping

    cache = ExpertCache(layout, 4, NumpyBytes(4, layout.strides), Arena())
    cache.fill(None)
    assert np.array_equal(cache.in_ram, Arena.held) and cache.low_ram
    cache.share_with_cpu(0.0, (11, 22, 33))  # --pcie-frac 1: still every mapped-only miss on the CPU
    assert cache.cpu[:, 4:].all() and not cache.cpu[:, :4].any() and cache.pcie_frac == pytest.approx(2 / 6)
    cache.share_with_cpu(5 / 6, (11, 22, 33))  # five of six misses: the mapped four and the highest RAM one
    assert cache.cpu[:, 3:].all() and not cache.cpu[:, :3].any()
    assert (cache.where_kinds()[:, 4:] == -2).all()


def test_a_learning_policy_is_refused_in_low_ram_mode():
    path = _fixture("qwen3moe")
    with pytest.raises(ConfigError, match="cache_policy='adaptive'.*file's mapping.*keeps its fill"):
        Engine.load(
            path,
            device="cpu",
            backend="numpy",
            expert_cache="50%",
            cache_policy="adaptive",
            ram_budget_mib=_budget(path, 2),
        )

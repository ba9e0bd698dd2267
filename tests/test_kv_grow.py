"""--kv-grow on the CPU stand-in: the KV takes the expert cache's slots as contexts grow (strata.tiers.grow).

Invariants: a cache resized any way keeps every table entry right (a resident's entry is a slot holding its
bytes, byte for byte; every other entry is its home in the arena); the residents kept are those of highest
keep_rank; greedy tokens with --kv-grow equal those with a fixed cache and with every expert resident, while
the KV's growth really lends slots (the cache ends smaller); a finished sequence's KV gives them back; a
worst case that cannot fit is refused with the numbers.
"""

from __future__ import annotations

import ctypes
import gc
import json

import numpy as np
import pytest

from strata.engine import Engine
from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.sampling.params import SamplingParams
from strata.tiers.budget import MIB, Ledger, VramPlan
from strata.tiers.grow import SlotLender, worst_case
from strata.tiers.layout import ExpertLayout
from strata.tiers.slots import cpu_tiers


def _fixture():
    from flagship_checks import build
    from oracle import assets

    return build(assets.tiny_qwen3moe)["q8_0"]


def _bytes(addr: int, n: int) -> bytes:
    return ctypes.string_at(addr, n)


def _check_tables(cache) -> None:
    """Every resident's three entries are its slot, holding the arena's bytes; the rest are the arena."""
    n_l, n_e = cache.where.shape
    assert (cache.owner[:, 0] >= 0).sum() == cache.resident() <= cache.n_slots
    for li in range(n_l):
        for e in range(n_e):
            s = int(cache.where[li, e])
            for p in range(3):
                home, entry, size = (
                    int(cache.home[li, p, e]),
                    int(cache.full[li, p, e]),
                    int(cache.sizes[li, p]),
                )
                if s < 0:
                    assert entry == home
                    continue
                assert s < cache.n_slots and tuple(cache.owner[s]) == (li, e)
                assert entry == cache.slots.addr(p, s)
                assert _bytes(entry, size) == _bytes(home, size), (li, e, p)


def test_resize_keeps_the_tables_and_the_best_experts():
    gguf = GGUFFile(_fixture())
    lay = ExpertLayout.from_gguf(gguf)
    cache = cpu_tiers(gguf, "100%", kv_grow=True)
    assert cache.slots.per == 1 and cache.n_slots == lay.n_total  # 1/64 of the tiny fixture's experts: 1 slot
    rng = np.random.default_rng(0)
    cache.fill_rank = rng.permutation(lay.n_total).reshape(cache.where.shape).astype(np.float64)
    for n in (lay.n_total - 3, lay.n_total // 2, 1, 0, lay.n_total // 3, lay.n_total):
        cache.resize(n)
        assert cache.n_slots == n and cache.slots.capacity == max(n, 1)
        _check_tables(cache)
        if 0 < n < lay.n_total and n <= cache.resident():
            kept = cache.fill_rank[cache.where >= 0]
            assert kept.min() > cache.fill_rank[cache.where < 0].max(), "a better expert was dropped"


def test_the_lender_frees_whole_segments_and_reclaims_them():
    gguf = GGUFFile(_fixture())
    cache = cpu_tiers(gguf, "100%", kv_grow=True)
    sb, n0 = cache.layout.slot_bytes, cache.n_slots
    ledger = Ledger(n0 * sb, n0 * sb)
    lender = SlotLender(cache, ledger)
    ledger.take(int(2.5 * sb), "KV")  # three slots' worth must go
    assert cache.n_slots == n0 - 3 and ledger.used <= ledger.budget
    assert lender.lent_segments == 3
    ledger.give(int(2.5 * sb))
    assert lender.reclaim() == 2  # one segment stays free for the KV's next growth (SLACK_SEGMENTS)
    assert cache.n_slots == n0 - 1 and ledger.used <= ledger.budget
    _check_tables(cache)
    with pytest.raises(Exception, match="VRAM budget"):
        ledger.take((n0 + 1) * sb, "KV")  # past every slot: the typed budget error, the cache emptied
    assert cache.n_slots == 0


def _greedy(engine: Engine, ids: list[int], n: int = 6) -> list[int]:
    gen = engine.generate(ids, max_tokens=n, params=SamplingParams(temperature=0.0), ignore_eos=True)
    return gen.run().tokens


@pytest.mark.parametrize("policy", ["static", "adaptive"])
def test_kv_grow_gives_the_fixed_cache_tokens(policy):
    path = _fixture()
    ids = [int(v) for v in np.random.default_rng(1).integers(10, 5000, 300)]  # > BORROW_MIN: borrows too
    ref = _greedy(Engine.load(path, device="cpu", backend="numpy"), ids)
    fixed = Engine.load(path, device="cpu", backend="numpy", expert_cache="100%", cache_policy=policy)
    assert _greedy(fixed, ids) == ref
    grown = Engine.load(
        path, device="cpu", backend="numpy", expert_cache="100%", cache_policy=policy, kv_grow=True
    )
    cache, ledger = grown.expert_cache, grown.model.kv_ledger
    n0 = cache.n_slots
    assert _greedy(grown, ids) == ref
    assert cache.lender.lends >= 1, "the KV never took a slot"
    assert ledger.used <= ledger.budget
    gc.collect()  # the finished request's KV is gone: its slots come back at the next pass
    assert ledger.used == cache.n_slots * cache.layout.slot_bytes
    assert _greedy(grown, ids[:20], 2) == _greedy(
        Engine.load(path, device="cpu", backend="numpy"), ids[:20], 2
    )
    assert cache.n_slots == n0 - cache.lender.lent_segments * cache.lender.per


def test_kv_grow_needs_a_cache_on_the_cpu():
    with pytest.raises(ConfigError, match="expert_cache"):
        Engine.load(_fixture(), device="cpu", backend="numpy", kv_grow=True)


def test_kv_grow_needs_every_expert_in_ram():
    """Under a RAM budget that keeps some experts only in the file's mapping, a lent slot's expert could land
    where decode cannot read it on the GPU: refused, naming both settings (the seeds' engine turns the
    combination off too)."""
    from test_low_ram import _budget

    path = _fixture()
    kw = {"device": "cpu", "backend": "numpy", "expert_cache": "50%", "routing_profile": "off"}
    with pytest.raises(ConfigError, match=r"kv_grow.*ram_budget_mib"):
        Engine.load(path, ram_budget_mib=_budget(path, 2), kv_grow=True, **kw)
    lay = ExpertLayout.from_gguf(GGUFFile(path))
    eng = Engine.load(path, ram_budget_mib=lay.n_total * lay.slot_bytes / MIB, kv_grow=True, **kw)
    assert eng.expert_cache.lender is not None  # a budget with room for every expert: lent as usual


def test_a_worst_case_that_cannot_fit_is_refused():
    assert worst_case(100 * MIB, 40 * MIB, 50 * MIB, MIB, "vram_budget_mib") == 10
    with pytest.raises(ConfigError, match=r"vram_budget_mib.*70\.0 MiB.*10\.0 MiB more"):
        worst_case(100 * MIB, 40 * MIB, 70 * MIB, MIB, "vram_budget_mib")
    plan = VramPlan(100 * MIB, {"weights": 40 * MIB, "KV cache (1 x 512 positions, growing)": MIB})
    plan.slot_bytes, plan.n_total = MIB, 100
    plan.size_cache()
    assert plan.n_slots == 59


def test_the_planner_shows_the_worst_case(capsys):
    from strata.cli import main

    path, args = _fixture(), ["--vram-gib", "0.45", "--parallel", "4", "--kv-grow"]
    assert main(["plan", str(path), *args, "--ctx-size", "32768", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = out["kv_grow"]
    assert got["kv_full_bytes"] == 4 * 32768 * out["kv_bytes_per_token"]["f16"]
    assert got["slots_worst"] <= got["slots_start"] == out["expert_slots"]
    assert 0 < got["hit_rate_worst"] <= 1 and got["decode_tok_s_worst"] > 0
    assert main(["plan", str(path), *args, "--ctx-size", "262144"]) == 1  # 4 x 256k of KV cannot fit
    assert "every sequence's KV at the whole context" in capsys.readouterr().err


def test_four_sequences_grow_together():
    """Four sequences' KVs grow in one batch until they take most of the stand-in cache: the batched logits
    equal a fixed cache's, the ledger never passes its budget, and the slots come back when they end."""
    path = _fixture()
    rng = np.random.default_rng(4)
    prompts = [rng.integers(10, 5000, 260 + 10 * i) for i in range(4)]  # past the plan's 4 x 512 together
    outs = []
    for extra in ({}, {"kv_grow": True}):
        eng = Engine.load(path, device="cpu", backend="numpy", expert_cache="100%", n_seq=4, **extra)
        states = [eng.new_state() for _ in prompts]
        got = [eng.model.forward(p, s, all_logits=False)[-1] for p, s in zip(prompts, states)]
        for step in range(3):
            got += eng.model.forward_batch([np.array([7 + step])] * 4, states)
        outs.append(got)
        if extra:
            cache, ledger = eng.expert_cache, eng.model.kv_ledger
            assert cache.lender.lends >= 1 and ledger.used <= ledger.budget
            lent = cache.lender.start_slots - cache.n_slots
            assert lent > 0
            del states
            gc.collect()
            eng.model.forward(prompts[0][:3], eng.new_state(), all_logits=False)  # a pass reclaims
            assert cache.n_slots > cache.lender.start_slots - lent
    for a, b in zip(*outs):
        assert np.array_equal(a, b)

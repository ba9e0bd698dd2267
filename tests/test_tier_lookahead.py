"""Lookahead prefetch on the CPU stand-in (`--device cpu --expert-cache SIZE --prefetch K`,
tiers/lookahead.py).

Invariants: every K gives the all-resident greedy tokens (the staging only moves bytes) on qwen3moe,
qwen3next and qwen4exp (whose layers predict from the attention mixer's mixed input); decode layers stage at
most K predicted misses, whole, and their experts read the staged copies; the counters add up (used + wasted
= copied, parts = 3 x experts); the host's pick is the GPU kernel's (its numpy twin); a trace recorded with
prefetch on replays (`tiers simulate --recorded`) to the engine's hit and prefetch counters exactly, for
static and lru.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_tiers import _fixture, _greedy

from strata.engine import Engine
from strata.gpu.kernels import tiers as kt
from strata.tiers import trace
from strata.tiers.lookahead import pick

PROMPT = list(range(30, 60))


def _any_fixture(arch: str):
    if arch != "qwen4exp":
        return _fixture(arch)
    from flagship_checks import build
    from oracle import flagship

    return build(flagship.tiny_qwen4exp)["f32"]


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next", "qwen4exp"])
def test_every_k_gives_the_all_resident_tokens(arch):
    path = _any_fixture(arch)
    want = _greedy(Engine.load(path, device="cpu", backend="numpy"), PROMPT, 8).tokens
    for k in (0, 1, 4, 32):
        eng = Engine.load(path, device="cpu", backend="numpy", expert_cache="off", prefetch=k)
        cache = eng.expert_cache
        read: list[int] = []  # staged experts whose table entries pointed at the staging slots
        real = cache.layer_table

        def spy(li, real=real, cache=cache, read=read, k=k):  # the staged entries it reads
            table = real(li)
            if cache._ahead is not None:
                base = cache._ahead_store.addr(0, 0)
                read.extend(
                    e
                    for e in cache._ahead[1].tolist()
                    if table[0, e] - base in range(0, k * cache.layout.strides[0], cache.layout.strides[0])
                )
            return table

        cache.layer_table = spy  # type: ignore[method-assign]
        res = _greedy(eng, PROMPT, 8)
        assert res.tokens == want, f"{arch} prefetch {k}"
        pf = cache.prefetch
        n_l, top_k = len(cache.layout.layers), cache.layout.top_k
        if k == 0:
            assert pf.staged == 0 and not read
            continue
        decode_layers = (len(res.tokens) - 1) * n_l
        assert 0 < pf.staged <= 3 * min(k, top_k) * decode_layers and pf.staged % 3 == 0
        assert pf.staged == 3 * len(read)  # every staged expert was read from its staging slot
        assert pf.used <= pf.staged and pf.used_bytes + pf.wasted_bytes == pf.copied_bytes
        assert pf.copy_ns > 0


def test_the_host_pick_is_the_kernels():
    rng = np.random.default_rng(5)
    for _ in range(100):
        pred = np.stack([rng.permutation(12)[:3] for _ in range(int(rng.integers(1, 5)))]).astype(np.int32)
        where = np.where(rng.random(12) < 0.5, 3, -1).astype(np.int32)
        k = int(rng.integers(1, 8))
        want = kt.ref_prefetch_pick(pred, where, k)
        np.testing.assert_array_equal(pick(pred, where == -1, k), want[want >= 0])


@pytest.mark.parametrize("name", ["static", "lru"])
def test_a_trace_recorded_with_prefetch_replays_its_counters(tmp_path, capsys, name):
    from strata.cli import main

    out = tmp_path / "routes.npz"
    eng = Engine.load(
        _fixture("qwen3moe"),
        device="cpu",
        backend="numpy",
        expert_cache="50%",
        prefetch=2,
        cache_policy=name,
        record_routes=str(out),
    )
    res = _greedy(eng, PROMPT, 10)
    eng.expert_cache.recorder.save()
    ahead = trace.load_ahead(out)
    assert ahead is not None and ahead.k == 2
    n = len(PROMPT)
    assert (ahead.pred[:n] == -1).all() and (ahead.pred[n:] >= 0).all()  # decode passes predict, prefill not
    use, pf = res.timings.experts, eng.expert_cache.prefetch
    assert main(["tiers", "simulate", str(out), "--policy", name, "--recorded", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)[0]
    assert got["lookups"] == use.prefill.lookups + use.decode.lookups
    assert got["hits"] == use.prefill.hits + use.decode.hits
    want = {k: v for k, v in pf.status().items() if k != "copy_seconds"}
    assert got["prefetch"] == want and pf.staged > 0
    # the same predictions replayed at other K: none at 0, no fewer parts staged at a larger K
    replay = ["tiers", "simulate", str(out), "--policy", name, "--recorded", "--json", "--prefetch"]
    assert main([*replay, "0"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["prefetch"] is None
    assert main([*replay, "8"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["prefetch"]["staged_parts"] >= pf.staged

"""The expert-cache policies (tiers/policy.py) replayed by the simulator (tiers/sim.py) on the calibrated
synthetic trace (tiers/trace.py): its LRU hit rates are close to the published Qwen3.8-Flash-Next figures
(LRU-64 ~67%, LRU-128 ~81%, a static top-32 profile ~10% on the other half of the workload); the adaptive
policy hits at least as often as LRU at every size from 32 to 256 slots per layer, with no more copies (within
1%). Measured on this trace (seed 2, 2 layers, 1,500 tokens, one-token windows), adaptive vs LRU hits and
copies: 32 slots 5,199 vs 5,150 (34.7% vs 34.3%), 4,944 vs 9,850 copies; 64 slots 10,339 vs 10,327 (68.9% vs
68.9%), 4,661 vs 4,673; 128 slots 12,881 vs 12,823 (85.9% vs 85.5%), 2,119 vs 2,177; 256 slots 13,694 vs
13,652 (91.3% vs 91.0%), 1,306 vs 1,348 (with a 16-token recency window at every size, as before its window
grew with the cache: 12,972 and 13,733). At 64 slots adaptive hits 3.8 times as often as the static profile.
On seed 7 (same shape): +104, +14, +45 and +57 hits at 32, 64, 128 and 256 slots. 64 slots is the thin one:
the cache is smaller than the set of recently used experts (~79), so what LRU keeps is nearly what any policy
can keep, and the margin is a few tens of hits on 15,000 lookups. The cache changes between windows; a
window's lookups see it as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata.tiers import policy, sim, trace


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return trace.synthetic(trace.Synthetic(**{**_fields(trace.CALIBRATED), "layers": 2}), 1500, seed=2)


def _fields(spec: trace.Synthetic) -> dict:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


def test_calibrated_trace_matches_the_published_lru_rates(ids) -> None:
    assert 0.62 <= sim.simulate(ids, 512, 64, "lru").hit_rate <= 0.72
    assert 0.78 <= sim.simulate(ids, 512, 128, "lru").hit_rate <= 0.90
    assert sim.simulate(ids, 512, 32, "static").hit_rate <= 0.15


@pytest.mark.parametrize("slots", [32, 64, 128, 256])
def test_adaptive_is_at_least_lru_with_fewer_swaps(ids, slots) -> None:
    lru, ada = sim.simulate(ids, 512, slots, "lru"), sim.simulate(ids, 512, slots, "adaptive")
    assert ada.hits >= lru.hits and ada.swaps <= 1.01 * lru.swaps
    assert ada.lookups == lru.lookups == 750 * 2 * 10


def test_adaptive_is_at_least_lru_on_another_seed() -> None:
    other = trace.synthetic(trace.Synthetic(**{**_fields(trace.CALIBRATED), "layers": 2}), 1500, seed=7)
    for slots in (32, 64, 128, 256):
        lru, ada = sim.simulate(other, 512, slots, "lru"), sim.simulate(other, 512, slots, "adaptive")
        assert ada.hits >= lru.hits and ada.swaps <= 1.01 * lru.swaps, slots


def test_riding_never_copies_and_moves_fewer_experts_than_copying(ids) -> None:
    """--admit ride (the GPU's newcomers land from the read of their first use): on the calibrated trace at
    the 80B's 24 GiB share (230 of 512 slots, 4-token windows, 6 newcomers a window) riders hit later than
    copies (75.4% against 81.7%) but nothing is copied, so fewer experts cross the link a token: 4.92 against
    5.15 (static 9.94)."""
    win = np.full(375, 4)
    copy = sim.simulate(ids, 512, 230, "adaptive", windows=win, budget=6)
    ride = sim.simulate(ids, 512, 230, "adaptive", windows=win, budget=6, admit="ride")
    static = sim.simulate(ids, 512, 230, "static", windows=win)
    assert ride.copies == 0 and copy.copies == copy.swaps > 0 and ride.swaps == copy.swaps
    assert ride.hits < copy.hits

    def link(r: sim.Result) -> int:
        return r.lookups - r.hits + r.copies

    assert link(ride) < link(copy) < link(static) / 1.5


@pytest.mark.parametrize("admit", ["copy", "ride"])
def test_a_warm_up_from_the_engines_fill_learns_unscored(ids, admit) -> None:
    """`scored` (perf/learning_ceiling.py's replay of the GPU bench): from the static fill, every window
    learns, only the last `scored` tokens count. Scoring all of them is the engine's own replay; a static
    cache's scored hits are the fill's lookups in those tokens; learning beats the fill on a local trace."""
    fill = np.zeros((2, 512), bool)
    fill[:, :230] = True
    win = np.array([515] + [4] * 246 + [1])  # the prompt's pass and 3 tokens, then 4-token windows

    def run(name: str, scored: int | None) -> sim.Result:
        return sim.simulate(
            ids, 512, 0, name, resident=fill, windows=win, budget=6, admit=admit, scored=scored
        )

    assert run("adaptive", None) == run("adaptive", 1500)
    static = run("static", 64)
    assert static.lookups == 64 * 2 * 10 and static.hits == fill[np.arange(2)[None, :, None], ids[-64:]].sum()
    late, whole = run("adaptive", 64), run("adaptive", None)
    assert late.lookups == 64 * 2 * 10 and 0 < late.swaps < whole.swaps
    assert late.hit_rate > whole.hit_rate > static.hit_rate  # warmed, it hits more than over the whole run


def test_adaptive_doubles_the_static_profile_at_64(ids) -> None:
    assert (
        sim.simulate(ids, 512, 64, "adaptive").hit_rate >= 2 * sim.simulate(ids, 512, 64, "static").hit_rate
    )


def _step(p: policy.Policy, row: list[int]) -> int:
    """A window of one token (one layer): its hits, then the update."""
    w = np.array([row])[:, None, :]
    hits = int(policy.window_hits(p, w).sum())
    p.update(w)
    return hits


def _one_layer(name: str, slots: int, n_expert: int = 8, **kw) -> policy.Policy:
    p = policy.make(name, slots, n_expert, n_layers=1)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_policies_on_hand_made_streams() -> None:
    lru = _one_layer("lru", 2)
    assert [_step(lru, r) for r in ([1], [2], [1], [3], [2])] == [0, 0, 1, 0, 0]  # 3 evicted 2
    # adaptive, one slot, a window of one token: an expert that keeps coming back keeps its slot against
    # one-offs (LRU would swap every token and never hit); when nothing comes back but each expert is used
    # twice in a row, recency decides, as in LRU
    ada = _one_layer("adaptive", 1, 16, window=1, per_slot=0.0)
    back = [[5], [1], [5], [2], [5], [3], [5], [4], [5]]
    assert [_step(ada, r) for r in back] == [0, 0, 1, 0, 1, 0, 1, 0, 1] and ada.resident[0, 5]
    ada = _one_layer("adaptive", 1, 16, window=1, per_slot=0.0)
    assert [_step(ada, r) for r in ([1], [1], [2], [2], [3], [3])] == [0, 1, 0, 1, 0, 1]
    assert _step(policy.Static(np.isin(np.arange(8), [1, 2])[None]), [1, 3, 2]) == 2
    with pytest.raises(ValueError, match="known"):
        policy.make("mru", 4, 8)
    empty = _one_layer("lru", 0)
    assert _step(empty, [1]) == 0 and _step(empty, [1]) == 0
    # a window of two tokens sees the cache as it found it: the second token's 1 misses too
    lru = _one_layer("lru", 2)
    w = np.array([[[1]], [[1]]])
    assert policy.window_hits(lru, w).sum() == 0
    lru.update(w)
    assert lru.resident[0, 1] and lru.resident.sum() == 1


def test_admit_swaps_only_past_the_margin() -> None:
    """A candidate replaces the weakest resident only when its priority beats it by the margin; a free slot
    takes it whatever its priority."""
    prio = np.array([[1.0, 1.2, 0.5, 0.0]])
    cand = np.array([[False, True, False, False]])
    for margin, swapped in ((0.25, False), (0.1, True)):
        resident = np.array([[True, False, False, False]])
        policy._admit(resident, prio, cand, np.array([1]), margin, None)
        assert resident[0, 1] == swapped and resident[0, 0] != swapped
    resident = np.array([[True, False, False, False]])
    policy._admit(resident, prio, cand, np.array([2]), 5.0, None)
    assert resident[0, :2].all()


def test_lru_matches_an_ordered_per_token_lru() -> None:
    """The stamp form holds, after every token, what an OrderedDict LRU fed token by token holds."""
    from collections import OrderedDict

    rng = np.random.default_rng(5)
    ids = rng.integers(0, 40, (300, 1, 4))
    p, want = _one_layer("lru", 7, 40), OrderedDict()
    for row in ids:
        p.update(row[None])
        for e in row[0].tolist():
            want.pop(e, None)
            want[e] = None
            if len(want) > 7:
                want.popitem(last=False)
        assert set(np.flatnonzero(p.resident[0])) == set(want)


def test_budget_caps_the_copies_best_first() -> None:
    """Two layers want 3 newcomers each; a budget of 2 brings in the two best scores over both layers."""
    p = policy.make("adaptive", 3, 8, n_layers=2)
    w = np.array([[[0, 1, 2], [3, 4, 5]], [[0, 1, 2], [3, 4, 6]], [[0, 1, 2], [3, 4, 6]]])
    p.update(w, budget=2)
    assert p.resident.sum() == 2
    thrice = np.zeros((2, 8), bool)
    thrice[0, [0, 1, 2]] = thrice[1, [3, 4]] = True
    assert not (p.resident & ~thrice).any()  # only experts used by all three tokens
    p.update(w[:1], budget=None)
    assert (p.resident.sum(axis=1) == 3).all()


def test_cli_round_trip(tmp_path, capsys) -> None:
    from strata.cli import main

    out = tmp_path / "t.npz"
    assert main(["tiers", "trace", "--synthetic", "--tokens", "200", "--layers", "1", "-o", str(out)]) == 0
    capsys.readouterr()
    ids, n_expert = trace.load(out)
    assert ids.shape == (200, 1, 10) and n_expert == 512
    assert all(len(set(row)) == 10 for row in ids[:, 0])  # a token routes to distinct experts
    assert main(["tiers", "simulate", str(out), "--sweep", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert {(r["policy"], r["slots"]) for r in got} == {
        (p, s) for p in policy.POLICIES for s in (32, 64, 128, 256)
    }
    want = sim.simulate(ids, n_expert, 64, "lru")
    assert next(r for r in got if r["policy"] == "lru" and r["slots"] == 64)["hits"] == want.hits


def test_the_sweep_prints_seed_003s_table_and_draws_the_curve(tmp_path, capsys) -> None:
    from strata.cli import main

    out, png = tmp_path / "t.npz", tmp_path / "curve" / "sweep.png"
    assert main(["tiers", "trace", "--synthetic", "--tokens", "120", "--layers", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    ids, n_expert = trace.load(out)
    args = ["tiers", "simulate", str(out), "--sweep", "--sizes", "64,16,600", "--plot", str(png)]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["slots/layer", "experts"]
    got = [line.split()[:2] for line in lines[1:4]]
    assert got == [["16", "3.1%"], ["64", "12.5%"], ["512", "100.0%"]]  # past the experts: the whole layer
    want = sim.simulate(ids, n_expert, 16, "adaptive")
    cells = lines[1].split("|")[1 + policy.POLICIES.index("adaptive")].split()
    scored = want.lookups / (2 * ids.shape[2])
    assert cells == [
        f"{want.hit_rate:.1%}",
        f"{(1 - want.hit_rate) * 2 * ids.shape[2]:.1f}",
        f"{want.swaps / scored:.1f}",
    ]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and lines[-1] == f"curve: {png}"
    for bad in (["--sizes=-1,64"], ["--sizes", "a"], ["--plot", str(png)]):
        extra = [] if bad[0] == "--plot" else ["--sweep"]
        assert main(["tiers", "simulate", str(out), *extra, *bad]) == 1
        assert bad[0].split("=")[0] in capsys.readouterr().err


def test_windows_and_a_swap_budget_replay_as_the_engine_learns(tmp_path, capsys) -> None:
    """--window T --swap-budget E: the policy learns every T tokens and copies at most E experts a window (the
    engine's LEARN_EVERY passes and --swap-budget-mib); the JSON gives what sim.simulate gives for the same
    windows, with the misses and swaps a token, and fewer swaps than with no budget. Bad values, and either
    flag with --recorded (which replays the run's own), are refused."""
    from strata.cli import main

    out = tmp_path / "t.npz"
    assert main(["tiers", "trace", "--synthetic", "--tokens", "402", "--layers", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    ids, n_expert = trace.load(out)
    base = ["tiers", "simulate", str(out), "--slots", "64", "--policy", "lru", "--json"]
    assert main([*base, "--window", "4", "--swap-budget", "6"]) == 0
    got = json.loads(capsys.readouterr().out)[0]
    windows = np.array([4] * 100 + [2])
    want = sim.simulate(ids, n_expert, 64, "lru", windows=windows, budget=6)
    assert (got["hits"], got["swaps"]) == (want.hits, want.swaps)
    scored = want.lookups / (2 * ids.shape[2])
    assert got["swaps_per_token"] == pytest.approx(want.swaps / scored)
    assert got["misses_per_token"] == pytest.approx((want.lookups - want.hits) / scored)
    assert main([*base, "--window", "4"]) == 0
    free = json.loads(capsys.readouterr().out)[0]
    assert 0 < got["swaps"] < free["swaps"] and got["swaps"] <= 6 * 51  # the scored half's windows, 6 each
    for bad in (["--window", "0"], ["--swap-budget", "-1"], ["--window", "4", "--recorded"]):
        assert main([*base, *bad]) == 1
        assert bad[0] in capsys.readouterr().err


def test_a_recorded_trace_replays_to_the_engines_own_counters(tmp_path, capsys) -> None:
    """--record-routes on the CPU tiers, then `strata tiers simulate --policy static --recorded`: the same
    lookups and hits the engine counted (prefill and decode), exactly."""
    from test_tiers import _fixture, _greedy

    from strata.cli import main
    from strata.engine import Engine

    out = tmp_path / "routes.npz"
    eng = Engine.load(
        _fixture("qwen3moe"), device="cpu", backend="numpy", expert_cache="50%", record_routes=str(out)
    )
    res = _greedy(eng, list(range(30, 60)), 6)
    eng.expert_cache.recorder.save()
    use = res.timings.experts
    ids, _ = trace.load(out)
    assert ids.shape[0] == len(res.prompt_ids) + len(res.tokens) - 1  # every token fed, in order
    assert main(["tiers", "simulate", str(out), "--policy", "static", "--recorded", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)[0]
    assert got["lookups"] == use.prefill.lookups + use.decode.lookups
    assert got["hits"] == use.prefill.hits + use.decode.hits


@pytest.mark.parametrize("name", ["lru", "adaptive"])
def test_engine_policies_keep_the_tokens_and_replay_exactly(tmp_path, capsys, name) -> None:
    """--cache-policy on the CPU tiers swaps experts between passes: the greedy tokens stay those of the
    all-resident model (the cache only moves bytes), and the recorded trace replays to the engine's
    counters."""
    from test_tiers import _fixture, _greedy

    from strata.cli import main
    from strata.engine import Engine

    path, prompt = _fixture("qwen3moe"), list(range(30, 60))
    want = _greedy(Engine.load(path, device="cpu", backend="numpy"), prompt, 8).tokens
    out = tmp_path / "routes.npz"
    eng = Engine.load(
        path, device="cpu", backend="numpy", expert_cache="50%", cache_policy=name, record_routes=str(out)
    )
    res = _greedy(eng, prompt, 8)
    assert res.tokens == want
    assert eng.expert_cache.swaps > 0
    eng.expert_cache.recorder.save()
    use = res.timings.experts
    assert main(["tiers", "simulate", str(out), "--policy", name, "--recorded", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)[0]
    assert got["lookups"] == use.prefill.lookups + use.decode.lookups
    assert got["hits"] == use.prefill.hits + use.decode.hits
    assert got["swaps"] == eng.expert_cache.swaps


def test_simulate_predicts_decode_as_the_planner_does(tmp_path, capsys) -> None:
    """`tiers simulate --model F`: the planner's decode tok/s at each result's hit rate. At the uniform hit
    rate it is the planner's own prediction with every miss over PCIe; more hits predict more tok/s."""
    from test_tiers import _fixture, _greedy

    from strata.cli import main
    from strata.engine import Engine
    from strata.gguf import GGUFFile
    from strata.gguf.names import Keys
    from strata.tiers.plan import LAYER_FLOOR_US, pcie_decode_tok_s

    path = _fixture("qwen3moe")
    out = tmp_path / "routes.npz"
    eng = Engine.load(path, device="cpu", backend="numpy", expert_cache="50%", record_routes=str(out))
    _greedy(eng, list(range(30, 60)), 6)
    eng.expert_cache.recorder.save()
    args = ["tiers", "simulate", str(out), "--sweep", "--model", str(path), "--pcie-gbps", "20", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["predicted_decode_tok_s"] > 0 for r in rows)
    best, worst = max(rows, key=lambda r: r["hit_rate"]), min(rows, key=lambda r: r["hit_rate"])
    assert (
        best["hit_rate"] == worst["hit_rate"]
        or best["predicted_decode_tok_s"] > worst["predicted_decode_tok_s"]
    )
    assert (
        main(
            [
                "plan",
                str(path),
                "--vram-gib",
                "0.5",
                "--expert-cache",
                "50%",
                "--pcie-frac",
                "1",
                "--pcie-gbps",
                "20",
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    floor = GGUFFile(path).arch_get(Keys.BLOCK_COUNT) * plan["layer_floor_us"] * 1e-6
    assert plan["layer_floor_us"] == LAYER_FLOOR_US["moe"]  # qwen3moe: measured on the H200
    want = pcie_decode_tok_s(
        plan["dense_bytes_per_token"],
        plan["routed_bytes_per_token"],
        plan["hit_rate_uniform"],
        900.0,
        20.0,
        floor_s=floor,
    )
    assert want == pytest.approx(plan["decode_tok_s"], rel=1e-9)


def test_the_prediction_holds_swaps_to_the_misses_link():
    """A learning policy's swaps copy on a side stream: beside a long enough step they cost nothing, and past
    it the token lasts its misses and swaps over the link."""
    from strata.tiers.plan import MISS_EFFICIENCY, pcie_decode_tok_s

    dense, routed, hit = 2e9, 500e6, 0.8  # 100 MB of misses a token
    step, misses = 2.4e9 / 1e12, 100e6 / (50e9 * MISS_EFFICIENCY)  # the dense and hit bytes at 1 TB/s
    plain = pcie_decode_tok_s(dense, routed, hit, 1000.0, 50.0)
    assert plain == pytest.approx(1 / (step + misses))
    beside = pcie_decode_tok_s(dense, routed, hit, 1000.0, 50.0, swap=50e6)  # 1 ms of copies, 2.4 of step
    assert beside == pytest.approx(plain)
    slow = pcie_decode_tok_s(dense, routed, hit, 1000.0, 50.0, swap=200e6)
    assert slow == pytest.approx(1 / (misses + 200e6 / 50e9)) and slow < plain


def test_the_planner_credits_the_lookahead_with_what_its_window_copies(capsys):
    """The lookahead's credit against the H200's counts at 24 GB, one sequence (perf/README.md): 80B shape
    (Q4_K experts of 3 x 589,824 bytes, 43 us a layer at 51 GB/s probed) used 64 MB a token, the flagship
    (same experts, 97.5 us at 50.2 GB/s) 187, where the credit gives 75 and 186: the window's copies less
    half a matrix, capped by --prefetch and by the misses. On the qwen3next fixture `strata plan` credits its
    hybrid layers (its experts are tiny: every miss comes ahead) and --prefetch 0 gives the plain
    prediction."""
    from test_tiers import _fixture

    from strata.cli import main
    from strata.tiers.plan import LOOKAHEAD_US, ahead_per_layer

    slot = 3 * 589_824
    big = 10 * slot  # a layer's misses: more than any window
    assert 48 * ahead_per_layer(big, slot, 4, LOOKAHEAD_US["hybrid"], 51e9) / 1e6 == pytest.approx(
        64, rel=0.2
    )
    assert 48 * ahead_per_layer(big, slot, 4, LOOKAHEAD_US["streams"], 50.2e9) / 1e6 == pytest.approx(
        187, rel=0.05
    )
    assert ahead_per_layer(big, slot, 1, LOOKAHEAD_US["streams"], 50.2e9) == slot - slot / 6  # one expert
    assert ahead_per_layer(slot / 2, slot, 4, LOOKAHEAD_US["streams"], 50.2e9) == slot / 2  # the misses
    assert ahead_per_layer(big, slot, 0, LOOKAHEAD_US["streams"], 50.2e9) == 0.0

    path = _fixture("qwen3next")
    args = ["plan", str(path), "--vram-gib", "0.5", "--expert-cache", "25%", "--pcie-frac", "1", "--json"]
    got = {}
    for k in (0, 4):
        assert main([*args, "--prefetch", str(k)]) == 0
        got[k] = json.loads(capsys.readouterr().out)
    assert got[0]["ahead_bytes_per_token"] == 0.0
    assert 0 < got[4]["ahead_bytes_per_token"] <= got[4]["pcie_bytes_per_token"]
    assert got[4]["decode_tok_s"] > got[0]["decode_tok_s"]
    assert main([*args, "--prefetch", "-1"]) == 1
    assert "--prefetch" in capsys.readouterr().err


def test_a_recorder_keeps_the_policys_windows(tmp_path) -> None:
    """The GPU learns every LEARN_EVERY passes with a budget for all of them: its trace's windows are those
    passes together (a replay that learned after each pass with that budget admitted four times as much)."""
    out = tmp_path / "r.npz"
    rec = trace.Recorder(out, 8, np.zeros((2, 8), bool), budget=3, passes=4)
    for n in (5, 1, 1, 1, 1, 1):
        rec.end_pass([np.zeros((n, 2), np.int64), np.ones((n, 2), np.int64)])
    rec.save()
    _, windows, budget = trace.load_recorded(out)
    assert windows.tolist() == [8, 2] and budget == 3
    assert trace.load(out)[0].shape == (10, 2, 2)


def test_a_recorded_slice_is_scored_after_the_run_before_it(tmp_path, capsys) -> None:
    """--score A:B (with --recorded): the replay of tokens A to B after the windows before A learned, as
    sim.simulate's `scored` gives it on the trace cut at B; without --recorded, or out of range, refused."""
    from strata.cli import main

    ids = trace.synthetic(trace.Synthetic(**{**_fields(trace.CALIBRATED), "layers": 2}), 300, seed=3)
    fill = np.zeros((2, 512), bool)
    fill[:, :200] = True
    windows = np.array([100] + [4] * 50)
    out = tmp_path / "r.npz"
    trace.save(out, ids, 512, fill, windows, 12)
    base = ["tiers", "simulate", str(out), "--policy", "adaptive", "--admit", "ride", "--json"]
    assert main([*base, "--recorded", "--score", "150:250"]) == 0
    got = json.loads(capsys.readouterr().out)[0]
    cut = np.array([100] + [4] * 37 + [2])  # the window 250 falls in ends there
    want = sim.simulate(
        ids[:250], 512, 0, "adaptive", resident=fill, windows=cut, budget=12, admit="ride", scored=100
    )
    assert (got["lookups"], got["hits"], got["swaps"]) == (100 * 2 * 10, want.hits, want.swaps)
    assert got["misses_per_token"] == pytest.approx((want.lookups - want.hits) / 100)
    for bad in (["--score", "150:250"], ["--recorded", "--score", "250:150"], ["--recorded", "--score", "x"]):
        assert main([*base, *bad]) == 1
        assert "--score" in capsys.readouterr().err

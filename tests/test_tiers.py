"""Expert tiers on the CPU stand-in (numpy slots over the mmap): the same tier manager the GPU runs.

Invariants: any cache size (off, one slot, 50%, 100%) gives the same greedy tokens as all-resident,
with prompts long enough to borrow slots; the counters are exact (lookups = routed (token, layer,
expert) triples, all hits at 100%, none with the cache off, decode PCIe bytes = misses x expert bytes);
borrowed slots get their own bytes back; budgets refuse with the plan; the kernel twins agree with
the host counting.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.engine import Engine
from strata.errors import ConfigError
from strata.gpu.kernels import tiers as kt
from strata.sampling.params import SamplingParams
from strata.tiers.budget import MIB, VramPlan, cache_request, check_expert_cache
from strata.tiers.layout import ExpertLayout

SIZES = ["off", "one", "50%", "100%"]
PROMPT = 300  # > BORROW_MIN: the first chunk borrows slots (chunk 512 on the CPU)


def _fixture(arch: str):
    from flagship_checks import build
    from oracle import assets, flagship

    return build(assets.tiny_qwen3moe if arch == "qwen3moe" else flagship.tiny_qwen3next)["q8_0"]


def _size(path, size: str) -> str:
    if size != "one":
        return size
    from strata.gguf import GGUFFile

    return f"{(ExpertLayout.from_gguf(GGUFFile(path)).slot_bytes + 1) / MIB:.6f}MiB"


def _greedy(engine: Engine, ids: list[int], n: int = 6):
    gen = engine.generate(ids, max_tokens=n, params=SamplingParams(temperature=0.0), ignore_eos=True)
    return gen.run()


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_any_cache_size_gives_the_all_resident_tokens(arch):
    path = _fixture(arch)
    ids = [int(v) for v in np.random.default_rng(0).integers(10, 5000, PROMPT)]
    ref = _greedy(Engine.load(path, device="cpu", backend="numpy"), ids)
    for size in SIZES:
        eng = Engine.load(path, device="cpu", backend="numpy", expert_cache=_size(path, size))
        cache = eng.expert_cache
        assert cache is not None
        before = [a.copy() for a in cache.slots.arrays]
        staged: list[int] = []
        real = cache.stage_rows

        def spy(st, li, staged=staged, real=real):
            staged.append(li)
            return real(st, li)

        cache.stage_rows = spy  # type: ignore[method-assign]
        res = _greedy(eng, ids)
        assert res.tokens == ref.tokens, f"{arch} cache {size}"
        assert all(np.array_equal(a, b) for a, b in zip(before, cache.slots.arrays)), (
            "borrowed slots restored"
        )
        if size not in ("off", "100%"):
            assert staged, "the long prompt borrowed slots"
        t = res.timings.to_dict()
        n_l, k = len(cache.layout.layers), cache.layout.top_k
        assert t["prompt_expert_lookups"] == PROMPT * k * n_l
        assert t["expert_lookups"] == (len(res.tokens) - 1) * k * n_l
        if size == "100%":
            assert (
                t["expert_hits"] == t["expert_lookups"]
                and t["prompt_expert_hits"] == t["prompt_expert_lookups"]
            )
            assert t["pcie_bytes"] == t["prompt_pcie_bytes"] == 0
        if size == "off":
            assert t["expert_hits"] == t["prompt_expert_hits"] == 0
        per_expert = int(cache.expert_bytes[0])
        assert (
            t["pcie_bytes"] == (t["expert_lookups"] - t["expert_hits"]) * per_expert
        )  # every layer alike here
        assert (
            cache.layer_lookups.sum() == t["prompt_expert_lookups"] + t["expert_lookups"]
        )  # per layer: the same
        assert cache.layer_hits.sum() == t["prompt_expert_hits"] + t["expert_hits"]


def test_jit_pool_reads_experts_through_the_tiers():
    path = _fixture("qwen3moe")
    ids = list(range(20, 60))
    ref = Engine.load(path, device="cpu", backend="jit", pool_workers=1).logits(ids)
    eng = Engine.load(path, device="cpu", backend="jit", pool_workers=1, expert_cache="50%")
    got = eng.logits(ids)
    np.testing.assert_array_equal(got, ref)  # same kernel, same bytes, other addresses


def test_batched_decode_credits_each_sequence():
    path = _fixture("qwen3moe")
    eng = Engine.load(path, device="cpu", backend="numpy", expert_cache="50%")
    states = [eng.new_state() for _ in range(3)]
    for j, st in enumerate(states):
        eng.model.forward(np.arange(5 + j, 12 + 2 * j), st, all_logits=False)
    eng.model.forward_batch([np.array([3]), np.array([4]), np.array([5])], states)
    cache = eng.expert_cache
    n_l, k = len(cache.layout.layers), cache.layout.top_k
    for j, st in enumerate(states):
        assert st.experts.prefill.lookups == (7 + j) * k * n_l
        assert st.experts.decode.lookups == k * n_l
    assert cache.use.decode.lookups == 3 * k * n_l


def test_tier_count_twin_matches_host_counting():
    """The GPU's tier_count (through its numpy twin) and the CPU stand-in count the same routed ids alike."""
    from strata.tiers.slots import ExpertCache

    rng = np.random.default_rng(3)
    ids = rng.integers(0, 16, (6, 4))
    where = np.where(rng.random(16) < 0.5, 1, -1).astype(np.int32)
    twin = kt.ref_tier_count(ids.reshape(-1), 4, where, 1000, 6).astype(np.int64)
    cache = ExpertCache.__new__(ExpertCache)  # only the counting state: no stores needed
    cache.where, cache.expert_bytes, cache._rows = (
        where[None, :],
        np.array([1000]),
        np.zeros((6, 6), np.int64),
    )
    cache.in_ram, cache._staging = np.ones((1, 16), bool), None  # every expert in the RAM tier, no borrowing
    cache.recorder = cache.policy = cache.profile = None  # neither recording nor a policy: counting only
    cache.layer_lookups, cache.layer_hits = np.zeros(1, np.int64), np.zeros(1, np.int64)
    cache.count_rows(0, ids)
    np.testing.assert_array_equal(twin, cache._rows[:, :3])
    assert not cache._rows[:, 3:].any()
    assert cache.layer_lookups[0] == twin[:, 0].sum() and cache.layer_hits[0] == twin[:, 1].sum()


def test_budgets_refuse_with_the_plan():
    plan = VramPlan(
        8 * 1024 * MIB,
        {"weights: attention": 6 * 1024 * MIB, "KV cache": 3 * 1024 * MIB},
        slot_bytes=2 * MIB,
        n_total=10_000,
    )
    with pytest.raises(ConfigError, match="dense part does not fit.*KV cache 3,072 MiB.*at least 9216 MiB"):
        plan.size_cache()
    plan = VramPlan(12 * 1024 * MIB, dict(plan.parts), slot_bytes=2 * MIB, n_total=10_000)
    plan.size_cache()
    assert plan.n_slots == 3 * 1024 // 2
    with pytest.raises(ConfigError, match="expert_cache='4GiB'.*at most 1,536 slots fit"):
        VramPlan(12 * 1024 * MIB, dict(plan.parts), slot_bytes=2 * MIB, n_total=10_000).size_cache("4GiB")
    assert cache_request("off", 2 * MIB, 100) == 0 and cache_request("40%", 2 * MIB, 100) == 40
    assert cache_request("6MiB", 2 * MIB, 100) == 3 and cache_request("auto", 2 * MIB, 100) is None
    for bad in ("lots", "150%", "6GB", ""):
        with pytest.raises(ConfigError, match="--expert-cache"):
            check_expert_cache(bad)


def test_the_gpu_reads_prompts_in_the_longest_chunk_its_budget_fits():
    """No --prefill: 4096-token passes where their activations (and under tiers the wide passes' rows) fit the
    budget, else 2048 (strata.gpu.plan.AUTO_CHUNKS), never longer than the context; a chunk asked for is kept.
    Planned from the header, as `strata plan` does. One byte short of 4096's wide passes takes 2048 with
    theirs, not 4096 without them."""
    import dataclasses

    from strata.gguf import GGUFFile
    from strata.gpu.plan import AUTO_CHUNKS, GpuOptions, shape_of, vram_plan, with_chunk
    from strata.models import model_class
    from strata.runtime.weights import WeightStore

    g = GGUFFile(_fixture("qwen3moe"))
    cpu = model_class(g)(g, WeightStore(g, 0))
    dims, linear = shape_of(cpu)
    vocab = cpu.params.vocab
    auto = GpuOptions(n_ctx=8192, chunk=0, expert_cache="100%")  # every expert: the plan's need is exact
    need = {
        c: vram_plan(g, dims, linear, 8192, c, vocab, dataclasses.replace(auto, chunk=c), 1 << 40).total
        for c in AUTO_CHUNKS
    }
    assert AUTO_CHUNKS == (4096, 2048) and need[4096] > need[2048]

    def chunk(opts: GpuOptions, budget: int, trained: int = 8192) -> int:
        return with_chunk(g, dims, linear, vocab, opts, budget, trained).chunk

    assert chunk(auto, need[4096]) == 4096
    assert chunk(auto, need[4096] - 1) == 2048
    assert chunk(dataclasses.replace(auto, chunk=300), need[4096]) == 300
    assert chunk(dataclasses.replace(auto, n_ctx=1000), need[4096]) == 1000  # the context's length at most
    assert chunk(dataclasses.replace(auto, n_ctx=0), need[4096], trained=3000) == 3000


def test_planner_counts_wide_prompt_passes_under_tiers(capsys):
    """Under tiers a lone prompt reads in passes of up to WIDE_ROWS rows (never past the context), whose extra
    rows the plan holds (residual, row table, tier counters and routed ids); without tiers, or with a
    --kv-resident window, the passes keep to the chunk. The planner's prefill bound is a pass's rows over its
    staging copies, so it grows with them."""
    import json

    from strata.cli import main
    from strata.gguf import GGUFFile
    from strata.gpu.plan import WIDE_ROWS, GpuOptions, shape_of, vram_plan, wide_row_bytes
    from strata.models import model_class
    from strata.runtime.weights import WeightStore

    path = _fixture("qwen3moe")
    g = GGUFFile(path)
    cpu = model_class(g)(g, WeightStore(g, 0))
    dims, linear = shape_of(cpu)
    layout = ExpertLayout.from_gguf(g)
    vocab = cpu.params.vocab

    def plan(n_ctx: int, **kw):  # type: ignore[no-untyped-def]
        opts = GpuOptions(n_ctx=n_ctx, chunk=512, **kw)
        return vram_plan(g, dims, linear, n_ctx, 512, vocab, opts, 1 << 40)

    half = plan(32768, expert_cache="50%")
    wide = [k for k in half.parts if k.startswith("wide prompt passes")]
    assert half.prompt_rows == WIDE_ROWS and wide == [f"wide prompt passes ({WIDE_ROWS:,} rows)"]
    assert half.parts[wide[0]] == (WIDE_ROWS - 512) * wide_row_bytes(dims, layout)
    assert wide_row_bytes(dims, layout) == 4 * dims.d + 8 * 16 + 24 + 4 * len(layout.layers) * layout.top_k
    assert plan(2000, expert_cache="50%").prompt_rows == 2000  # never past the context
    assert plan(300, expert_cache="50%").prompt_rows == 512  # the chunk at least
    for flat in (plan(32768), plan(32768, expert_cache="50%", kv_resident=1024)):  # all resident; a window
        assert flat.prompt_rows in (0, 512) and not [k for k in flat.parts if k.startswith("wide")]
    # a budget the chunk's passes fit but not the wide ones: the chunk, never a refusal
    opts = GpuOptions(n_ctx=32768, chunk=512, expert_cache="50%")
    tight = half.total - half.parts[wide[0]] + half.slot_bytes // 2
    snug = vram_plan(g, dims, linear, 32768, 512, vocab, opts, tight)
    assert snug.prompt_rows == 512 and not [k for k in snug.parts if k.startswith("wide")]
    # the planner's prefill bound: the same staging copies serve a pass of WIDE_ROWS rows, not 512
    args = ["plan", str(path), "--vram-gib", "0.5", "--expert-cache", "50%", "--ctx-size", "32768", "--json"]
    assert main([*args, "--prefill", "512"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prefill_rows"] == WIDE_ROWS
    assert main([*args, "--prefill", "512", "--kv-resident", "1024"]) == 0
    assert json.loads(capsys.readouterr().out)["prefill_rows"] == 512


def test_expert_cache_on_a_dense_model_is_refused(smollm2_path):
    with pytest.raises(ConfigError, match="no routed experts"):
        Engine.load(smollm2_path, device="cpu", expert_cache="50%")


def test_planner_json_and_bytes_per_token_match_the_engine(capsys):
    import json

    from strata.cli import main

    path = _fixture("qwen3moe")
    assert main(["plan", str(path), "--vram-gib", "0.5", "--expert-cache", "50%", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {
        "expert_slots",
        "experts_total",
        "hit_rate_uniform",
        "routed_bytes_per_token",
        "pcie_bytes_per_token",
        "decode_tok_s",
        "decode_bound_tok_s",
        "prefill_pcie_bound_tok_s",
        "parts",
        "arena_bytes",
    } <= set(plan)
    assert plan["expert_slots"] == plan["experts_total"] // 2 and plan["hit_rate_uniform"] == 0.5
    eng = Engine.load(path, device="cpu", backend="numpy", expert_cache="50%")
    res = _greedy(eng, list(range(30, 50)), 8)
    d = res.timings.experts.decode
    per_token = d.lookups / (len(res.tokens) - 1) * int(eng.expert_cache.expert_bytes[0])
    assert per_token == plan["routed_bytes_per_token"]
    assert (
        main(["plan", str(path), "--vram-gib", "0.01"]) == 1
    )  # the dense part does not fit: one line, exit 1
    assert "dense part does not fit" in capsys.readouterr().err


def test_planner_splits_misses_with_the_cpu_and_says_why(capsys):
    """With the CPU pool's rate the planner splits the misses as start-up does (tiers/share.py) and says why:
    the tiny file's misses are far too small for a hand-off a layer, so auto keeps them on PCIe; a given
    --pcie-frac is predicted with the same arithmetic; the JSON says the share."""
    import json

    from strata.cli import main

    path = _fixture("qwen3moe")
    args = ["plan", str(path), "--vram-gib", "0.5", "--expert-cache", "50%", "--pcie-gbps", "25"]
    assert main(args + ["--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["pcie_frac"] == 1.0 and alone["split_why"] == ""
    assert main(args + ["--cpu-gbps", "25", "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert auto["pcie_frac"] == 1.0 and "auto 1.00" in auto["split_why"]
    assert auto["decode_tok_s"] == alone["decode_tok_s"]
    assert main(args + ["--cpu-gbps", "25", "--pcie-frac", "0.5", "--json"]) == 0
    half = json.loads(capsys.readouterr().out)
    assert half["pcie_frac"] == 0.5 and half["decode_tok_s"] < alone["decode_tok_s"]  # the hand-offs dominate
    assert main(args + ["--cpu-gbps", "25"]) == 0
    text = capsys.readouterr().out
    assert "over PCIe alone" in text and "on the CPU alone" in text
    assert main(args + ["--pcie-frac", "0.5"]) == 1  # a CPU share needs the CPU's rate
    assert "--cpu-gbps" in capsys.readouterr().err


def test_a_scattered_placement_still_double_buffers_its_staging():
    """80B shape at 24 GiB (bookkeeping only, no bytes): a profile's fill gives residents up unevenly over the
    layers when slots are borrowed; staging grows its buffers instead of falling back to one buffer that
    stages every expert of every layer (measured on the H200: pp4096 2,209 tok/s against 6,526 with the static
    fill)."""
    from strata.tiers.layout import ExpertLayer, Part
    from strata.tiers.profile import Profile
    from strata.tiers.slots import ExpertCache

    n_l, n_e = 48, 512
    parts = (Part("g", 12, 512, 2048, 1152), Part("u", 12, 512, 2048, 1152), Part("d", 14, 2048, 512, 420))
    lay = ExpertLayout(
        n_e, 10, tuple(ExpertLayer(i, parts) for i in range(n_l)), (512 * 1152, 512 * 1152, 2048 * 420)
    )

    class Slots:
        bases = (0, 1 << 40, 2 << 40)

        def addr(self, p, s):
            return self.bases[p] + s * lay.strides[p]

        def copy_rows(self, rows):
            pass

        def sync(self):
            pass

    class Arena:
        bases = np.array(
            [[(3 << 40) + li * (1 << 32) + p * (1 << 30) for p in range(3)] for li in range(n_l)]
        )
        strides = np.array([lay.strides] * n_l, np.int64)

    for prof in (None, Profile(np.random.default_rng(0).random((n_l, n_e)) ** 4, 1)):
        cache = ExpertCache(lay, 10_994, Slots(), Arena())
        cache.fill(prof)
        st = cache.staging()
        missing = int((cache.where < 0).sum(axis=1).max())
        assert st.complete and st.buffers == 2
        assert max(len(x) for x in st.per_layer) < missing + 20  # the misses and a few given-up residents


def test_a_full_weight_cache_still_serves_small_tensors():
    """With the f32 weight cache spent (experts fill it first in a long model), DeltaNet's 2-D conv kernel and
    the norms are still read: a qwen3next forward with a 0-byte cache gives the logits of an ample one."""
    from strata.gguf import GGUFFile
    from strata.models import model_class
    from strata.runtime.weights import WeightStore

    path = _fixture("qwen3next")
    g = GGUFFile(path)
    ids = np.arange(1, 9)
    got = [model_class(g)(g, WeightStore(g, size)) for size in (0, 1 << 30)]
    a, b = (m.forward(ids, m.new_state()) for m in got)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_planners_per_token_split_is_within_15_percent_of_the_h200():
    """The 80B shape at 22,528 MiB with the H200 host's probed rates (perf/README.md, "the CPU share split
    per layer and token", call 5): measured 94.5 tok/s at b=1 with the per-token split and 77.9 over PCIe
    alone. The planner's arithmetic (the same table start-up makes) must stay within 15% of both."""
    from gguf.constants import GGMLQuantizationType as T

    from strata.tiers.layout import ExpertLayer, Part
    from strata.tiers.plan import LAYER_FLOOR_US, predict

    gate = Part("gate", int(T.Q4_K), 512, 2048, 1152)
    down = Part("down", int(T.Q4_K), 2048, 512, 288)
    layers = tuple(ExpertLayer(i, (gate, gate, down)) for i in range(48))
    layout = ExpertLayout(512, 10, layers, (gate.nbytes, gate.nbytes, down.nbytes))
    plan = VramPlan(22528 * MIB, {"dense": 3656 * MIB}, layers[0].nbytes, 512 * 48, 11184)

    def tok_s(**kw) -> float:
        p = predict(
            plan,
            layout,
            1_500_000_000,
            4270,
            50.6,
            0,
            2048,
            floor_us=LAYER_FLOOR_US["hybrid"],
            n_layer=48,
            **kw,
        )
        return p.decode_tok_s

    split = tok_s(cpu_gbps=41.0, cpu_fixed_s=37e-6)
    alone = tok_s(pcie_frac=1.0, prefetch=4, window_us=43.0)
    assert abs(split / 94.5 - 1) < 0.15, split
    assert abs(alone / 77.9 - 1) < 0.15, alone


@pytest.mark.parametrize(
    "shape, slots, pcie, cpu, fixed_us, measured",
    [
        ("80b", 10985, 51.12, 38.65, 43.0, 87.70),  # 22,528 MiB
        ("80b", 4310, 50.92, 38.65, 43.0, 72.91),  # 11,264 MiB
        ("80b", 1883, 49.30, 38.65, 43.0, 67.26),  # 7,168 MiB
        ("30b", 2987, 51.15, 42.06, 55.9, 86.60),  # 11,264 MiB
        ("30b", 1369, 50.82, 42.06, 55.9, 65.86),  # 7,168 MiB
    ],
)
def test_the_planner_is_within_15_percent_of_the_h200_tier_runs(shape, slots, pcie, cpu, fixed_us, measured):
    """perf/bench_tiers.py on the H200, 2026-12-04 (perf/README.md, "tiers with the CPU share"): decode b=1
    with --pcie-frac auto at each cap, the probe's rates of that run; the planner is given the same."""
    from gguf.constants import GGMLQuantizationType as T

    from strata.tiers.layout import ExpertLayer, Part
    from strata.tiers.plan import LAYER_FLOOR_US, predict

    n_expert, top_k, ffn, dense, kind = {
        "80b": (512, 10, 512, 1408e6, "hybrid"),
        "30b": (128, 8, 768, 815e6, "moe"),
    }[shape]
    gate = Part("gate", int(T.Q4_K), ffn, 2048, 1152)
    down = Part("down", int(T.Q4_K), 2048, ffn, ffn * 9 // 16)
    layers = tuple(ExpertLayer(i, (gate, gate, down)) for i in range(48))
    layout = ExpertLayout(n_expert, top_k, layers, (gate.nbytes, gate.nbytes, down.nbytes))
    plan = VramPlan(22528 * MIB, {"dense": 3600 * MIB}, layers[0].nbytes, n_expert * 48, slots)
    p = predict(
        plan,
        layout,
        dense,
        4225,
        pcie,
        0,
        2048,
        floor_us=LAYER_FLOOR_US[kind],
        n_layer=48,
        cpu_gbps=cpu,
        cpu_fixed_s=fixed_us * 1e-6,
    )
    assert abs(p.decode_tok_s / measured - 1) < 0.15, p.decode_tok_s


def test_staging_rows_level_the_two_miss_paths():
    """A prompt pass stages its misses from the row count where reading them per pair in place costs what one
    copy of every missing expert costs: n_expert * zero_copy / (top_k * copy_engine), clamped."""
    from strata.tiers.borrow import staging_rows

    for zc, ce, want in ((50.6e9, 55.4e9, 47), (34.5e9, 55.3e9, 32)):  # the two H100 hosts of borrow.py
        n = staging_rows(512, 10, zc, ce, 9, 65)
        assert n == want
        per_pair = n * 10 / zc  # experts' bytes a layer, per expert's share of misses: the paths' times
        assert per_pair >= 512 / ce > (n - 1) * 10 / zc
    assert staging_rows(512, 10, 1e9, 55e9, 9, 65) == 9  # a slow link stages every pass past the decode rows
    assert staging_rows(512, 10, 500e9, 55e9, 9, 65) == 65  # never before the per-pair passes end


def test_a_pass_folds_a_prompts_last_few_tokens_into_its_chunk():
    """passes.pass_rows: the whole rest where it is at most pass_slack past the chunk (PASS_SLACK, at most an
    eighth of the chunk, less the decode rows beside it), else the chunk; Engine.prefill reads a prompt that
    way, with the logits of one long pass."""
    from strata.runtime.passes import PASS_SLACK, pass_rows, pass_slack

    assert pass_slack(4096) == pass_slack(512) == PASS_SLACK == 64 and pass_slack(16) == 2
    assert pass_rows(20, 512) == 20 and pass_rows(512 + PASS_SLACK, 512) == 512 + PASS_SLACK
    assert pass_rows(513 + PASS_SLACK, 512) == 512 and pass_rows(512 + PASS_SLACK, 512, beside=3) == 512
    assert pass_rows(512 + PASS_SLACK - 3, 512, beside=3) == 512 + PASS_SLACK - 3
    eng = Engine.load(_fixture("qwen3moe"), device="cpu", backend="numpy", prefill_chunk=16)
    one = Engine.load(_fixture("qwen3moe"), device="cpu", backend="numpy", prefill_chunk=512)
    rows: list[int] = []
    run = eng.model.forward

    def counted(ids, state, all_logits=True):
        rows.append(len(ids))
        return run(ids, state, all_logits=all_logits)

    eng.model.forward = counted  # type: ignore[method-assign]
    ids = list(range(30, 30 + 16 + 18))  # two passes: 16, then the rest folded
    got = eng.prefill(eng.new_state(), ids)
    assert rows == [16, 18]
    np.testing.assert_allclose(got, one.prefill(one.new_state(), ids), rtol=1e-4, atol=1e-4)

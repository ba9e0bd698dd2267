"""Expert tiers on the GPU: any cache size computes exactly what all-resident computes.

The cache only moves bytes (a slot in VRAM, a zero-copy read of pinned RAM, a copy staged into a
borrowed slot), so logits must be bit-identical to the all-resident model's, for prompts that go
through borrowing chunks, through the zero-copy grouped GEMM, per (row, expert) pair through the decode
kernels, and for graph-replayed decode. The
counters are exact (lookups = routed triples; all hits at 100%, none with the cache off), borrowed
slots get their own bytes back, and the tier kernels match their numpy twins.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from test_gpu_model import tiny_file

from strata.gguf import GGUFFile
from strata.gpu.kernels import tiers as kt
from strata.models import model_class
from strata.runtime.weights import WeightStore
from strata.tiers.budget import MIB
from strata.tiers.layout import ExpertLayout

pytestmark = pytest.mark.gpu

SIZES = ["off", "one", "50%", "100%"]


def _model(path: Path, cache: str = "auto", **share):
    from strata.gpu.model import GpuModel, GpuOptions
    from strata.gpu.tiers import TierOptions

    g = GGUFFile(path)
    cpu = model_class(g)(g, WeightStore(g, 1 << 30))
    if cache == "one":  # exactly one slot
        cache = f"{(ExpertLayout.from_gguf(g).slot_bytes + 1) / MIB:.6f}MiB"
    return GpuModel(
        cpu,
        GpuOptions(chunk=16, n_ctx=256, expert_cache=cache, tiers=TierOptions(**{"pcie_frac": 1.0, **share})),
    )


def _run(m, prompt: np.ndarray, steps: int):
    """Prompt logits of every chunk's last row, then greedy decode logits through the graph."""
    st = m.new_state()
    out = [m.forward(prompt, st, all_logits=True)]
    tok = int(out[-1][-1].argmax())
    for _ in range(steps):
        out.append(m.forward(np.array([tok]), st, all_logits=False))
        tok = int(out[-1][-1].argmax())
    return out, st


def _slot_bytes(m, arrays: list[np.ndarray]):
    """(part, slot, the (layer, expert) it holds, whether its bytes are that expert's in the arena, and the
    slot's bytes) for every part of every slot that has an owner, read from host copies of the slot arrays."""
    slots, cache = m.tiers.slots, m.expert_cache
    for j, now in enumerate(arrays):
        p, seg = j % 3, j // 3
        for k in range(min(slots.per, cache.n_slots - seg * slots.per)):
            s = seg * slots.per + k
            li, e = (int(v) for v in cache.owner[s])
            if li < 0:
                continue
            n, off = int(cache.sizes[li, p]), k * slots.strides[p]
            got = now[off : off + slots.strides[p]]
            yield p, s, (li, e), bytes(got[:n]) == ctypes.string_at(int(cache.home[li, p, e]), n), got


def _changed_slots(m, before: list[np.ndarray]) -> list[tuple[int, int, tuple[int, int], bool]]:
    """(part, slot, the (layer, expert) it holds, whether its bytes are that expert's in the arena) of every
    slot whose bytes differ from `before` (the first ten), once every stream is done: a borrowed slot must get
    its own expert back. (The owner check tells a write of the wrong bytes from a slot the cache gave another
    expert: it failed once in ~4 runs on the H200 for qwen4exp at 50%, part 0 of slots 0-10 but 7, owners
    unchanged; _foreign_slots now checks the fill itself before the run.)"""
    import cupy

    cupy.cuda.Device().synchronize()
    now = [a.get() for a in m.tiers.slots.arrays]
    strides = m.tiers.slots.strides
    out = []
    for p, s, owner, own, got in _slot_bytes(m, now):
        k, per = s % m.tiers.slots.per, m.tiers.slots.per
        was = before[(s // per) * 3 + p][k * strides[p] : (k + 1) * strides[p]]
        if not np.array_equal(was, got):
            out.append((p, s, owner, own))
    return out[:10]


def _foreign_slots(m, arrays: list[np.ndarray]) -> list[tuple[int, int, tuple[int, int]]]:
    """(part, slot, its owner) of the slots whose bytes are not their owner's (the first ten)."""
    return [(p, s, owner) for p, s, owner, own, _ in _slot_bytes(m, arrays) if not own][:10]


# (the most rows whose experts run per pair, the fewest rows a borrowing pass has): the prompt's 16-row chunks
# through the grouped GEMM, staged or zero-copy, and through the decode kernels per pair, in place or staged
PATHS = [(8, 12), (8, 1 << 30), (32, 1 << 30), (32, 12)]


def _rows(m, rows: int):
    m.ops.moe_gemv_rows = rows
    return m


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next", "qwen4exp"])
def test_any_cache_size_equals_all_resident(tmp_path, arch):
    import cupy

    path = tiny_file(tmp_path, arch)
    prompt = np.random.default_rng(1).integers(0, 900, 40)  # chunks of 16, 16 and 8 (decode rows)
    refs = {rows: _run(_rows(_model(path), rows), prompt, 6)[0] for rows in {r for r, _ in PATHS}}
    for size, (rows, borrow) in [(s, p) for s in SIZES for p in PATHS]:
        m = _rows(_model(path, size), rows)
        cache = m.expert_cache
        assert cache is not None
        cache.borrow_min = borrow
        size = f"{size} per pair to {rows} rows, borrowing from {borrow}"
        cupy.cuda.Device().synchronize()  # the fill's copies have landed
        before = [a.get() for a in m.tiers.slots.arrays]
        # the fill put each owner's bytes in its slot, and nothing wrote them since (a stray write from work
        # still in flight when the last model's memory went back to the pool would show here)
        assert not _foreign_slots(m, before), (
            f"{arch} cache {size}: after the fill: {_foreign_slots(m, before)}"
        )
        got, st = _run(m, prompt, 6)
        for k, (a, b) in enumerate(zip(got, refs[rows])):
            assert np.array_equal(a, b), f"{arch} cache {size}: step {k} differs by {np.abs(a - b).max()}"
        changed = _changed_slots(m, before)
        assert not changed, f"{arch} cache {size}: changed slots (part, slot, its expert): {changed}"
        n_layers, top_k = len(cache.layout.layers), cache.layout.top_k
        use = st.experts
        assert use.prefill.lookups == len(prompt) * top_k * n_layers
        assert use.decode.lookups == 6 * top_k * n_layers
        for c in (use.prefill, use.decode):
            if size.startswith("100%"):
                assert c.hits == c.lookups and c.pcie_bytes == 0
            if size.startswith("off"):
                assert c.hits == 0
        if not size.startswith("100%"):
            assert use.prefill.pcie_bytes > 0 and use.decode.pcie_bytes > 0
        print(f"{arch} cache {size}: {cache.n_slots} slots, prefill {use.prefill}, decode {use.decode}")


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_kv_grow_equals_all_resident(tmp_path, arch):
    """--kv-grow with a ledger that has no room left: every KV growth takes slots (moved slot to slot on the
    device, the last segments freed), and the logits stay bit-identical to all-resident."""
    from strata.gpu.model import GpuModel, GpuOptions
    from strata.gpu.tiers import TierOptions

    path = tiny_file(tmp_path, arch)
    prompt = np.random.default_rng(2).integers(0, 900, 40)
    ref, _ = _run(_model(path), prompt, 6)
    g = GGUFFile(path)
    cpu = model_class(g)(g, WeightStore(g, 1 << 30))
    tiers = TierOptions(pcie_frac=1.0, kv_grow=True)
    m = GpuModel(cpu, GpuOptions(chunk=16, n_ctx=256, expert_cache="100%", tiers=tiers, kv_grow=True))
    cache = m.expert_cache
    assert cache is not None and cache.lender is not None
    n0 = cache.n_slots
    m.ledger.budget = m.ledger.used  # what start-up holds: the KV's first cells must come from the slots
    got, _kept = _run(m, prompt, 6)  # its KV stays alive: nothing is reclaimed before the checks
    for k, (a, b) in enumerate(zip(got, ref)):
        assert np.array_equal(a, b), f"{arch}: step {k} differs by {np.abs(a - b).max()}"
    assert cache.lender.lends >= 1 and cache.n_slots < n0
    assert m.ledger.used <= m.ledger.budget
    print(f"{arch} kv-grow: {n0} -> {cache.n_slots} slots, {cache.lender.status()}")


def test_batch_with_tiers_equals_solo(tmp_path):
    path = tiny_file(tmp_path, "qwen3moe")
    m = _model(path, "50%")
    prompts = [np.arange(5, 25), np.arange(30, 41)]
    solo = []
    for p in prompts:
        st = m.new_state()
        m.forward(p, st, all_logits=False)
        solo.append(m.forward(np.array([7]), st, all_logits=False)[-1])
    states = [m.new_state() for _ in prompts]
    for p, st in zip(prompts, states):
        m.forward(p, st, all_logits=False)
    batch = m.forward_batch([np.array([7]), np.array([7])], states)
    for a, b in zip(batch, solo):
        assert np.array_equal(a, b)
    assert states[0].experts.decode.lookups == states[1].experts.decode.lookups == 2 * 2


def test_tier_kernels_match_twins():
    import cupy as cp

    from strata.gpu.runtime import Kernels, launch

    k = Kernels(kt.SOURCE, kt.NAMES)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 16, 24).astype(np.int32)
    where = np.where(rng.random(16) < 0.5, rng.integers(0, 9, 16), rng.choice([-1, -2, -5], 16)).astype(
        np.int32
    )
    counts, route, stop = cp.zeros((6, 3), cp.uint64), cp.full(24, -1, cp.int32), cp.zeros(1, cp.int32)
    launch(
        k["tier_count"],
        (1,),
        128,
        (cp.asarray(ids), np.int32(24), np.int32(4), cp.asarray(where), np.int64(1000), counts, route, stop),
    )
    np.testing.assert_array_equal(counts.get(), kt.ref_tier_count(ids, 4, where, 1000, 6))
    np.testing.assert_array_equal(route.get(), ids | np.where(where[ids] >= 0, kt.ROUTE_HIT, 0))
    assert int(stop.get()[0]) == 1  # the lookahead's stop, raised once the routing is known
    mem = cp.asarray(rng.integers(0, 256, 1 << 16).astype(np.uint8))
    host = mem.get()
    # addresses 16-byte aligned, as every slot and arena row is (ALIGN); lengths need not be
    src, dst, nb = np.array([0, 5008, 20000]), np.array([40000, 50016, 60000]), np.array([4096, 333, 17])
    rows = cp.asarray(np.stack([src + mem.data.ptr, dst + mem.data.ptr, nb]).astype(np.int64))
    launch(k["gather_rows"], (4, 3), 256, (rows[0], rows[1], rows[2]))
    np.testing.assert_array_equal(mem.get(), kt.ref_gather_rows(host, src, dst, nb))
    # admit: riders 2 and 4 (slots 4 and 5), only 2 routed (twice); parts of 48 KB + 3, 48 KB + 3, 64 KB + 5
    # bytes, so each block's slice and the tail are exercised
    host = mem.get()
    sizes = (49_155, 49_155, 65_541)
    where = np.array([-1, 0, -3 - 4, -2, -3 - 5, 1], np.int32)
    tab = np.array([[1024 + 65_536 * j + 16 * e for e in range(6)] for j in range(3)], np.int64)
    tab = np.stack([tab[j] + [0, 0, 0, 0, 70_000 - 64, 0] for j in range(3)])  # 4's parts elsewhere
    mem = cp.asarray(np.concatenate([host, rng.integers(0, 256, 1 << 19).astype(np.uint8)]))
    host = mem.get()
    pend = np.zeros((3, 6), np.int64)
    pend[:, 2] = [262_144, 327_680, 393_216]
    pend[:, 4] = [458_752, 475_136, 491_520]  # never written: 4 is not routed
    ids = np.array([2, 0, 2, 3], np.int32)
    base = mem.data.ptr
    d_where, d_tab = cp.asarray(where), cp.asarray(tab + base)
    d_pend, arrive = cp.asarray(np.where(pend > 0, pend + base, 0)), cp.zeros(6, cp.int32)
    launch(
        k["admit"],
        (kt.ADMIT_BLOCKS,),
        256,
        (cp.asarray(ids), np.int32(4), d_where, d_tab, d_pend, np.int32(6), *map(np.int64, sizes), arrive),
    )
    want_mem, want_where, want_tab = kt.ref_admit(host, ids, where, tab, pend, sizes)
    np.testing.assert_array_equal(mem.get(), want_mem)
    np.testing.assert_array_equal(d_where.get(), want_where)
    np.testing.assert_array_equal(d_tab.get() - base, want_tab)
    assert not arrive.get().any()  # reset for the next pass


def test_prefetch_kernels_match_twins():
    """prefetch stages the twin's picks byte for byte and points the table at them (and nothing once stop is
    raised); restore puts the table back and counts the picks against the routed ids as the twin does."""
    import cupy as cp

    from strata.gpu.runtime import Kernels, launch

    k = Kernels(kt.SOURCE, kt.NAMES)
    rng = np.random.default_rng(3)
    e, a, n, K = 16, 4, 2, 3
    nbytes = (4096, 1000, 2064)  # a part of odd length is copied whole too
    stride = 4096
    arena = [cp.asarray(rng.integers(0, 256, e * stride).astype(np.uint8)) for _ in range(3)]
    stage = [cp.zeros(K * stride, cp.uint8) for _ in range(3)]
    where = np.where(rng.random(e) < 0.4, 0, rng.choice([-1, -1, -2], e)).astype(np.int32)
    table = np.array([[int(arena[j].data.ptr) + x * stride for x in range(e)] for j in range(3)], np.int64)
    pred = np.stack([rng.permutation(e)[:a] for _ in range(n)]).astype(np.int32)  # [n, A]
    tab = cp.asarray(table)
    picked, saved, landed = cp.full(K, -1, cp.int32), cp.zeros(3 * K, cp.int64), cp.zeros(3 * K, cp.int32)
    stop, stats = cp.ones(1, cp.int32), cp.zeros(6, cp.uint64)
    blocks = 5

    def run() -> None:
        launch(
            k["prefetch"],
            (blocks,),
            256,
            (
                cp.asarray(pred.reshape(-1)),
                np.int32(n),
                np.int32(a),
                cp.asarray(where),
                tab,
                np.int32(e),
                np.int32(K),
                *(np.uint64(s.data.ptr) for s in stage),
                *(np.int64(stride),) * 3,
                *(np.int64(b) for b in nbytes),
                picked,
                saved,
                landed,
                stop,
                stats,
            ),
        )

    run()  # the router was done before the copy began: nothing lands, the table is untouched
    assert (landed.get() == 0).all() and (saved.get() == 0).all() and int(stats[4].get()) == 0
    np.testing.assert_array_equal(tab.get(), table)
    stop.fill(0)
    run()
    want = kt.ref_prefetch_pick(pred, where, K)
    np.testing.assert_array_equal(picked.get(), want)
    # every block's slice of every part of each pick
    np.testing.assert_array_equal(
        landed.get().reshape(K, 3), np.repeat(np.where(want >= 0, blocks, 0)[:, None], 3, 1)
    )
    assert int(stats[4].get()) == sum(16 * (b // 16) for b in nbytes) * int(
        (want >= 0).sum()
    )  # tails: not counted
    got_tab = tab.get()
    for q, x in enumerate(want):
        for j in range(3):
            if x < 0:
                continue
            assert got_tab[j, x] == int(stage[j].data.ptr) + q * stride
            np.testing.assert_array_equal(
                stage[j][q * stride : q * stride + nbytes[j]].get(),
                arena[j][x * stride : x * stride + nbytes[j]].get(),
            )
    routed = rng.integers(0, e, n * a).astype(np.int32)
    routed[0] = want[0]  # at least one pick used
    stats.fill(0)
    stop.fill(1)
    launch(
        k["prefetch_restore"],
        (1,),
        128,
        (
            tab,
            np.int32(e),
            np.int32(K),
            picked,
            saved,
            landed,
            stop,
            cp.asarray(routed),
            np.int32(n * a),
            *(np.int64(b) for b in nbytes),
            stats,
        ),
    )
    np.testing.assert_array_equal(tab.get(), table)
    flipped = np.repeat((want >= 0)[:, None], 3, axis=1)
    np.testing.assert_array_equal(stats.get()[:4], kt.ref_prefetch_restore(want, flipped, routed, nbytes))
    assert (picked.get() == -1).all() and (landed.get() == 0).all() and (saved.get() == 0).all()
    assert int(stop.get()[0]) == 0


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next", "qwen4exp"])
def test_prefetch_equals_all_resident(tmp_path, arch):
    """Lookahead prefetch only moves bytes: any K gives the all-resident logits, graph-replayed decode
    included; every pass leaves the decode table as the host's bookkeeping has it, and the counters add up."""
    path = tiny_file(tmp_path, arch)
    prompt = np.random.default_rng(2).integers(0, 900, 5)  # a decode-sized prompt: its pass prefetches too
    ref, _ = _run(_model(path, prefetch=0), prompt, 8)
    for size, k in (("off", 1), ("one", 2), ("50%", 4)):
        m = _model(path, size, prefetch=k)
        assert m.tiers.lookahead is not None
        got, _ = _run(m, prompt, 8)
        for step, (x, y) in enumerate(zip(got, ref)):
            assert np.array_equal(x, y), (
                f"{arch} cache {size} K={k}: step {step} differs by {np.abs(x - y).max()}"
            )
        np.testing.assert_array_equal(m.tiers.table.get(), m.expert_cache.table)
        pf, lay = m.expert_cache.prefetch, m.expert_cache.layout
        assert 0 <= pf.staged <= 3 * k * len(lay.layers) * 9 and pf.used <= pf.staged
        assert (
            pf.used_bytes + pf.wasted_bytes <= pf.copied_bytes + 3 * 16 * pf.staged
        )  # landed parts were copied
        print(f"{arch} cache {size} K={k}: {pf.line()}")


@pytest.mark.parametrize("name", ["lru", "adaptive"])
def test_a_learning_cache_equals_all_resident(tmp_path, name):
    """--cache-policy on the GPU: newcomers ride the decode passes that route them into their slots (the rest
    are copied on the copy stream beside decode), and the table flips when they land; the logits stay
    bit-identical to all-resident, through graph decode (step by step and the greedy loop), and every landed
    slot holds its expert's bytes."""
    from strata.gpu import tiers as gt

    path = tiny_file(tmp_path, "qwen3next")
    prompt = np.random.default_rng(2).integers(0, 900, 20)
    steps = 6 * gt.LEARN_EVERY
    ref, _ = _run(_model(path), prompt, steps)
    m = _model(path, "50%", cache_policy=name)
    cache = m.expert_cache
    got, st = _run(m, prompt, steps)
    for k, (a, b) in enumerate(zip(got, ref)):
        assert np.array_equal(a, b), f"{name}: step {k} differs by {np.abs(a - b).max()}"
    assert cache.swaps > 0 and cache.swap_bytes > 0
    assert cache.rides > 0, "newcomers rode the decode passes' reads"
    m.stream.synchronize()
    m.tiers.quiesce()  # riders still waiting are copied
    m.tiers.publish()
    assert (cache.where == cache.booked).all(), "every swap landed, by riding or once its copy was done"
    assert not cache.riding.any()
    # the scattered patches left the device tables equal to the bookkeeping
    assert np.array_equal(m.tiers.table.get(), cache.table) and np.array_equal(m.tiers.full.get(), cache.full)
    assert np.array_equal(m.tiers.where.get(), cache.where_kinds())
    slots = [a.get() for a in m.tiers.slots.arrays]
    for li, e in zip(*np.nonzero(cache.where >= 0)):
        s = int(cache.where[li, e])
        for p, stride in enumerate(cache.layout.strides):
            n = int(cache.sizes[li, p])
            start = int(cache.arena.bases[li, p]) + int(e) * int(cache.arena.strides[li, p])
            want = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(start))
            assert np.array_equal(slots[p][s * stride : s * stride + n], want), (li, e, p)
    use = st.experts
    assert use.decode.lookups == steps * cache.layout.top_k * len(cache.layout.layers)
    # per-layer counts (host-side, from the routed ids) add up to the device's own counters
    assert cache.layer_lookups.sum() == use.prefill.lookups + use.decode.lookups
    assert cache.layer_hits.sum() == use.prefill.hits + use.decode.hits
    # the greedy loop learns too (a round trip a token) and picks the same tokens
    m_ref = _model(path)
    st_ref = m_ref.new_state()
    m_ref.forward(prompt, st_ref, all_logits=False)
    st_got = m.new_state()
    m.forward(prompt, st_got, all_logits=False)
    before = cache.swaps
    want = m_ref.graphs.greedy_loop([5], [st_ref], steps)
    have = m.graphs.greedy_loop([5], [st_got], steps)
    assert np.array_equal(want, have)
    assert cache.swaps >= before


@pytest.mark.parametrize("cache", ["auto", "50%"])
def test_the_greedy_loop_passes_on_a_fed_stream(tmp_path, cache):
    """greedy_loop(feed=...): each step embeds the fed token, not its draw (the benchmark's fixed stream), and
    still returns its draws: the same as step-by-step decode fed those tokens, with or without a cache that
    learns, and the state's tokens are the fed ones."""
    path = tiny_file(tmp_path, "qwen3next")
    prompt = np.random.default_rng(5).integers(0, 900, 20)
    feed = np.random.default_rng(6).integers(0, 900, (8, 1))
    kw = {"cache_policy": "adaptive"} if cache != "auto" else {}
    m, ref = _model(path, cache, **kw), _model(path, cache, **kw)
    st, st_ref = m.new_state(), ref.new_state()
    m.forward(prompt, st, all_logits=False)
    ref.forward(prompt, st_ref, all_logits=False)
    drawn = m.graphs.greedy_loop([5], [st], len(feed), feed)
    fed = [5, *feed[:-1, 0]]
    want = [int(ref.forward(np.array([t]), st_ref, all_logits=False)[-1].argmax()) for t in fed]
    assert drawn[:, 0].tolist() == want
    assert st.tokens == st_ref.tokens and st.n_past == st_ref.n_past


def test_recorded_gpu_routes_replay_to_the_counters(tmp_path):
    """--record-routes on the GPU: the routed ids the graph leaves behind, replayed by the simulator with the
    static policy from the engine's placement, give exactly the lookups and hits the device counted. The
    trace carries the lookahead's predictions: none for the prompt's 16-row pass (past the decode rows),
    valid expert ids, best first, for every decode row."""
    from strata.tiers import sim, trace

    m = _model(tiny_file(tmp_path, "qwen3moe"), "50%")
    rec = m.tiers.record_routes(tmp_path / "routes.npz")
    _, st = _run(m, np.random.default_rng(4).integers(0, 900, 20), 5)
    rec.save()
    ids, n_expert = trace.load(tmp_path / "routes.npz")
    ahead = trace.load_ahead(tmp_path / "routes.npz")
    assert ahead is not None and ahead.k == m.tiers.lookahead.k and ahead.pred.shape == ids.shape
    assert (ahead.pred[:16] == -1).all()
    assert ((ahead.pred[-5:] >= 0) & (ahead.pred[-5:] < n_expert)).all()
    resident, windows, budget = trace.load_recorded(tmp_path / "routes.npz")
    got = sim.simulate(ids, n_expert, 0, "static", resident=resident, windows=windows, budget=budget)
    use = st.experts
    assert got.lookups == use.prefill.lookups + use.decode.lookups
    assert got.hits == use.prefill.hits + use.decode.hits


@pytest.mark.parametrize("size,policy", [("50%", "static"), ("50%", "adaptive"), ("one", "static")])
def test_decode_pipeline_through_the_tiers(tmp_path, size, policy):
    """The server's decode pipeline over a cache (counts recorded to pinned memory per launch, credited when
    the host takes the pass; swaps beside it): the tokens and states of plain windows, and the same
    counters."""
    from test_gpu_model import pipelined_equals_plain

    from strata.sampling.params import SamplingParams

    path = tiny_file(tmp_path, "qwen3next")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 900, n) for n in (4, 9)]
    draws = [(SamplingParams(temperature=0.0), 1), (SamplingParams(temperature=0.9, top_k=20, top_p=0.9), 3)]
    m = _model(path, size, cache_policy=policy)
    steps = 40
    pipelined_equals_plain(m, prompts, draws, steps)
    cache = m.expert_cache
    per = cache.layout.top_k * len(cache.layout.layers)
    # two runs of the same prompts and steps: plain then pipelined, each prefilled, each row decoding `steps`
    assert cache.use.decode.lookups == 2 * steps * len(prompts) * per
    assert cache.layer_lookups.sum() == cache.use.prefill.lookups + cache.use.decode.lookups
    assert cache.layer_hits.sum() == cache.use.prefill.hits + cache.use.decode.hits

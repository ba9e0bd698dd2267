"""The CPU's share of the decode misses, without a GPU: the server (jit/share.py) answers requests that the
numpy twins of the graph's `cpu_publish` / `cpu_collect` make, and its answer is the expert FFN as
gguf-py's dequantizers define it; which misses the publish takes per layer, the split arithmetic
(tiers/share.py) and the cache's marking."""

from __future__ import annotations

import time

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize
from quant_blocks import random_blocks

from strata.gpu.kernels import share as ks
from strata.gpu.kernels import tiers as kt
from strata.jit import reference
from strata.jit.kernels import Kernels
from strata.jit.share import MB_WORDS, CpuShare, ExpertBytes, Mailbox
from strata.tiers import share
from strata.tiers.slots import ExpertCache, NumpyBytes

L, E, A, D, F, ROWS = 2, 6, 3, 256, 512, 8


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    return Kernels(tmp_path_factory.mktemp("jit-cache"))


def _experts(qtypes: tuple[T, T, T]):
    """Random experts [L][P] as raw [E, rows, row_bytes] arrays and the ExpertBytes over them."""
    shapes = [(F, D), (F, D), (D, F)]
    raws = [
        [
            np.stack([random_blocks(q, r, c, seed=100 * li + 10 * p + e) for e in range(E)])
            for p, (q, (r, c)) in enumerate(zip(qtypes, shapes))
        ]
        for li in range(L)
    ]
    bases = np.array([[int(r.ctypes.data) for r in row] for row in raws], np.int64)
    strides = np.array([[r.shape[1] * r.shape[2] for r in row] for row in raws], np.int64)
    ex = ExpertBytes(
        bases,
        strides,
        np.array([[int(q) for q in qtypes]] * L, np.int64),
        np.array([[F, F, D]] * L, np.int64),
        np.array([[r.shape[2] for r in row] for row in raws], np.int64),
    )
    return raws, ex


def _reference(raws, qtypes, int8, li, h, ids, wts):
    """sum over the CPU's (t, a) (ids >= 0) of w * down(silu(gate h) * (up h)), in float64 from gguf's
    dequantizers; where a part's product takes int8 inputs (int8 [P]), its inputs rounded to q8 rows and
    the product as jit/reference.py's twin computes it (itself held to gguf's dequantizers in
    test_jit_qdot.py)."""

    def product(p: int, e: int, x: np.ndarray) -> np.ndarray:
        raw = raws[li][p][e]
        if int8[p]:
            return reference.qdot(raw, qtypes[p], reference.quantize_q8(x[None].astype(np.float32)))[0]
        return dequantize(raw, qtypes[p]).astype(np.float64) @ x

    y = np.zeros(h.shape, np.float64)
    for t in range(h.shape[0]):
        for a in range(ids.shape[1]):
            e = int(ids[t, a])
            if e < 0:
                continue
            gv, uv = (product(p, e, h[t]).astype(np.float32) for p in (0, 1))
            with np.errstate(over="ignore"):
                act = gv / (np.float32(1) + np.exp(-gv)) * uv  # the kernels' silu, in float32
            y[t] += wts[t, a] * product(2, e, act)
    return y


def _box() -> Mailbox:
    buf = np.zeros(Mailbox.nbytes(ROWS, A, D) + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return Mailbox.over(buf[off:], ROWS, A, D)


@pytest.mark.parametrize(
    "qtypes",
    [
        (T.Q4_K, T.Q4_K, T.Q6_K),
        (T.IQ4_XS, T.IQ4_XS, T.Q5_K),
        (T.Q8_0, T.Q8_0, T.Q8_0),
        (T.Q4_0, T.Q4_0, T.Q4_0),
    ],
    ids=str,
)
@pytest.mark.parametrize("threads", [1, 3])
def test_server_answers_the_twins_requests(kernels: Kernels, qtypes, threads: int) -> None:
    raws, ex = _experts(qtypes)
    where = np.array([0, 1, -2, -2, -1, -1], np.int32)  # 2, 3 the CPU's own; 4, 5 read over PCIe
    box = _box()
    srv = CpuShare(kernels, ex, E, box, threads)
    floats = qtypes[0] == T.Q4_0  # a type without an int8 product (qdot_ir.TYPES)
    assert srv.int8.all() == (not floats), "the products take int8 inputs where their type has them"
    names = ", ".join(sorted({q.name for q in qtypes}))
    assert srv.products == (f"float inputs ({names})" if floats else f"int8 inputs ({names})")
    rng = np.random.default_rng(threads)
    ticket = np.zeros(1, np.int64)
    try:
        for step in range(12):
            n = int(rng.integers(1, ROWS + 1))
            li = step % L
            h = rng.standard_normal((n, D)).astype(np.float32)
            ids = np.stack([rng.permutation(E)[:A] for _ in range(n)]).astype(np.int32)
            wts = rng.random((n, A)).astype(np.float32)
            take = np.minimum(np.arange(n * A + 1), step % 3)  # none, one or both of the PCIe misses
            took = ks.ref_cpu_publish(h, ids, wts, li, where, take, box.ctl, box.h, box.ids, box.wts, ticket)
            mids = box.ids[: n * A].reshape(n, A).copy()
            x = np.zeros((n, D), np.float32)
            if took is None:  # nothing the CPU's: no request, as the collect then does not wait
                assert (mids < 0).all()
                continue
            deadline = time.monotonic() + 10
            while not ks.ref_cpu_collect(x, box.ctl, box.out, ticket):
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(1e-4)
            want = _reference(raws, qtypes, srv.int8[li], li, h, mids, wts)
            scale = np.abs(want).max() + 1e-6
            # float32 sums in another order; an input whose q8 code flips on a rounding tie moves a sum by
            # one code step of its block (~1/127 of the block's largest input): rare, bounded here
            assert np.abs(x - want).max() <= 1e-3 * scale, f"step {step}: {np.abs(x - want).max()} of {scale}"
            calls = srv.take_calls(n)
            assert np.array_equal(calls, (mids >= 0).sum(axis=1)), "CPU expert calls per row"
        srv.check()
    finally:
        srv.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_the_compiled_request_equals_the_numpy_steps(kernels: Kernels, threads: int) -> None:
    """A request runs compiled (share_ir.py) where each layer's experts sit at a base and a stride, and
    through numpy between the rounds where the arena gives each expert its own address (the low-RAM mode):
    the same rows give the same sums both ways (the same kernels and the same compiled silu, so the same
    int8 inputs for down; only the weighted sums' order differs), for one row and for several whose
    experts repeat."""
    from dataclasses import replace

    _, ex = _experts((T.Q4_K, T.Q4_K, T.Q6_K))
    addrs = (ex.bases[:, :, None] + np.arange(E)[None, None, :] * ex.strides[:, :, None]).astype(np.int64)
    per = replace(ex, bases=np.zeros_like(ex.bases), strides=np.zeros_like(ex.strides), addrs=addrs)
    fast, slow = CpuShare(kernels, ex, E, _box(), threads), CpuShare(kernels, per, E, _box(), threads)
    rng = np.random.default_rng(5)
    try:
        for step in range(10):
            n, li = [1, 1, 2, 4, ROWS][step % 5], step % L
            h = rng.standard_normal((n, D)).astype(np.float32)
            ids = np.stack([rng.permutation(E)[:A] for _ in range(n)]).astype(np.int32)
            ids[rng.random((n, A)) < 0.4] = -1  # the GPU's pairs
            wts = rng.random((n, A)).astype(np.float32)
            got, calls = fast.layer(li, h, ids, wts)
            got = got.copy()
            want, calls2 = slow.layer(li, h, ids, wts)
            assert calls.tolist() == calls2.tolist() == (ids >= 0).sum(axis=1).tolist()
            scale = np.abs(want).max() + 1e-30
            np.testing.assert_allclose(
                got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=f"step {step}, {n} rows"
            )
            assert not got[(ids < 0).all(axis=1)].any(), "a row without CPU pairs gets zeros"
    finally:
        fast.close()
        slow.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_rows_together_equal_rows_alone(kernels: Kernels, threads: int) -> None:
    """batched == solo: a request of n rows (experts shared between rows, read once for all of them) gives
    each row the bits it gets alone: each row's inputs are quantized on their own, the int8 products are
    exact integer sums for any row count, and a row's pairs are summed in expert order either way."""
    _, ex = _experts((T.Q4_K, T.Q4_K, T.Q6_K))
    srv = CpuShare(kernels, ex, E, _box(), threads)
    rng = np.random.default_rng(11)
    try:
        for n in (2, 4, ROWS):
            h = rng.standard_normal((n, D)).astype(np.float32)
            ids = np.stack([rng.permutation(E)[:A] for _ in range(n)]).astype(np.int32)
            ids[rng.random((n, A)) < 0.3] = -1
            wts = rng.random((n, A)).astype(np.float32)
            together = srv.layer(0, h, ids, wts)[0].copy()
            alone = np.concatenate(
                [srv.layer(0, h[t : t + 1], ids[t : t + 1], wts[t : t + 1])[0].copy() for t in range(n)]
            )  # copies: an answer is a view of the server's buffer
            assert np.array_equal(together, alone), f"{n} rows"
    finally:
        srv.close()


def test_a_stand_in_answers_instead_of_the_compiled_server(kernels: Kernels) -> None:
    """With `compute` set, the compiled server leaves each request to Python, which answers with it (the GPU
    tests' int8 twin); unset, the compiled server answers again."""
    _, ex = _experts((T.Q8_0, T.Q8_0, T.Q8_0))
    box = _box()
    srv = CpuShare(kernels, ex, E, box, 2)
    where, take = np.full(E, -1, np.int32), np.arange(ROWS * A + 1, dtype=np.int32)
    ticket = np.array([int(box.ctl[ks.MB_REQ])], np.int64)
    h = np.ones((2, D), np.float32)
    ids, wts = np.array([[0, 1, 2], [3, 4, 5]], np.int32), np.ones((2, A), np.float32)
    seen = []

    def stand_in(li, h, ids, wts):
        seen.append((li, ids.copy()))
        return np.full(h.shape, 7.0, np.float32), (ids >= 0).sum(axis=1)

    def ask() -> np.ndarray:
        ks.ref_cpu_publish(h, ids, wts, 1, where, take, box.ctl, box.h, box.ids, box.wts, ticket)
        x = np.zeros((2, D), np.float32)
        deadline = time.monotonic() + 10
        while not ks.ref_cpu_collect(x, box.ctl, box.out, ticket):
            assert time.monotonic() < deadline, "the server did not answer"
            time.sleep(1e-4)
        return x

    try:
        srv.compute = stand_in
        assert (ask() == 7.0).all() and len(seen) == 1 and seen[0][0] == 1
        assert srv.take_calls(2).tolist() == [3, 3]
        srv.compute = None
        assert not (ask() == 7.0).all() and len(seen) == 1, "the compiled server answers again"
        assert srv.take_calls(2).tolist() == [3, 3] and srv.requests == 2
    finally:
        srv.close()


def test_a_row_without_cpu_experts_gets_zeros_and_no_calls(kernels: Kernels) -> None:
    _, ex = _experts((T.Q8_0, T.Q8_0, T.Q8_0))
    box = _box()
    srv = CpuShare(kernels, ex, E, box, 2)
    try:
        y, calls = srv.layer(
            0, np.ones((2, D), np.float32), np.full((2, A), -1, np.int32), np.ones((2, A), np.float32)
        )
        assert not y.any() and not calls.any()
    finally:
        srv.close()
    assert box.ctl.size == MB_WORDS


def test_probe_reads_cold_experts_and_fits_a_rate(kernels: Kernels) -> None:
    _, ex = _experts((T.Q8_0, T.Q8_0, T.Q8_0))
    srv = CpuShare(kernels, ex, E, _box(), 2)
    try:
        polls = []
        rate, fixed = srv.probe(until=lambda: polls.append(1) or len(polls) > 30, min_runs=4)
        assert rate > 1e8 and 0 <= fixed < 0.1 and len(polls) > 30
    finally:
        srv.close()


def test_split_balances_the_two_sides() -> None:
    m = 9.6e6  # 80B shape at 24 GiB: ~5.4 misses of 1.77 MB a layer
    cpu = 37e9 / share.CPU_EFFICIENCY  # a CPU pool as fast as PCIe inside decode
    s = share.choose(m, 37e9, cpu, 0.0)
    assert s.pcie_frac == pytest.approx(0.5)
    assert s.layer_s == pytest.approx(m / 37e9 / 2 + share.SERIAL_S)
    s = share.choose(m, 37e9, cpu, 20e-6)  # the hand-off costs the CPU side: it gets a little less
    assert 0.5 < s.pcie_frac < 0.6
    assert s.layer_s < m / 37e9  # better than PCIe alone
    # the H200 host as probed (zero-copy 37.6 GB/s in graph, CPU 29.9 GB/s beside it, 86 us): PCIe alone wins,
    # as every share measured there decoded slower
    assert share.choose(m, 37.6e9, 29.9e9, 86e-6).pcie_frac == 1.0
    # a consumer PC: PCIe 4 (25 GB/s, in graph ~18.5) and a CPU pool of 60 GB/s: the CPU takes about half
    pc = share.choose(m, 18.5e9, 60e9, 86e-6)
    assert 0.3 < pc.pcie_frac < 0.6 and pc.layer_s < 0.8 * pc.gpu_alone_s
    assert share.choose(m, 37e9, 0.0, 0.0).pcie_frac == 1.0  # no CPU rate: no share
    assert share.choose(1e4, 37e9, cpu, 50e-6).pcie_frac == 1.0  # tiny misses: the hand-off is not worth it
    assert share.choose(m, 37e9, cpu, 0.0, given=0.25).pcie_frac == 0.25
    assert "--pcie-frac 0.25" in share.choose(m, 37e9, cpu, 0.0, given=0.25).why(m)
    with pytest.raises(Exception, match="--pcie-frac"):
        share.parse_pcie_frac("1.5")
    assert share.parse_pcie_frac("auto") is None and share.parse_pcie_frac("0") == 0.0


def test_publish_takes_the_last_distinct_misses() -> None:
    """cpu_publish's pick (its twin): the CPU's own always; of the m distinct PCIe misses, take[m + r] (r the
    riders the GPU reads in any case), the last in routing order, never one the lookahead picked (its copy may
    still land in the table)."""
    where = np.array([0, -1, -1, -2, -1, -1, 3, -1], np.int32)
    take = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4], np.int32)
    ids = np.array([[1, 2, 3, 0], [4, 2, 5, 6]], np.int32)  # misses 1, 2, 4, 5 (2 twice): m = 4 -> 2
    mids, took = ks.ref_cpu_pick(ids, where, take)
    assert took == [5, 2]  # from the end: 5, then 2 (both of its pairs)
    assert mids.tolist() == [-1, 2, 3, -1, -1, 2, 5, -1]
    mids, took = ks.ref_cpu_pick(ids, where, take, picked=np.array([5, -1], np.int32))  # m = 3 -> 1
    assert took == [2] and mids.tolist() == [-1, 2, 3, -1, -1, 2, -1, -1]
    mids, took = ks.ref_cpu_pick(ids, where, np.arange(9, dtype=np.int32))  # every miss: 2 in both rows
    assert sorted(took) == [1, 2, 4, 5] and mids.tolist() == [1, 2, 3, -1, 4, 2, 5, -1]
    mids, took = ks.ref_cpu_pick(ids[:1, [0, 3]], where, take)  # one miss: take[1] = 0, nothing published
    assert took == [] and (mids < 0).all()
    # riders (where <= -3) count on the GPU's side: m = 4 misses and 6 riding give take[5] = 2 of a steeper
    # table, where take[4] = 1; with one miss left, at most that one
    steep = np.array([0, 0, 1, 1, 1, 2, 3, 3, 4], np.int32)
    assert len(ks.ref_cpu_pick(ids, where, steep)[1]) == 1
    riding = where.copy()
    riding[6] = -3 - 3
    mids, took = ks.ref_cpu_pick(ids, riding, steep)
    assert took == [5, 2] and mids.tolist() == [-1, 2, 3, -1, -1, 2, 5, -1]
    riding[[1, 2, 4]] = [-3, -4, -7]  # one miss (5), riders 1, 2, 4, 6: take[5] = 2, capped at 1
    assert ks.ref_cpu_pick(ids, riding, steep)[1] == [5]


def test_take_table_balances_each_layers_misses() -> None:
    per = 1.77e6  # an 80B expert; PCIe 50 GB/s: 35 us each
    cpu, fixed = 30e9, 20e-6
    t = share.take_table(4, 10, per, 50e9, cpu, fixed)
    assert t.shape == (5, 41) and not t[0].any()
    for n in (1, 4):
        assert t[n, 0] == 0 and (np.diff(t[n]) >= 0).all() and (np.diff(t[n]) <= 1).all()
        for m in range(41):  # no other k makes the layer shorter
            cost = [
                max(share.BASE_S + (m - j) * per / 50e9, fixed + j * per / cpu) + share.HANDOFF_S
                if j
                else share.BASE_S + m * per / 50e9
                for j in range(m + 1)
            ]
            assert cost[int(t[n, m])] == pytest.approx(min(cost))
    assert t[1, 1] == 0 and t[1, 10] > 0  # one miss is not worth a hand-off; ten are
    assert (t[4, :11] == t[1, :11]).all()  # each expert read once, whatever the rows that route to it
    assert not share.take_table(1, 10, per, 50e9, 3e9, 86e-6).any()  # a slow pool takes nothing
    given = share.take_table(2, 2, per, 0, 0, 0, given=0.5)
    assert given.tolist() == [[0, 1, 1, 2, 2]] * 3  # halves round up, whatever the rows
    assert not share.take_table(1, 4, per, 0, 0, 0, given=1.0).any()
    frac, layer = share.expect(t, 10, 0.55, per, 50e9, cpu, fixed)
    _, alone = share.expect(t * 0, 10, 0.55, per, 50e9, cpu, fixed)
    assert 0.5 < frac < 1.0 and layer < 0.85 * alone
    assert alone == pytest.approx(share.BASE_S + 5.5 * per / 50e9)


def test_token_split_says_what_start_up_and_the_planner_print() -> None:
    # the H200 host's probe (80B shape at 24 GiB): the table it chose there, [0, 0, 1, 1, 2, ...], less the
    # one expert of two misses, which no longer pays once the hand-off's own cost (HANDOFF_S) is counted
    per = 1.769472e6
    take, frac, layer, line = share.token_split(4, 10, 0.545, per, 50.9e9, 41.0e9, 37e-6)
    assert take[1, :11].tolist() == [0, 0, 0, 1, 2, 2, 2, 3, 3, 4, 4]
    assert 0.55 < frac < 0.7 and 130e-6 < layer < 175e-6  # measured: 146 of 463 MB on the CPU, 94.5 tok/s
    assert line.startswith("decode misses (auto): the CPU takes [0, 0, 0, 1, 2, 2, 2, 3, 3, 4, 4]")
    assert "--pcie-frac 0.70" in share.token_split(1, 10, 0.5, per, 50e9, 40e9, 40e-6, 0.7)[3]


def test_probe_cache_round_trips(tmp_path) -> None:
    c = share.ProbeCache(tmp_path / "probe.json")
    assert c.get("k") is None
    r = share.Rates(40e9, 55e9, 20e9, 1e-5, 50e9, 30e9)
    c.put("k", r)
    c.put("other", share.Rates(1, 2, 3, 4, 5, 6))
    assert share.ProbeCache(tmp_path / "probe.json").get("k") == r
    (tmp_path / "probe.json").write_text("{not json")
    assert c.get("k") is None  # a broken file is measured again, never an error


def test_cache_marks_the_cpu_share_and_keeps_the_full_table() -> None:
    """The decode table sends the CPU's share to the zero slot; `full` (long passes) and staging still read
    those experts from the arena; the hit counter sees them as -2."""
    from strata.tiers.layout import ExpertLayer, ExpertLayout, Part

    parts = tuple(Part(f"p{p}", int(T.Q8_0), 32, 32, 34) for p in range(3))
    layout = ExpertLayout(8, 2, (ExpertLayer(0, parts), ExpertLayer(1, parts)), (1088, 1088, 1088))

    class Arena:
        memory = np.zeros((2, 3, 8, 1088), np.uint8)
        bases = int(memory.ctypes.data) + 8 * 1088 * np.arange(6, dtype=np.int64).reshape(2, 3)
        strides = np.full((2, 3), 1088, np.int64)

    cache = ExpertCache(layout, 4, NumpyBytes(4, layout.strides), Arena())
    cache.fill(None)  # the static fill: experts 0 and 1 of each layer resident
    zero = (11, 22, 33)
    cache.share_with_cpu(0.5, zero)
    assert cache.cpu.sum(axis=1).tolist() == [3, 3]  # half of the 6 misses, the highest ids
    assert cache.cpu[:, 5:].all() and not cache.cpu[:, :5].any()
    assert (cache.table[:, 0, 5:] == 11).all() and (cache.table[:, 2, 5:] == 33).all()
    assert (cache.full[:, 0, 5:] == Arena.bases[:, :1] + np.arange(5, 8) * 1088).all()
    assert np.array_equal(cache.table[:, :, :5], cache.full[:, :, :5])
    kinds = cache.where_kinds()
    assert (kinds[:, 5:] == -2).all() and (kinds[:, 2:5] == -1).all() and (kinds[:, :2] >= 0).all()
    st = cache.staging()
    assert st is not None and not (st.table == 11).any(), "long chunks never read the zero slot"
    got = kt.ref_tier_count(np.array([0, 3, 6, 7], np.int32), 2, kinds[0], 100, 2)
    assert got.tolist() == [[2, 1, 100], [2, 0, 0]]

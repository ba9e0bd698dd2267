"""The CPU expert pool: worker count from the real CPU budget, CPU plans, fused experts vs numpy."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from quant_blocks import random_blocks

from strata.blocks.moe import dispatch
from strata.errors import ConfigError
from strata.jit import cpus, reference
from strata.jit.kernels import Kernels
from strata.jit.pool import ExpertPool, ExpertWeights


def test_worker_default_follows_restricted_affinity() -> None:
    before = os.sched_getaffinity(0)
    one = min(before)
    try:
        os.sched_setaffinity(0, {one})
        plan = cpus.host_plan(0, "auto")
    finally:
        os.sched_setaffinity(0, before)
    assert plan.workers == 1 and plan.worker_cpus == (one,)


def test_worker_default_follows_cgroup_quota() -> None:
    assert cpus.default_workers(affinity=76, quota=16.0) == 16  # the seed that was throttled
    assert cpus.default_workers(affinity=8, quota=1.5) == 2  # a partial CPU still runs a thread
    assert cpus.default_workers(affinity=4, quota=None) == 4
    assert cpus.default_workers(affinity=4, quota=0.2) == 1
    assert cpus.parse_cpu_max("max 100000\n") is None
    assert cpus.parse_cpu_max("150000 100000\n") == 1.5
    assert cpus.parse_cfs("-1", "100000") is None
    assert cpus.parse_cfs("400000", "100000") == 4.0


def _fake_root(tmp: Path, cgroup: str, files: dict[str, str]) -> Path:
    (tmp / "proc/self").mkdir(parents=True)
    (tmp / "proc/self/cgroup").write_text(cgroup)
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


def test_cgroup_v2_quota_is_the_tightest_on_the_path(tmp_path: Path) -> None:
    root = _fake_root(
        tmp_path,
        "0::/kube/pod1\n",
        {
            "sys/fs/cgroup/kube/cpu.max": "1600000 100000\n",  # 16 CPUs for the pod's parent
            "sys/fs/cgroup/kube/pod1/cpu.max": "max 100000\n",
        },
    )
    assert cpus.cgroup_quota(root) == 16.0


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    root = _fake_root(
        tmp_path,
        "4:cpu,cpuacct:/docker/abc\n",
        {
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "250000\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cpus.cgroup_quota(root) == 2.5
    assert cpus.cgroup_quota(_fake_root(tmp_path / "none", "0::/\n", {})) is None


def test_plans() -> None:
    p = cpus.plan([0, 1, 2, 3], None, 0, "auto")
    assert (p.workers, p.worker_cpus, p.aux_cpus) == (4, (0, 1, 2, 3), (0, 1, 2, 3))
    p = cpus.plan([0, 1, 2, 3], None, 3, "auto")
    assert (p.worker_cpus, p.aux_cpus) == ((0, 1, 2), (3,))
    p = cpus.plan(list(range(8)), None, 0, "0,6-7")
    assert (p.workers, p.worker_cpus, p.aux_cpus) == (5, (1, 2, 3, 4, 5), (0, 6, 7))
    p = cpus.plan(list(range(76)), 16.0, 0, "auto")
    assert p.workers == 16
    with pytest.raises(ConfigError, match="--aux-cpus"):
        cpus.plan([0, 1], None, 0, "5")
    with pytest.raises(ConfigError, match="--aux-cpus"):
        cpus.plan([0, 1], None, 0, "0-1")
    with pytest.raises(ConfigError, match="--aux-cpus"):
        cpus.plan([0, 1], None, 0, "zero")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    return Kernels(tmp_path_factory.mktemp("jit-cache"))


def _experts(qt: T, e: int, rows: int, cols: int, seed: int) -> ExpertWeights:
    return ExpertWeights(np.stack([random_blocks(qt, rows, cols, seed=seed + i) for i in range(e)]), qt)


@pytest.mark.parametrize(
    "types",
    [(T.Q4_K, T.Q4_K, T.Q6_K), (T.Q8_0, T.Q8_0, T.Q8_0), (T.F32, T.F32, T.Q5_0)],
    ids=["q4k-q6k", "q8_0", "f32-q5_0"],
)
@pytest.mark.parametrize("n_tok", [1, 7, 40])
def test_moe_matches_numpy_dispatch(kernels: Kernels, types: tuple[T, T, T], n_tok: int) -> None:
    e, d, f, a = 8, 256, 256, 3
    gate, up = _experts(types[0], e, f, d, 0), _experts(types[1], e, f, d, 100)
    down = _experts(types[2], e, d, f, 200)
    rng = np.random.default_rng(n_tok)
    x = (rng.standard_normal((n_tok, d)) * 0.05).astype(np.float32)
    ids = np.stack([rng.choice(e, a, replace=False) for _ in range(n_tok)])
    w = rng.random((n_tok, a)).astype(np.float32)

    def ref(ex: int, xs: np.ndarray) -> np.ndarray:
        return reference.expert(
            xs, (gate.raw[ex], types[0]), (up.raw[ex], types[1]), (down.raw[ex], types[2])
        )

    want = dispatch(x, ids, w, ref)
    results = []
    for workers in (1, 2, 3):
        pool = ExpertPool(kernels, cpus.CpuPlan(workers, (), ()))
        try:
            results.append(pool.moe(x, ids, w, gate, up, down))
        finally:
            pool.close()
    # float32 both ways, summed in different orders; relative to the output's scale
    err = np.abs(results[0] - want).max() / np.abs(want).max()
    assert err < 1e-5, f"worst relative error {err:.2e}"
    for r in results[1:]:
        assert np.array_equal(r, results[0]), "the result must not depend on the worker count"


def test_pool_dense_matmul_split_is_exact(kernels: Kernels) -> None:
    raw = random_blocks(T.Q4_1, 4096, 1024)
    x = np.random.default_rng(0).standard_normal((8, 1024)).astype(np.float32)
    pool = ExpertPool(kernels, cpus.CpuPlan(2, (), ()))
    try:
        assert np.array_equal(pool.matmul(raw, T.Q4_1, x), kernels.matmul(raw, T.Q4_1, x))
    finally:
        pool.close()


def test_work_is_handed_out_as_awaitable_futures(kernels: Kernels) -> None:
    raw = random_blocks(T.Q8_0, 16, 64)
    x = np.ones((2, 64), np.float32)
    pool = ExpertPool(kernels, cpus.CpuPlan(2, (), ()))

    async def main() -> np.ndarray:
        return await asyncio.wrap_future(pool.submit(kernels.matmul, raw, T.Q8_0, x))

    try:
        assert np.array_equal(asyncio.run(main()), kernels.matmul(raw, T.Q8_0, x))
    finally:
        pool.close()


def test_workers_are_pinned_to_their_cpus(kernels: Kernels) -> None:
    one = min(os.sched_getaffinity(0))
    pool = ExpertPool(kernels, cpus.CpuPlan(1, (one,), (one,)))
    try:
        assert pool.submit(os.sched_getaffinity, 0).result() == {one}
    finally:
        pool.close()


def test_blas_is_held_to_one_thread_under_the_pool() -> None:
    from strata.jit.blas import blas_threads, limit_blas_threads

    before = blas_threads()
    if before is None:
        pytest.skip("numpy is not linked to OpenBLAS here")
    try:
        assert limit_blas_threads(1) and blas_threads() == 1
    finally:
        limit_blas_threads(before)
    assert blas_threads() == before


def test_engine_pins_helper_thread_to_aux_cpus(smollm2_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import threading

    from strata.engine import Engine

    first = min(os.sched_getaffinity(0))
    eng = Engine.load(smollm2_path, backend="jit", aux_cpus=str(first), pool_workers=1)
    seen: list[set[int]] = []

    def helper() -> None:  # a thread of its own, so the test runner's affinity is untouched
        eng.pin_helper_thread()
        seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=helper)
    t.start()
    t.join()
    assert seen == [{first}]

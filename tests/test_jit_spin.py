"""Dense matmuls split over spinning helpers (jit/spin.py) and q/k/v-style packed matmuls
(JitBackend.matmul_cat): both must give exactly the bits of one kernel call per matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from quant_blocks import random_blocks

from strata.gguf import GGUFFile
from strata.jit import cpus
from strata.jit.backend import JitBackend
from strata.jit.kernels import Kernels
from strata.jit.pool import ExpertPool


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    return Kernels(tmp_path_factory.mktemp("jit-cache"))


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("rows,n_tok", [(256, 1), (1000, 1), (4096, 5), (1544, 3)])
def test_spin_split_equals_one_call(kernels: Kernels, workers: int, rows: int, n_tok: int) -> None:
    raw = random_blocks(T.Q4_1, rows, 1024, seed=rows)
    x = np.random.default_rng(n_tok).standard_normal((n_tok, 1024)).astype(np.float32)
    pool = ExpertPool(kernels, cpus.CpuPlan(workers, (), ()))
    try:
        want = kernels.matmul(raw, T.Q4_1, x)
        for _ in range(20):  # repeated: helpers pick tasks up from every state (spinning, napping)
            assert np.array_equal(pool.matmul(raw, T.Q4_1, x), want)
        assert pool._spin is not None, "a 1024-wide matrix this size should have gone to the helpers"
    finally:
        pool.close()
    assert not any(t.is_alive() for t in pool._spin.threads)


def test_caller_takes_the_share_of_a_parked_helper(kernels: Kernels) -> None:
    """Parked helpers nap instead of spinning; the caller then claims their share and runs it itself
    (or waits for a helper that claimed it first): either way the result is whole and exact."""
    raw = random_blocks(T.Q8_0, 2048, 512, seed=7)
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    pool = ExpertPool(kernels, cpus.CpuPlan(2, (), ()))
    try:
        group = pool._spin_group()
        fn_address = pool._kernel(T.Q8_0, raw, x)
        assert fn_address is not None
        want = kernels.matmul(raw, T.Q8_0, x)
        group.park(True)
        for _ in range(50):
            out = np.full(want.shape, np.nan, np.float32)
            group.matmul(*fn_address, raw, x, out, [(0, 1024), (1024, 2048)])
            assert np.array_equal(out, want)
    finally:
        pool.close()


def test_matmul_cat_equals_separate_matmuls(smollm2_path: Path, kernels: Kernels) -> None:
    gguf = GGUFFile(smollm2_path)
    backend = JitBackend(gguf, ExpertPool(kernels, cpus.CpuPlan(2, (), ())))
    try:
        qkv = ("blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.3.attn_v.weight")
        for n_tok in (1, 7, 70):  # 70: more than one kernel slice of MAX_TOKENS
            x = np.random.default_rng(n_tok).standard_normal((n_tok, 576)).astype(np.float32)
            got = backend.matmul_cat(x, qkv)
            assert got is not None and got.shape == (n_tok, 576 + 2 * 192)
            assert np.array_equal(got, np.concatenate([backend.matmul(x, n) for n in qkv], axis=1))
        # Q4_1 beside Q8_0 rows cannot share one kernel call: the caller multiplies them one by one
        assert backend.matmul_cat(x, ("blk.0.attn_q.weight", "token_embd.weight")) is None
    finally:
        backend.close()

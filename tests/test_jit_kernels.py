"""The llvmlite kernels against their numpy twins (jit/reference.py).

Tolerance: the kernels decode every weight bit-exactly and only sum in another order, so each
y[t, r] must be within REL * sum_c |x[t, c] * w[r, c]| of the float64 reference: the bound on
float32 rounding for a reordered sum (REL = 2e-5 ~ 170 float32 ulps, covering the ~C/16 terms each
SIMD lane adds up for C <= 4096). The worst element is reported on failure.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from quant_blocks import random_blocks

from strata.jit import reference
from strata.jit.host import detect, with_features
from strata.jit.kernels import Kernels

REL = 2e-5
TYPES = [
    T.Q8_0,
    T.Q4_0,
    T.Q4_1,
    T.Q5_0,
    T.Q5_1,
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.IQ4_XS,
    T.IQ4_NL,
    T.F32,
    T.F16,
    T.BF16,
]
# (rows, cols, tokens): full tiles, ragged row tails (rows % 4), ragged token tails (n % 4), and
# the expert / dense shapes the models use (cols up to 4096, n_tok up to 64).
SHAPES = [(1, 256, 1), (7, 512, 3), (64, 256, 4), (37, 1024, 5), (130, 2048, 64), (19, 4096, 13)]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    return Kernels(tmp_path_factory.mktemp("jit-cache"))


def _check(k: Kernels, qt: T, rows: int, cols: int, n: int, seed: int = 0) -> np.ndarray:
    raw = random_blocks(qt, rows, cols, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((n, cols)).astype(np.float32)
    y = k.matmul(raw, qt, x)
    ref = reference.matmul(raw, qt, x)
    scale = reference.abs_products(raw, qt, x)
    bad = np.abs(y - ref) > REL * scale + 1e-30
    if bad.any():
        err = np.abs(y - ref) / np.maximum(scale, 1e-30)
        t, r = np.unravel_index(np.argmax(err), err.shape)
        pytest.fail(
            f"{qt.name} {rows}x{cols} n={n}: {int(bad.sum())} elements off; worst y[{t}, {r}] = "
            f"{y[t, r]!r} vs {ref[t, r]!r} (error {err[t, r]:.2e} of sum |x*w|, allowed {REL})"
        )
    return y


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_numpy_reference(kernels: Kernels, qt: T, shape: tuple[int, int, int]) -> None:
    _check(kernels, qt, *shape)


@pytest.mark.parametrize("qt", [T.Q4_1, T.Q6_K, T.IQ4_XS], ids=lambda q: q.name)
def test_tokens_and_row_splits_are_bit_identical(kernels: Kernels, qt: T) -> None:
    """batch == solo and any split of the rows == one call, exactly (each output's FMA sequence
    does not depend on the tile that computes it)."""
    raw = random_blocks(qt, 45, 512, seed=3)
    x = np.random.default_rng(4).standard_normal((11, 512)).astype(np.float32)
    full = kernels.matmul(raw, qt, x)
    solo = np.concatenate([kernels.matmul(raw, qt, x[i : i + 1]) for i in range(11)])
    assert np.array_equal(full, solo)
    split = np.empty_like(full)
    for r0, r1 in ((0, 5), (5, 6), (6, 40), (40, 45)):
        kernels.matmul(raw, qt, x, out=split, rows=(r0, r1))
    assert np.array_equal(full, split)


@pytest.mark.parametrize(
    "drop",
    [("avx512",), ("avx512", "f16c"), ("avx512", "avx2", "avx", "fma", "f16c", "sse4", "ssse3")],
    ids=["avx2", "avx2-no-f16c", "sse2"],
)
def test_narrower_hosts(tmp_path, drop: tuple[str, ...]) -> None:
    """The AVX2 code (8 lanes), the scalar fp16 path and plain SSE2 (no vpshufb: the portable
    table lookup), compiled here with those features turned off; the code runs on any x86-64."""
    host = detect()
    if not host.x86:
        pytest.skip("feature subsets are x86 names")
    k = Kernels(tmp_path, host=with_features(host, drop))
    for qt in (T.Q4_1, T.Q5_K, T.Q6_K, T.IQ4_XS, T.Q8_0):
        _check(k, qt, 37, 1024, 5)


def test_disk_cache_skips_compilation(tmp_path) -> None:
    raw = random_blocks(T.Q4_K, 9, 512)
    x = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    first = Kernels(tmp_path)
    y1 = first.matmul(raw, T.Q4_K, x)
    assert first.compiler.compiled == 1 and len(list(tmp_path.glob("qmm_q4_k-*.o"))) == 1
    second = Kernels(tmp_path)
    assert np.array_equal(second.matmul(raw, T.Q4_K, x), y1)
    assert second.compiler.compiled == 0


def test_kernels_use_the_host_simd_width() -> None:
    host = detect()
    if not host.x86 or not host.has("avx2"):
        pytest.skip("checks x86 register names")
    from strata.jit.formats import FORMATS
    from strata.jit.matmul_ir import build

    k = Kernels(None, host=host)
    asm = k.compiler.asm(build(FORMATS[T.Q4_0], host, k.tiling))
    reg = "%zmm" if host.has("avx512f") else "%ymm"
    assert reg in asm and "vfmadd" in asm


def test_shape_mismatch_is_an_error(kernels: Kernels) -> None:
    raw = random_blocks(T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="does not match"):
        kernels.matmul(raw, T.Q8_0, np.zeros((2, 32), np.float32))

"""The int8-input products (jit/qdot_ir.py) against their numpy twins (jit/reference.py `quantize_q8`,
`qdot`) to the bit, on this host's instructions and on plain IR (no AVX2); and against the float64 product
of gguf's dequantized weights within the rounding of the inputs to int8: |y - x.w| <= sum_c |w_c| d_x / 2
(each input is off by at most half its block's step d_x) plus float32 slack.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize
from quant_blocks import random_blocks

from strata.jit import reference
from strata.jit.host import detect, with_features
from strata.jit.kernels import Kernels

TYPES = [T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.Q8_0]
# (rows, cols, tokens): ragged row tails (rows % 2), ragged token tails (n % 4), the experts' shapes
SHAPES = [(1, 256, 1), (7, 512, 3), (37, 1024, 5), (64, 2048, 4), (130, 512, 9)]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    return Kernels(tmp_path_factory.mktemp("jit-cache"))


def _inputs(n: int, cols: int, seed: int) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal((n, cols)) * 2).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block: step 0, codes 0
    if n > 2:
        x[2, 5] = 40.0  # an outlier: its block's other codes round coarsely
    return x


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_equals_its_twin_and_rounds_only_the_inputs(kernels: Kernels, qt: T, shape) -> None:
    rows, cols, n = shape
    raw = random_blocks(qt, rows, cols, seed=rows)
    x = _inputs(n, cols, seed=cols + n)
    xq = kernels.quantize(x)
    assert np.array_equal(xq, reference.quantize_q8(x)), "the quantized inputs"
    y = kernels.dot(raw, qt, xq)
    assert np.array_equal(y, reference.qdot(raw, qt, xq)), "the products"
    w = dequantize(raw, qt).astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    step = np.repeat(
        xq.reshape(n, -1, reference.Q8_BYTES)[..., :4].copy().view(np.float32)[..., 0], 256, axis=1
    )
    bound = (step / 2) @ np.abs(w).T + 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-30
    worst = float((np.abs(y - exact) / bound).max())
    assert worst <= 1.0, f"{qt.name} {shape}: off by {worst:.3f} of the input rounding's bound"


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_tokens_and_row_splits_are_bit_identical(kernels: Kernels, qt: T) -> None:
    raw = random_blocks(qt, 45, 1024, seed=3)
    xq = kernels.quantize(_inputs(6, 1024, seed=4))
    whole = kernels.dot(raw, qt, xq)
    solo = np.concatenate([kernels.dot(raw, qt, xq[t : t + 1]) for t in range(6)])
    parts = sum(kernels.dot(raw, qt, xq, rows=(r0, min(r0 + 7, 45))) for r0 in range(0, 45, 7))
    assert np.array_equal(whole, solo), "batch == solo"
    assert np.array_equal(whole, parts), "any split of the rows"


def test_plain_ir_gives_the_same_bits(tmp_path) -> None:
    """Without AVX2 the two multiply-adds are plain IR: the same integers, so the same bits."""
    host = detect()
    if not host.x86:
        pytest.skip("feature subsets are x86 names")
    here, plain = Kernels(tmp_path / "a"), Kernels(tmp_path / "b", host=with_features(host, ("avx",)))
    x = _inputs(3, 512, seed=9)
    assert np.array_equal(here.quantize(x), plain.quantize(x))
    for qt in TYPES:
        raw = random_blocks(qt, 9, 512, seed=1)
        assert np.array_equal(here.dot(raw, qt, here.quantize(x)), plain.dot(raw, qt, plain.quantize(x))), (
            qt.name
        )


def test_types_without_an_int8_product_and_bad_inputs_are_refused(kernels: Kernels) -> None:
    assert kernels.dot_fn(T.Q4_0) is None and kernels.dot_fn(T.F16) is None
    with pytest.raises(ValueError, match="multiple of 256"):
        kernels.quantize(np.zeros((1, 100), np.float32))
    with pytest.raises(ValueError, match="no int8 product"):
        kernels.dot(random_blocks(T.Q4_0, 2, 256), T.Q4_0, kernels.quantize(np.zeros((1, 256), np.float32)))
    with pytest.raises(ValueError, match="no int8 product"):  # rows of whole 256-blocks only
        kernels.dot(random_blocks(T.Q8_0, 2, 96), T.Q8_0, np.zeros((1, 0), np.uint8))

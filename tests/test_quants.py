"""strata.quants against gguf-py's numpy reference (`gguf.quants.dequantize`), bit for bit.

Three sources of blocks: random-but-valid bytes (every type, many shapes), gguf-py's own numpy
quantizers on weight-like floats, and tensors written by llama.cpp's llama-quantize
(tests/data/llama_quantize_tensors.gguf, made by tests/oracle/build_quant_fixture.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T
from quant_blocks import random_blocks  # tests/ is on sys.path (pytest rootdir-less dir, conftest.py)

import strata.quants as Q
from strata.errors import UnknownQuantTypeError
from strata.gguf.reader import GGUFFile

FIXTURE = Path(__file__).parent / "data" / "llama_quantize_tensors.gguf"

# The types the engine must support, plus the cheap extras strata.quants also decodes.
REQUIRED = [
    T.F32,
    T.F16,
    T.BF16,
    T.Q8_0,
    T.Q4_0,
    T.Q4_1,
    T.Q5_0,
    T.Q5_1,
    T.Q2_K,
    T.Q3_K,
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.IQ4_XS,
    T.IQ4_NL,
    T.IQ3_XXS,
    T.IQ2_XS,
    T.MXFP4,
]
EXTRAS = [T.IQ2_XXS, T.IQ2_S, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0]
# gguf-py ships numpy quantizers for these (F32/F16 are plain casts).
QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.TQ1_0, T.TQ2_0, T.MXFP4]
# (rows, blocks per row): a single block, one long row, odd row counts, a bigger tile.
SHAPES = [(1, 1), (1, 7), (3, 2), (17, 3), (64, 8)]


def reference(raw: np.ndarray, qtype: T) -> np.ndarray:
    """gguf-py's dequantization; its numpy may warn (overflow in scratch math), which is not ours."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32)


def assert_bit_exact(ours: np.ndarray, ref: np.ndarray, qtype: T) -> None:
    """Every float identical in bits (any NaN matches any NaN); on failure name the worst block."""
    assert ours.dtype == np.float32
    assert ours.shape == ref.shape, f"{qtype.name}: shape {ours.shape} != reference {ref.shape}"
    same = (ours.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(ours) & np.isnan(ref))
    if same.all():
        return
    block = GGML_QUANT_SIZES[qtype][0]
    bad_per_block = (~same).reshape(-1, block).sum(axis=1)  # blocks are consecutive in each row
    worst = int(bad_per_block.argmax())
    per_row = ours.shape[-1] // block
    flat_o, flat_r = ours.reshape(-1, block)[worst], ref.reshape(-1, block)[worst]
    elem = int((~same.reshape(-1, block)[worst]).argmax())
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # inf - inf, all-NaN: still report
        warnings.simplefilter("ignore")
        max_diff = float(np.nanmax(np.abs(ours.astype(np.float64) - ref)))
    pytest.fail(
        f"{qtype.name}: {int((~same).sum())} of {same.size} values differ in"
        f" {int((bad_per_block > 0).sum())} of {bad_per_block.size} blocks; max |diff| {max_diff:g}\n"
        f"worst block #{worst} (row {worst // per_row}, block {worst % per_row} of it;"
        f" {int(bad_per_block[worst])} bad), first bad element {elem}:"
        f" ours {flat_o[elem]!r} vs reference {flat_r[elem]!r}\n"
        f"ours[block]      = {flat_o.tolist()}\nreference[block] = {flat_r.tolist()}"
    )


def test_supported_covers_required() -> None:
    assert set(REQUIRED) | set(EXTRAS) <= Q.SUPPORTED


@pytest.mark.parametrize("qtype", REQUIRED + EXTRAS, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}blk")
def test_random_blocks_match_reference(qtype: T, shape: tuple[int, int]) -> None:
    rows, n_blocks = shape
    cols = n_blocks * GGML_QUANT_SIZES[qtype][0]
    raw = random_blocks(qtype, rows, cols, seed=rows * 1000 + n_blocks)
    out = Q.dequantize(raw, qtype)
    assert out.shape == (rows, cols)
    assert_bit_exact(out, reference(raw, qtype), qtype)
    assert_bit_exact(Q.dequantize(raw, qtype, n_cols=cols), out, qtype)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("qtype", REQUIRED + EXTRAS, ids=lambda t: t.name)
def test_chunk_boundaries(qtype: T, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One block per chunk splits rows between kernel calls (and threads): bits must not change."""
    raw = random_blocks(qtype, 5, 3 * GGML_QUANT_SIZES[qtype][0], seed=7)
    monkeypatch.setattr(Q, "CHUNK_ELEMS", 1)
    monkeypatch.setattr(Q, "THREADS", threads)
    assert_bit_exact(Q.dequantize(raw, qtype), reference(raw, qtype), qtype)


def weight_like(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    w = rng.standard_t(4, size=(rows, cols)) * np.exp(rng.normal(-3, 1, (rows, 1)))
    w[rng.random(w.shape) < 0.01] *= 30  # outliers set the block scales
    w[0, : cols // 2] = 0.0  # all-zero blocks: d = 0
    return w.astype(np.float32)


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_gguf_quantizer_roundtrip(qtype: T) -> None:
    w = weight_like(np.random.default_rng(int(qtype)), 37, 512)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        raw = gguf.quants.quantize(w, qtype).view(np.uint8)
    out = Q.dequantize(raw, qtype)
    assert_bit_exact(out, reference(raw, qtype), qtype)
    assert np.abs(out - w).max() <= np.abs(w).max() * 0.5  # sanity: decodes to the same weights


def _fixture() -> GGUFFile:
    if not FIXTURE.exists():
        pytest.fail(f"{FIXTURE} is missing; run tests/oracle/build_quant_fixture.py")
    return GGUFFile(FIXTURE)


def test_fixture_has_every_required_type() -> None:
    present = {t.qtype for t in _fixture().tensors.values()}
    missing = sorted(t.name for t in set(REQUIRED) - present)
    assert not missing, f"llama-quantize fixture lost types: {missing}"


def _fixture_names() -> list[str]:
    return sorted(GGUFFile(FIXTURE).tensors) if FIXTURE.exists() else []


@pytest.mark.parametrize("name", _fixture_names())
def test_llama_quantize_tensors_match_reference(name: str) -> None:
    f = _fixture()
    info = f.tensors[name]
    raw = f.raw(name)
    out = Q.dequantize(raw, info.qtype)
    assert out.shape == info.shape
    assert np.isfinite(out).all()
    assert_bit_exact(out, reference(raw, info.qtype), info.qtype)


def test_dequantize_rows_middle_range() -> None:
    f = _fixture()
    for name in ("Q4_K.imatrix", "IQ2_XS.imatrix", "Q8_0.plain", "F16.plain"):
        full = Q.dequantize(f.raw(name), f.tensors[name].qtype)
        part = Q.dequantize_rows(f, name, 13, 40)
        assert part.shape == (27, full.shape[1])
        assert np.array_equal(part.view(np.uint32), full[13:40].view(np.uint32)), name
        assert Q.dequantize_rows(f, name, 5, 5).shape == (0, full.shape[1])
    with pytest.raises(IndexError):
        Q.dequantize_rows(f, "Q4_K.imatrix", 10, 65)


def _write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, T]]) -> GGUFFile:
    w = gguf.GGUFWriter(str(path), "test")
    for name, (raw, qtype) in tensors.items():
        w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(path)


def test_dequantize_expert_and_leading_axes(tmp_path: Path) -> None:
    n_expert, rows, cols = 4, 6, 512
    raw = random_blocks(T.Q4_K, n_expert * rows, cols, seed=3).reshape(n_expert, rows, -1)
    f = _write_gguf(tmp_path / "experts.gguf", {"ffn_up_exps.weight": (raw, T.Q4_K)})
    assert f.tensors["ffn_up_exps.weight"].shape == (n_expert, rows, cols)
    full = Q.dequantize(f.raw("ffn_up_exps.weight"), T.Q4_K)  # leading axes are kept
    assert full.shape == (n_expert, rows, cols)
    buf = np.full((rows, cols), np.nan, np.float32)
    for e in range(n_expert):
        assert np.array_equal(Q.dequantize_expert(f, "ffn_up_exps.weight", e), full[e])
        assert Q.dequantize_expert(f, "ffn_up_exps.weight", e, out=buf) is buf
        assert np.array_equal(buf, full[e])
    with pytest.raises(IndexError):
        Q.dequantize_expert(f, "ffn_up_exps.weight", n_expert)


def test_one_dimensional_and_fresh_output() -> None:
    raw = random_blocks(T.F32, 1, 64)[0]  # 1-D bytes in, 1-D floats out
    out = Q.dequantize(raw, T.F32)
    assert out.shape == (64,) and out.flags.writeable and not np.shares_memory(out, raw)
    assert np.array_equal(out, raw.view(np.float32))


def test_bad_row_width_or_out_is_rejected() -> None:
    raw = random_blocks(T.Q8_0, 2, 64)
    with pytest.raises(ValueError, match="n_cols"):
        Q.dequantize(raw, T.Q8_0, n_cols=32)
    with pytest.raises(ValueError, match="blocks"):
        Q.dequantize(raw[:, :-1], T.Q8_0)
    for bad in (np.empty((2, 32), np.float32), np.empty((2, 64)), np.empty((64, 2), np.float32).T):
        with pytest.raises(ValueError, match="out must be"):
            Q.dequantize(raw, T.Q8_0, out=bad)


@pytest.mark.parametrize("qtype", [T.Q8_1, T.Q8_K, T.I32, 9999], ids=str)
def test_unsupported_type_raises(qtype: T | int) -> None:
    with pytest.raises(UnknownQuantTypeError, match="supported types: .*Q4_K"):
        Q.dequantize(np.zeros((1, 292), np.uint8), qtype)


def test_unsupported_type_in_file_names_the_file(tmp_path: Path) -> None:
    f = _write_gguf(tmp_path / "q8k.gguf", {"w": (np.zeros((2, 292), np.uint8), T.Q8_K)})
    with pytest.raises(UnknownQuantTypeError, match="q8k.gguf.*Q8_K"):
        Q.dequantize_rows(f, "w", 0, 1)

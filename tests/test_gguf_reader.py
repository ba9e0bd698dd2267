"""Our GGUF header parser against gguf-py's reader, and typed errors for bad files."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from strata.errors import (
    GGUFError,
    NotGGUFError,
    TruncatedFileError,
    UnknownArchitectureError,
    UnknownQuantTypeError,
    UnsupportedVersionError,
)
from strata.gguf import GGUFFile


def _write_tiny(path: Path, arch: str = "llama") -> Path:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ü", "😀"])
    w.add_array("some.floats", [1.5, 2.5])
    w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_matches_gguf_reader(smollm2_path: Path) -> None:
    ours = GGUFFile(smollm2_path)
    ref = GGUFReader(smollm2_path)
    assert set(ours.tensors) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.qtype == t.tensor_type
        assert mine.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert mine.offset == t.data_offset
        assert np.array_equal(ours.raw(t.name).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
    toks = ref.fields["tokenizer.ggml.tokens"]
    assert ours.get("tokenizer.ggml.tokens")[1000] == bytes(toks.parts[toks.data[1000]]).decode()
    assert ours.arch_get("block_count") == 30


def test_opens_big_vocab_fast(smollm2_path: Path, gemma3_path: Path) -> None:
    for p in (smollm2_path, gemma3_path):
        t0 = time.perf_counter()
        g = GGUFFile(p)
        # generous bound: the point is "not 15 s like gguf.GGUFReader", not a benchmark
        assert time.perf_counter() - t0 < 2.0
        assert len(g.get("tokenizer.ggml.tokens")) > 40000


def test_roundtrip_small_file(tmp_path: Path) -> None:
    g = GGUFFile(_write_tiny(tmp_path / "t.gguf"))
    assert g.architecture == "llama"
    assert g.get("tokenizer.ggml.tokens").tolist() == ["a", "b", "ü", "😀"]
    assert g.get("some.floats").tolist() == [1.5, 2.5]
    assert np.array_equal(g.raw("token_embd.weight").view(np.float32), np.arange(32).reshape(4, 8))


def test_garbage_file(tmp_path: Path) -> None:
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"this is not a model at all" * 10)
    with pytest.raises(NotGGUFError, match="junk.gguf"):
        GGUFFile(p)


def test_truncated_tensor_data(tmp_path: Path) -> None:
    p = _write_tiny(tmp_path / "t.gguf")
    data = p.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-16])
    with pytest.raises(TruncatedFileError, match="truncated"):
        GGUFFile(tmp_path / "cut.gguf")


def test_truncated_header(tmp_path: Path) -> None:
    p = _write_tiny(tmp_path / "t.gguf")
    (tmp_path / "cut.gguf").write_bytes(p.read_bytes()[:60])
    with pytest.raises(TruncatedFileError):
        GGUFFile(tmp_path / "cut.gguf")


def test_bad_version(tmp_path: Path) -> None:
    data = bytearray(_write_tiny(tmp_path / "t.gguf").read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    (tmp_path / "v.gguf").write_bytes(bytes(data))
    with pytest.raises(UnsupportedVersionError, match="version 99"):
        GGUFFile(tmp_path / "v.gguf")


def test_unknown_quant_type_id(tmp_path: Path) -> None:
    p = _write_tiny(tmp_path / "t.gguf")
    data = bytearray(p.read_bytes())
    name = b"blk.0.attn_norm.weight"
    at = data.index(name) + len(name) + 4 + 8  # after n_dims and one dim
    data[at : at + 4] = (250).to_bytes(4, "little")
    (tmp_path / "q.gguf").write_bytes(bytes(data))
    with pytest.raises(UnknownQuantTypeError, match="250"):
        GGUFFile(tmp_path / "q.gguf")


def test_unknown_architecture_lists_supported(tmp_path: Path) -> None:
    from strata.engine import Engine

    p = _write_tiny(tmp_path / "a.gguf", arch="mamba9")
    with pytest.raises(UnknownArchitectureError, match=r"mamba9.*supported: .*llama.*qwen3moe"):
        Engine.load(p)


def test_missing_file_is_typed(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")

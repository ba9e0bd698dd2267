"""The GPU tests' oracle fixtures: the tiny qwen3moe, qwen3next and qwen4exp models the converter wrote
(tests/oracle builds them here; the GPU machine gets their Q8_0 copies carried in, perf/README.md says how),
and the copies derived from them: qwen4exp's Q8_0 (`q8_copy`, from its F32 oracle) and any file's F32."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q

from strata.quants import dequantize

FIXTURES = {
    "qwen3moe": "tiny_qwen3moe/tiny-q8_0.gguf",
    "qwen3next": "tiny_qwen3next/strata-tiny-qwen3next-q8_0.gguf",
    "qwen4exp": "tiny_qwen4exp/strata-tiny-qwen4exp-q8_0.gguf",  # q8_copy of the F32 oracle fixture
}
QWEN4EXP_F32 = "tiny_qwen4exp/strata-tiny-qwen4exp-f32.gguf"


def fixture(arch: str = "qwen3moe") -> Path:
    root = Path(os.environ.get("STRATA_FIXTURES", Path.home() / ".cache/strata/fixtures"))
    path = root / FIXTURES[arch]
    if not path.exists() and arch == "qwen4exp" and (root / QWEN4EXP_F32).exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        q8_copy(root / QWEN4EXP_F32, path)
    if not path.exists():
        pytest.skip(f"{path} not found (build the oracle fixtures, or carry it to the GPU machine)")
    return path


def _copy_fields(r: gguf.GGUFReader, w: gguf.GGUFWriter) -> None:
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)


def q8_copy(src: Path, dst: Path) -> Path:
    """The F32 qwen4exp oracle fixture as the converter's Q8_0 would write it: every matrix whose rows are
    whole 32-value blocks in Q8_0 (gguf's own quantizer), the rest (norms, conv kernels, the mixers' rank-16
    up matrices, the PLE table's rows of 16) kept F32. Written once: a fixture the GPU machine is given."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(r.fields["general.architecture"].contents()))
    _copy_fields(r, w)
    for t in r.tensors:
        shape = tuple(int(v) for v in reversed(t.shape))
        data = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
        if len(shape) > 1 and shape[-1] % 32 == 0 and "per_layer_token_embd" not in t.name:
            w.add_tensor(t.name, gguf.quants.quantize(data, Q.Q8_0), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def f32_copy(src: Path, dst: Path) -> Path:
    """The same model with every tensor dequantized to F32 (metadata and tokenizer copied)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(r.fields["general.architecture"].contents()))
    _copy_fields(r, w)
    for t in r.tensors:
        shape = tuple(int(v) for v in reversed(t.shape))
        w.add_tensor(t.name, dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst

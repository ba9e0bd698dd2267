"""Stream a synthetic GGUF to disk: header through gguf's GGUFWriter, tensor data with os.pwrite.

The file is preallocated at its final size, then every quantized tensor is written as ~1 MiB slices
of a calibrated block pool (blocks.py) at random block offsets, straight from the pool's memory:
no per-block Python work and no tensor-sized buffer, so a 16 GiB file streams through a few MiB of
RAM at whatever rate the page cache / disk takes it. Small F32 tensors (norms, routers, DeltaNet
parameters) are generated whole. The file is written under a temporary name and renamed at the end.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType as Q

from strata.errors import StrataError
from strata.synth import locality
from strata.synth.blocks import pool
from strata.synth.plan import KEY_MODE, Fill, TensorSpec, add_metadata, dense_values, tensor_plan
from strata.synth.router import router_weights
from strata.synth.shapes import Shape
from strata.synth.vocab import add_qwen3_tokenizer, missing_files

ALIGNMENT = gguf.GGUF_DEFAULT_ALIGNMENT
SEGMENT_BYTES = 1 << 20  # one pwrite: large enough that syscalls are noise, small enough to look random
HEADER_BUDGET = 32 << 20  # header + vocabulary upper bound, for the free-space check before writing

Progress = Callable[[int, int], None]


class SynthError(StrataError):
    """The synthetic file cannot be written (bad path, no space); the message says why."""


@dataclass(frozen=True, slots=True)
class SynthResult:
    path: Path
    nbytes: int
    data_bytes: int
    seconds: float  # preallocation + tensor data (the header is mostly the vocabulary: ~1.5 s)

    @property
    def gb_per_s(self) -> float:
        return self.data_bytes / max(self.seconds, 1e-9) / 1e9


def _pad(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _check_space(path: Path, need: int) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SynthError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise SynthError(f"cannot write {path}: directory {parent} is not writable")
    free = shutil.disk_usage(parent).free
    if free < need:
        raise SynthError(
            f"not enough disk space for {path}: needs {need:,} bytes ({need / 2**30:.2f} GiB), "
            f"{parent} has {free:,} bytes free"
        )


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, pos)
        data, pos = data[n:], pos + n


def _stream_pool(fd: int, blocks: np.ndarray, pos: int, nbytes: int, rng: np.random.Generator) -> None:
    """Write nbytes (whole blocks) at pos as slices of `blocks` [n, type_size] from random offsets."""
    size = blocks.shape[1]
    seg_blocks = min(blocks.shape[0], max(1, SEGMENT_BYTES // size))
    flat = blocks.reshape(-1).data  # a memoryview: slices are zero-copy
    n_seg = -(-nbytes // (seg_blocks * size))
    starts = rng.integers(0, blocks.shape[0] - seg_blocks + 1, n_seg) * size
    done = 0
    for start in starts.tolist():
        n = min(seg_blocks * size, nbytes - done)
        _pwrite_all(fd, flat[start : start + n], pos + done)
        done += n


def _write_tensor(
    fd: int, spec: TensorSpec, pos: int, s: Shape, skew: float, rng: np.random.Generator
) -> None:
    if spec.fill is Fill.WEIGHT:
        _stream_pool(fd, pool(spec.qtype, spec.std), pos, spec.nbytes, rng)
        return
    if spec.fill is Fill.ROUTER:
        data = router_weights(s.d_model, s.n_expert, s.top_k, skew, rng)
    else:
        data = dense_values(spec, rng)
    _pwrite_all(fd, np.ascontiguousarray(data).reshape(-1).view(np.uint8).data, pos)


def _preallocate(fd: int, size: int, path: Path) -> None:
    """Reserve the blocks up front (no ENOSPC halfway through a 16 GiB write, less fragmentation)."""
    fallocate = getattr(os, "posix_fallocate", None)  # Linux; macOS has none
    try:
        if fallocate is None:
            raise OSError(errno.EOPNOTSUPP, "no posix_fallocate")
        fallocate(fd, 0, size)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SynthError(f"not enough disk space for {path}: needs {size:,} bytes") from None
        os.ftruncate(fd, size)  # filesystems without fallocate: a sparse file of the right size


def _write_header(
    tmp: Path,
    s: Shape,
    quant: Q,
    plan: list[TensorSpec],
    skew: float,
    seed: int,
    tokenizer_dir: Path,
    router_mode: str,
) -> int:
    """Metadata + tensor infos; returns the byte offset where tensor data starts."""
    w = gguf.GGUFWriter(tmp, s.arch)
    add_metadata(w, s, quant, plan, skew, seed)
    if router_mode != "skew":  # skew-mode files stay byte for byte what they were
        w.add_string(KEY_MODE, router_mode)
    add_qwen3_tokenizer(w, tokenizer_dir, s.vocab)
    for t in plan:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return _pad(tmp.stat().st_size)


def write_synth(
    path: str | os.PathLike[str],
    s: Shape,
    quant: Q,
    output_quant: Q,
    skew: float,
    tokenizer_dir: Path,
    seed: int = 0,
    progress: Progress | None = None,
    router_mode: str = "skew",
) -> SynthResult:
    """Write the synthetic model for shape `s` to `path`; raises SynthError for path or space trouble.
    router_mode "locality": routing with temporal locality (locality.py), else independent per token."""
    path = Path(path)
    if router_mode not in locality.MODES:
        raise SynthError(f"router mode {router_mode!r}: choose from {', '.join(locality.MODES)}")
    if router_mode == "locality" and s.n_head // s.n_kv < 2:
        raise SynthError(f"router mode locality needs two query heads a kv head ({s.n_head} / {s.n_kv})")
    if missing := missing_files(tokenizer_dir):
        raise SynthError(f"no Qwen3 tokenizer in {tokenizer_dir} (missing {', '.join(missing)})")
    plan = tensor_plan(s, quant, output_quant, head_blocks=router_mode == "locality")
    data_bytes = sum(_pad(t.nbytes) for t in plan)
    _check_space(path, data_bytes + HEADER_BUDGET)
    tmp = path.with_name(path.name + ".tmp")
    try:
        start = _write_header(tmp, s, quant, plan, skew, seed, tokenizer_dir, router_mode)
        fd = os.open(tmp, os.O_RDWR)
        try:
            t0, pos = time.perf_counter(), start
            _preallocate(fd, start + data_bytes, path)
            offsets = []
            for i, spec in enumerate(plan):
                _write_tensor(fd, spec, pos, s, skew, np.random.default_rng([seed, i]))
                offsets.append(pos)
                pos += _pad(spec.nbytes)
                if progress is not None:
                    progress(pos - start, data_bytes)
            if router_mode == "locality":
                locality.patch(fd, s, plan, offsets, skew, seed)
            seconds = time.perf_counter() - t0
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SynthError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return SynthResult(path, start + data_bytes, data_bytes, seconds)

"""Our own mmap-first GGUF header parser.

gguf.GGUFReader builds a numpy view per metadata element, which takes ~15 s on a 262k-token
vocabulary. We walk the header with struct.unpack_from over one mmap, keep numeric arrays as
zero-copy numpy views, and defer decoding string arrays until someone asks for them.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from strata.errors import (
    ChecksumError,
    GGUFError,
    NotGGUFError,
    TruncatedFileError,
    UnknownQuantTypeError,
    UnsupportedVersionError,
)

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Scalar value types: struct format (little-endian) for each.
_SCALAR_FMT: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SCALAR_NP: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}


class StringArray:
    """A GGUF string array decoded on first use (vocabularies hold 150k-260k entries)."""

    def __init__(self, buf: mmap.mmap, offset: int, count: int) -> None:
        self._buf = buf
        self._offset = offset
        self._count = count
        self._items: list[str] | None = None

    def __len__(self) -> int:
        return self._count

    def _load(self) -> list[str]:
        if self._items is None:
            buf, pos, out = self._buf, self._offset, []
            unpack = struct.unpack_from
            for _ in range(self._count):
                (n,) = unpack("<Q", buf, pos)
                pos += 8
                out.append(buf[pos : pos + n].decode("utf-8", errors="surrogateescape"))
                pos += n
            self._items = out
        return self._items

    def __getitem__(self, i: int) -> str:
        return self._load()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def tolist(self) -> list[str]:
        return list(self._load())


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's place in the file. `shape` is numpy order: the last axis is contiguous."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return self.shape[-1] // block * size


class GGUFFile:
    """An opened GGUF file: metadata, tensor table and zero-copy tensor views."""

    def __init__(self, path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None) -> None:
        self.path = os.fspath(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise GGUFError(self.path, "no such file") from None
        except IsADirectoryError:
            raise GGUFError(self.path, "is a directory, not a GGUF file") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):  # Linux opens a directory read-only; mmap then fails with EINVAL
                raise GGUFError(self.path, "is a directory, not a GGUF file")
            if not stat.S_ISREG(st.st_mode):
                raise GGUFError(self.path, "is not a regular file")
            self.file_size = st.st_size
            if self.file_size < 24:
                if self.file_size >= 4 and os.pread(fd, 4, 0) == GGUF_MAGIC:
                    raise TruncatedFileError(self.path, f"header cut short ({self.file_size} bytes)")
                raise NotGGUFError(self.path, "not a GGUF file (too short, no GGUF magic)")
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._pos = 0
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()
        for key, value in (overrides or {}).items():
            # a scalar for an array key sets every element: one ratio for every layer, say
            old = self.metadata.get(key)
            array = old is not None and not isinstance(old, (str, bytes)) and hasattr(old, "__len__")
            self.metadata[key] = [value] * len(old) if array else value

    # ---- header walking -------------------------------------------------------------------
    def _need(self, n: int, what: str) -> None:
        if self._pos + n > self.file_size:
            raise TruncatedFileError(self.path, f"file ends inside the header while reading {what}")

    def _unpack(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size, what)
        (v,) = struct.unpack_from(fmt, self._mm, self._pos)
        self._pos += size
        return v

    def _string(self, what: str) -> str:
        n = self._unpack("<Q", what)
        self._need(n, what)
        raw = self._mm[self._pos : self._pos + n]
        self._pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def _value(self, vtype: int, key: str) -> Any:
        try:
            vt = GGUFValueType(vtype)
        except ValueError:
            raise GGUFError(self.path, f"metadata key {key!r} has unknown value type {vtype}") from None
        if vt in _SCALAR_FMT:
            return self._unpack(_SCALAR_FMT[vt], key)
        if vt == GGUFValueType.STRING:
            return self._string(key)
        etype = GGUFValueType(self._unpack("<I", key))
        count = self._unpack("<Q", key)
        if etype in _SCALAR_NP:
            dt = np.dtype(_SCALAR_NP[etype])
            self._need(count * dt.itemsize, key)
            arr = np.frombuffer(self._mm, dtype=dt, count=count, offset=self._pos)
            self._pos += count * dt.itemsize
            return arr
        if etype == GGUFValueType.STRING:
            start = self._pos
            for _ in range(count):  # skip over; decoding waits for StringArray._load
                self._pos += 8 + self._unpack("<Q", key)
            self._need(0, key)
            return StringArray(self._mm, start, count)
        return [self._value(etype, key) for _ in range(count)]

    def _parse(self) -> None:
        if self._mm[:4] != GGUF_MAGIC:
            raise NotGGUFError(self.path, "not a GGUF file (bad magic)")
        self._pos = 4
        self.version = self._unpack("<I", "version")
        if self.version not in SUPPORTED_VERSIONS:
            raise UnsupportedVersionError(
                self.path, f"GGUF version {self.version} is not supported (we read {SUPPORTED_VERSIONS})"
            )
        n_tensors = self._unpack("<Q", "tensor count")
        n_kv = self._unpack("<Q", "metadata count")
        if n_tensors > self.file_size or n_kv > self.file_size:
            raise GGUFError(self.path, "header counts are impossible for the file size (corrupt header)")
        for _ in range(n_kv):
            key = self._string("metadata key")
            self.metadata[key] = self._value(self._unpack("<I", key), key)
        infos = [self._tensor_info() for _ in range(n_tensors)]
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if align <= 0 or align & (align - 1):
            raise GGUFError(self.path, f"general.alignment={align} is not a power of two")
        self.alignment = align
        self.data_offset = (self._pos + align - 1) // align * align
        for name, shape, qtype, rel in infos:
            block, size = GGML_QUANT_SIZES[qtype]
            n = int(np.prod(shape, dtype=np.int64))
            if shape and shape[-1] % block:
                raise GGUFError(
                    self.path, f"tensor {name!r}: row of {shape[-1]} is not a multiple of {block}"
                )
            info = TensorInfo(name, shape, qtype, self.data_offset + rel, n // block * size)
            if info.offset + info.nbytes > self.file_size:
                raise TruncatedFileError(
                    self.path,
                    f"truncated: tensor {name!r} needs bytes up to {info.offset + info.nbytes}"
                    f" but the file has {self.file_size}",
                )
            self.tensors[name] = info

    def _tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self._string("tensor name")
        n_dims = self._unpack("<I", name)
        if n_dims > 8:
            raise GGUFError(self.path, f"tensor {name!r} has {n_dims} dimensions (corrupt header)")
        dims = [self._unpack("<Q", name) for _ in range(n_dims)]
        tid = self._unpack("<I", name)
        try:
            qtype = GGMLQuantizationType(tid)
        except ValueError:
            raise UnknownQuantTypeError(
                self.path, f"tensor {name!r} has unknown ggml type id {tid}"
            ) from None
        if qtype not in GGML_QUANT_SIZES:
            raise UnknownQuantTypeError(
                self.path, f"tensor {name!r} has ggml type {qtype.name} with no layout"
            )
        rel = self._unpack("<Q", name)
        return name, tuple(reversed(dims)), qtype, rel

    # ---- public accessors -----------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """Read `<arch>.<suffix>`, the per-architecture hyperparameter keys."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy uint8 view of a tensor, shaped [rows, row_bytes] (or [row_bytes] for 1-D)."""
        t = self.tensors[name]
        flat = np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        if len(t.shape) <= 1:
            return flat
        return flat.reshape(*t.shape[:-1], t.row_bytes)

    def bytes_by_type(self) -> Mapping[str, tuple[int, int]]:
        """{type name: (tensor count, bytes)} for `strata info`."""
        out: dict[str, tuple[int, int]] = {}
        for t in self.tensors.values():
            c, b = out.get(t.qtype.name, (0, 0))
            out[t.qtype.name] = (c + 1, b + t.nbytes)
        return out

    def sha256(self, progress: Callable[[int, int], None] | None = None, chunk: int = 16 << 20) -> str:
        h = hashlib.sha256()
        for pos in range(0, self.file_size, chunk):
            h.update(self._mm[pos : pos + chunk])
            if progress is not None:
                progress(min(pos + chunk, self.file_size), self.file_size)
        return h.hexdigest()

    def verify(self, expected: str, progress: Callable[[int, int], None] | None = None) -> None:
        got = self.sha256(progress)
        if got.lower() != expected.lower():
            raise ChecksumError(self.path, f"SHA-256 mismatch: expected {expected}, got {got}")

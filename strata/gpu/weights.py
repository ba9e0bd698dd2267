"""Model weights in VRAM, as the GGUF's own bytes: quantized blocks are uploaded untouched and the
kernels decode them on the fly, so VRAM holds exactly the file's tensor bytes (plus 1-D norm
vectors, kept as float32). A 3-D expert tensor [E, rows, cols] stays one buffer; expert e starts
at e * expert_stride.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.errors import UnknownQuantTypeError
from strata.gguf import GGUFFile
from strata.gpu.kernels.common import GPU_QTYPES
from strata.gpu.runtime import cupy_module
from strata.quants import dequantize


@dataclass(frozen=True, slots=True)
class DevMatrix:
    """A quantized matrix (or stack of expert matrices) resident on the GPU."""

    name: str
    qtype: int
    rows: int  # per expert
    cols: int  # K: the reduction width
    n_expert: int  # 1 for a plain 2-D matrix
    row_bytes: int
    data: Any  # cupy uint8 [n_expert * rows * row_bytes]; None for experts that live in the tiers
    table: Any = None  # experts: device int64 [n_expert], each expert's address (kernels read this)

    @property
    def expert_stride(self) -> int:
        return self.rows * self.row_bytes


def same_kind(ms: list[DevMatrix]) -> bool:
    """Whether these matrices go in one grouped launch (one type, one reduction width)."""
    return all(m.qtype == ms[0].qtype and m.cols == ms[0].cols for m in ms)


def resident(m: DevMatrix) -> DevMatrix:
    """An expert tensor uploaded whole, with its address table (expert e at e * expert_stride)."""
    if m.n_expert == 1:
        return m
    cp = cupy_module()
    table = cp.asarray(m.data.data.ptr + np.arange(m.n_expert, dtype=np.int64) * m.expert_stride)
    return DevMatrix(m.name, m.qtype, m.rows, m.cols, m.n_expert, m.row_bytes, m.data, table)


def role(name: str) -> str:
    """The plan's component for a tensor name (what a user would trade off)."""
    if "_exps" in name:
        return "experts"
    if name.startswith("token_embd"):
        return "embeddings"
    if name.startswith("output"):
        return "output head"
    if ".ssm_" in name:
        return "DeltaNet"
    if ".attn_" in name:
        return "attention"
    return "dense FFN, router and norms"


def weight_bytes(gguf: GGUFFile) -> dict[str, int]:
    """Bytes per component, as they will sit in VRAM (the PLE's n-gram table stays on the host: --ple-io)."""
    out: dict[str, int] = {}
    for t in gguf.tensors.values():
        if t.name.startswith("per_layer_token_embd"):
            continue
        n = int(np.prod(t.shape)) * 4 if len(t.shape) == 1 else t.nbytes
        out[role(t.name)] = out.get(role(t.name), 0) + n
    return out


# Read otherwise than by the product kernels: conv kernels [C, W] as float vectors (DeltaNet, PLE), the PLE's
# n-gram table on the host (--ple-io), the hyper-connection mixers' low-rank matrices as zero-padded floats
_NOT_MATRICES = (
    ".ssm_conv1d",
    ".ple_conv1d",
    "per_layer_token_embd",
    "hc_attn_up",
    "hc_ffn_up",
    "output_hc_up",
)


def check_gpu_types(gguf: GGUFFile) -> None:
    """Refuse at load, naming the tensor, a type the GPU kernels cannot read."""
    for t in gguf.tensors.values():
        if any(k in t.name for k in _NOT_MATRICES):
            continue
        if len(t.shape) > 1 and t.qtype not in GPU_QTYPES:
            names = ", ".join(sorted(GGMLQuantizationType(q).name for q in GPU_QTYPES))
            raise UnknownQuantTypeError(
                gguf.path,
                f"tensor {t.name!r} is {t.qtype.name}, which the GPU kernels "
                f"do not read (supported: {names}); use device=cpu",
            )
        if len(t.shape) > 1 and t.shape[-1] % 32:
            raise UnknownQuantTypeError(
                gguf.path,
                f"tensor {t.name!r} has rows of {t.shape[-1]} values; the GPU kernels need a multiple of 32",
            )


class GpuWeights:
    """Uploads each tensor once, on first request; everything is requested at model start-up."""

    def __init__(self, gguf: GGUFFile) -> None:
        self.gguf = gguf
        self._mats: dict[str, DevMatrix] = {}
        self._vecs: dict[str, Any] = {}

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def matrix(self, name: str) -> DevMatrix:
        hit = self._mats.get(name)
        if hit is None:
            cp = cupy_module()
            info = self.gguf.tensors[name]
            raw = np.ascontiguousarray(self.gguf.raw(name)).reshape(-1)
            n_expert = info.shape[0] if len(info.shape) == 3 else 1
            hit = resident(
                DevMatrix(
                    name,
                    int(info.qtype),
                    info.shape[-2],
                    info.shape[-1],
                    n_expert,
                    info.row_bytes,
                    cp.asarray(raw),
                )
            )
            self._mats[name] = hit
        return hit

    def query_and_gate(self, name: str, n_head: int, head_dim: int) -> tuple[DevMatrix, DevMatrix]:
        """Gated attention's q_proj, whose rows are per head [query (hd) | gate (hd)], uploaded with the rows
        reordered to [every query | every gate] and returned as those two matrices: the query product then
        lands where the q|k|v kernels expect it, and the gate is a product of its own."""
        info = self.gguf.tensors[name]
        raw = self.gguf.raw(name).reshape(n_head, 2, head_dim, info.row_bytes).transpose(1, 0, 2, 3)
        dev = cupy_module().asarray(np.ascontiguousarray(raw).reshape(-1))
        rows = n_head * head_dim
        half = rows * info.row_bytes
        q, g = (
            DevMatrix(f"{name}[{part}]", int(info.qtype), rows, info.shape[-1], 1, info.row_bytes, buf)
            for part, buf in (("query", dev[:half]), ("gate", dev[half:]))
        )
        self._mats[q.name], self._mats[g.name] = q, g
        return q, g

    def float_matrix(self, name: str, rows: int = 0, cols: int = 0) -> DevMatrix:
        """A small matrix as float32, zero-padded to `rows` x `cols` (0: its own): the products read rows in
        multiples of 32 values, and a zero row or column leaves them exact (hyper-connections' low rank)."""
        info = self.gguf.tensors[name]
        r, c = info.shape[-2], info.shape[-1]
        host = np.zeros((max(rows, r), max(cols, c)), np.float32)
        host[:r, :c] = dequantize(self.gguf.raw(name), info.qtype).reshape(r, c)
        m = DevMatrix(
            name, int(GGMLQuantizationType.F32), host.shape[0], host.shape[1], 1, 4 * host.shape[1],
            cupy_module().asarray(host.reshape(-1).view(np.uint8)),
        )  # fmt: skip
        self._mats[name] = m
        return m

    def vector(self, name: str) -> Any:
        """A 1-D tensor (norm weights; DeltaNet's small conv kernel, flattened) as float32 on the device."""
        hit = self._vecs.get(name)
        if hit is None:
            info = self.gguf.tensors[name]
            host = dequantize(self.gguf.raw(name), info.qtype).reshape(-1).astype(np.float32)
            hit = self._vecs[name] = cupy_module().asarray(host)
        return hit

    def nbytes(self) -> int:
        return sum(m.data.nbytes for m in self._mats.values()) + sum(v.nbytes for v in self._vecs.values())

"""The JIT backend as the engine sees it: dense matmuls and MoE experts on quantized weights.

WeightStore.matmul asks `matmul` first and falls back to numpy when it returns None (a quant type
without a kernel); `matmul_cat` does the same for matrices that share an input (q/k/v, gate/up),
whose rows it packs once into one matrix so a decode step makes one kernel call for them, not
three. MoE models hand whole expert windows to `moe`. Built once per engine from its
options (`start`), so configuration is read at load time and nowhere deeper.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.gguf import GGUFFile
from strata.gguf.reader import TensorInfo
from strata.jit.blas import limit_blas_threads
from strata.jit.cpus import host_plan
from strata.jit.kernels import Kernels
from strata.jit.pool import ExpertPool, ExpertWeights

# Tokens per kernel call: the activation tile a row sweep re-reads stays in L2 (64 x 4096 floats
# = 1 MiB at most); longer prompts go through in slices, each re-reading the quantized weights.
MAX_TOKENS = 64


class JitBackend:
    def __init__(self, gguf: GGUFFile, pool: ExpertPool) -> None:
        self.gguf = gguf
        self.pool = pool
        self.kernels = pool.kernels
        self._experts: dict[str, ExpertWeights] = {}
        self._dense: dict[str, tuple[np.ndarray | None, GGMLQuantizationType, int]] = {}  # per tensor, once
        # Matrices multiplied by the same x (q/k/v, gate/up), their quantized rows copied together
        # once so one kernel call covers them all; None where their types or widths differ.
        self._packed: dict[tuple[str, ...], tuple[np.ndarray, GGMLQuantizationType] | None] = {}

    def close(self) -> None:
        self.pool.close()

    def _fits(self, info: TensorInfo) -> bool:
        """A kernel exists for the type and the rows are whole 32-element blocks (float tensors
        may have any width; those that are not a multiple of 32 stay on numpy)."""
        return self.kernels.supports(info.qtype) and info.shape[-1] % 32 == 0

    def matmul(self, x: np.ndarray, name: str, expert: int = -1) -> np.ndarray | None:
        """x [T, cols] . W^T -> [T, rows] with the fused kernels, or None if W's type has none."""
        hit = self._dense.get(name)
        if hit is None:
            info = self.gguf.tensors[name]
            fits = self._fits(info)
            hit = self._dense[name] = (self.gguf.raw(name) if fits else None, info.qtype, info.row_bytes)
        raw, qtype, row_bytes = hit
        if raw is None:
            return None
        raw = raw[expert] if expert >= 0 else raw.reshape(-1, row_bytes)
        return self._sliced(raw, qtype, x)

    def matmul_cat(self, x: np.ndarray, names: tuple[str, ...]) -> np.ndarray | None:
        """x [T, cols] . [W_0; W_1; ...]^T -> [T, sum rows] in one kernel call per token slice, or
        None when the matrices cannot share one (the caller then multiplies them one by one)."""
        if names not in self._packed:
            self._packed[names] = self._pack(names)
        hit = self._packed[names]
        if hit is None:
            return None
        raw, qtype = hit
        return self._sliced(raw, qtype, x)

    def _pack(self, names: tuple[str, ...]) -> tuple[np.ndarray, GGMLQuantizationType] | None:
        infos = [self.gguf.tensors[n] for n in names]
        first = infos[0]
        if any(
            len(i.shape) != 2 or i.qtype != first.qtype or i.row_bytes != first.row_bytes or not self._fits(i)
            for i in infos
        ):
            return None
        rows = [self.gguf.raw(n).reshape(-1, first.row_bytes) for n in names]
        return np.concatenate(rows, axis=0), first.qtype  # uint8 [sum rows, row_bytes], a copy

    def _sliced(self, raw: np.ndarray, qtype: GGMLQuantizationType, x: np.ndarray) -> np.ndarray:
        if x.shape[0] <= MAX_TOKENS:
            return self.pool.matmul(raw, qtype, x)
        return np.concatenate(
            [self.pool.matmul(raw, qtype, x[i : i + MAX_TOKENS]) for i in range(0, x.shape[0], MAX_TOKENS)]
        )

    def experts(self, name: str, table: np.ndarray | None = None) -> ExpertWeights | None:
        """The 3-D expert tensor `name` for the pool; `table` [E] gives each expert's address when the
        experts live in the tiers (a slot or the arena) rather than at their place in the file."""
        w = self._experts.get(name)
        if w is None:
            info = self.gguf.tensors[name]
            if not self._fits(info) or len(info.shape) != 3:
                return None
            w = self._experts[name] = ExpertWeights(self.gguf.raw(name), info.qtype)
        return w if table is None else ExpertWeights(w.raw, w.qtype, table)

    def moe(
        self, h: np.ndarray, ids: np.ndarray, weights: np.ndarray, gate: str, up: str, down: str
    ) -> np.ndarray | None:
        """The SwiGLU experts of one MoE layer over h [T, D] (see ExpertPool.moe); None when a
        tensor's type has no kernel, so the caller takes the numpy path."""
        ws = [self.experts(n) for n in (gate, up, down)]
        if any(w is None for w in ws):
            return None
        # The whole forward call is one window: each used expert's weights are read once. (Unlike a
        # dense matmul, an expert only sees its share of the tokens, T * A / E on average.)
        return self.pool.moe(h, ids, weights, *ws)  # type: ignore[arg-type]


def start(gguf: GGUFFile, cache_dir: Path | None, workers: int, aux_cpus: str) -> JitBackend:
    """Compile nothing yet (kernels build on first use, or load from `cache_dir`); start the pool,
    and keep numpy's BLAS to one thread: the pool's workers are the process's CPU budget."""
    limit_blas_threads(1)
    return JitBackend(gguf, ExpertPool(Kernels(cache_dir), host_plan(workers, aux_cpus)))

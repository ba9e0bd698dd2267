"""The JIT backend as the engine sees it: dense matmuls and MoE experts on quantized weights.

WeightStore.matmul asks `matmul` first and falls back to numpy when it returns None (a quant type
without a kernel); MoE models hand whole expert windows to `moe`. Built once per engine from its
options (`start`), so configuration is read at load time and nowhere deeper.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType
from strata.jit.blas import limit_blas_threads
from strata.jit.cpus import host_plan
from strata.jit.kernels import Kernels
from strata.jit.pool import ExpertPool, ExpertWeights

from strata.gguf import GGUFFile
from strata.gguf.reader import TensorInfo

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
        if x.shape[0] <= MAX_TOKENS:
            return self.pool.matmul(raw, qtype, x)
        return np.concatenate([self.pool.matmul(raw, qtype, x[i : i + MAX_TOKENS])
                               for i in range(0, x.shape[0], MAX_TOKENS)])

    def experts(self, name: str) -> ExpertWeights | None:
        w = self._experts.get(name)
        if w is None:
            info = self.gguf.tensors[name]
            if not self._fits(info) or len(info.shape) != 3:
                return None
            w = self._experts[name] = ExpertWeights(self.gguf.raw(name), info.qtype)
        return w

    def moe(self, h: np.ndarray, ids: np.ndarray, weights: np.ndarray, gate: str, up: str,
            down: str) -> np.ndarray | None:
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

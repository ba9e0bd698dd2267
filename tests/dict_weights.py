"""A stand-in for strata.runtime.weights.WeightStore over a dict of float32 arrays: the calls the blocks make
(matmul, vector, shape), for tests that build layer weights by hand."""

from __future__ import annotations

import numpy as np


class DictWeights:
    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self.t = tensors

    def matmul(self, x: np.ndarray, name: str, expert: int = -1) -> np.ndarray:
        return x @ self.t[name].T

    def vector(self, name: str) -> np.ndarray:
        return self.t[name].reshape(-1)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.t[name].shape

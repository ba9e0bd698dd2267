"""The GPU engine (cupy): quantized kernels, a GPU decoder for llama/qwen3moe/qwen3next/qwen4exp, CUDA-graph
decode.

Importing this package needs no cupy; `resolve_device` decides whether the GPU path runs, and
`gpu_model` builds it from the numpy model (same parameters, same GGUF).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strata.errors import ConfigError
from strata.gpu.runtime import available
from strata.models import registry

if TYPE_CHECKING:
    from strata.gpu.model import GpuModel, GpuOptions
    from strata.models.base import Model

DEVICES = ("auto", "cuda", "cpu")
# the architectures whose model file declares its Structure (strata.models.base): the GPU path builds those
GPU_ARCHS = tuple(arch for arch, cls in registry().items() if cls.structure is not None)


def resolve_device(device: str, arch: str) -> str:
    """'cuda' or 'cpu' for this request. auto takes the GPU when cupy sees one and the architecture
    has a GPU path; an explicit cuda that cannot be honoured is an error naming the option."""
    if device not in DEVICES:
        raise ConfigError("device", device, f"must be one of {', '.join(DEVICES)}")
    if device == "cpu":
        return "cpu"
    if device == "auto":
        return "cuda" if arch in GPU_ARCHS and available() else "cpu"
    if not available():
        raise ConfigError(
            "device", device, "no CUDA GPU is visible to cupy (is cupy installed?); use auto or cpu"
        )
    if arch not in GPU_ARCHS:
        raise ConfigError("device", device, f"the GPU path runs {', '.join(GPU_ARCHS)}, not {arch}; use cpu")
    return "cuda"


def gpu_model(cpu_model: Model, opts: GpuOptions) -> GpuModel:
    from strata.gpu.model import GpuModel

    return GpuModel(cpu_model, opts)  # type: ignore[arg-type]


__all__ = ["DEVICES", "GPU_ARCHS", "available", "gpu_model", "resolve_device"]

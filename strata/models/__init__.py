"""Architecture registry: one module per GGUF `general.architecture`, found by exact name."""

from __future__ import annotations

from strata.errors import UnknownArchitectureError
from strata.gguf import GGUFFile

# Importing the architecture modules registers them.
from strata.models import llama as _llama  # noqa: F401  (registration side effect)
from strata.models import qwen3moe as _qwen3moe  # noqa: F401
from strata.models import qwen3next as _qwen3next  # noqa: F401
from strata.models import qwen4exp as _qwen4exp  # noqa: F401
from strata.models.base import Model, register, registry


def model_class(gguf: GGUFFile) -> type[Model]:
    """The Model class for this file, or UnknownArchitectureError listing what we support."""
    arch = gguf.architecture
    cls = registry().get(arch)
    if cls is None:
        supported = ", ".join(sorted(registry()))
        shown = repr(arch) if arch else "(missing general.architecture)"
        raise UnknownArchitectureError(gguf.path, f"unknown architecture {shown}; supported: {supported}")
    return cls


__all__ = ["Model", "model_class", "register", "registry"]

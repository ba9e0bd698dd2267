"""Strata: tiered Mixture-of-Experts inference for GGUF models.

The public API, imported on first use (so `import strata.gguf` stays light):

    from strata import Engine, SamplingParams
    eng = Engine.load()          # the default model; or Engine.load("model.gguf", device="cuda", ...)
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "FinishReason", "Generation", "GenerationResult", "SamplingParams", "StrataError"]

_HOME = {
    "Engine": "strata.engine",
    "Generation": "strata.engine",
    "GenerationResult": "strata.engine",
    "FinishReason": "strata.runtime.finish",
    "SamplingParams": "strata.sampling.params",
    "StrataError": "strata.errors",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'strata' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOME[name]), name)

"""Synthetic Qwen3-MoE / Qwen3-Next GGUFs: real shapes, names and tokenizer, random valid weights,
and router weights with a chosen expert-popularity skew (issue #7).

    write_synth(path, SHAPES[("qwen3moe", "30b-a3b")], Q.Q4_K, Q.Q6_K, skew=1.0, tokenizer_dir=...)
    file_hit_rate(path, 0.25)     # share of routed picks that caching the top 25% experts serves

Modules: shapes (the model table), plan (tensors + metadata), blocks (calibrated block pools),
router (popularity law + hit-rate estimator), vocab (tokenizer metadata), writer (streaming I/O).
"""

from __future__ import annotations

from strata.synth.blocks import SUPPORTED
from strata.synth.plan import TensorSpec, tensor_plan
from strata.synth.router import expected_hit_rate, file_hit_rate, hit_rate, router_weights
from strata.synth.shapes import ARCHES, SHAPES, Shape
from strata.synth.writer import SynthError, SynthResult, write_synth

__all__ = [
    "ARCHES",
    "SHAPES",
    "SUPPORTED",
    "Shape",
    "SynthError",
    "SynthResult",
    "TensorSpec",
    "expected_hit_rate",
    "file_hit_rate",
    "hit_rate",
    "router_weights",
    "tensor_plan",
    "write_synth",
]

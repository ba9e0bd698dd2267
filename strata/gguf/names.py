"""GGUF tensor names and metadata keys, built in one place from the gguf package's constants.

Architecture files ask for `tensor(T.ATTN_Q, layer)` instead of spelling "blk.3.attn_q.weight",
so a typo is an AttributeError at import time rather than a missing tensor at run time.
"""

from __future__ import annotations

from gguf.constants import MODEL_TENSOR as T
from gguf.constants import TENSOR_NAMES

__all__ = ["T", "tensor", "Keys"]


def tensor(kind: T, layer: int | None = None, suffix: str = "weight") -> str:
    """Full GGUF tensor name, e.g. tensor(T.ATTN_Q, 3) -> 'blk.3.attn_q.weight'."""
    base = TENSOR_NAMES[kind]
    if "{bid}" in base:
        if layer is None:
            raise ValueError(f"{kind.name} is a per-layer tensor; pass its layer")
        base = base.format(bid=layer)
    return f"{base}.{suffix}" if suffix else base


class Keys:
    """Per-architecture hyperparameter key suffixes (read with GGUFFile.arch_get)."""

    BLOCK_COUNT = "block_count"
    CONTEXT_LENGTH = "context_length"
    EMBEDDING_LENGTH = "embedding_length"
    FEED_FORWARD_LENGTH = "feed_forward_length"
    HEAD_COUNT = "attention.head_count"
    HEAD_COUNT_KV = "attention.head_count_kv"
    KEY_LENGTH = "attention.key_length"
    VALUE_LENGTH = "attention.value_length"
    RMS_EPS = "attention.layer_norm_rms_epsilon"
    ROPE_FREQ_BASE = "rope.freq_base"
    ROPE_DIMENSION_COUNT = "rope.dimension_count"
    ROPE_SCALING_TYPE = "rope.scaling.type"
    ROPE_SCALING_FACTOR = "rope.scaling.factor"
    EXPERT_COUNT = "expert_count"
    EXPERT_USED_COUNT = "expert_used_count"
    EXPERT_FEED_FORWARD_LENGTH = "expert_feed_forward_length"
    EXPERT_WEIGHTS_NORM = "expert_weights_norm"
    EXPERT_WEIGHTS_SCALE = "expert_weights_scale"
    VOCAB_SIZE = "vocab_size"

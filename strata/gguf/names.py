"""GGUF tensor names and metadata keys, built in one place from the gguf package's constants.

Architecture files ask for `tensor(T.ATTN_Q, layer)` instead of spelling "blk.3.attn_q.weight",
so a typo is an AttributeError at import time rather than a missing tensor at run time.
"""

from __future__ import annotations

import enum

from gguf.constants import MODEL_TENSOR as T
from gguf.constants import TENSOR_NAMES

__all__ = ["Keys", "T", "X", "tensor"]


class X(enum.Enum):
    """Tensors the PyPI gguf (0.19) does not know yet, spelled as llama.cpp's own gguf-py spells them
    (llama-cpp-python 0.3.36 sdist, vendor/llama.cpp/gguf-py/gguf/constants.py)."""

    # qwen4exp hyper-connections: the final mixer before the head, and one per sublayer
    HC_HEAD_NORM = "output_hc_norm"
    HC_HEAD_DOWN = "output_hc_down"
    HC_HEAD_UP = "output_hc_up"
    HC_ATTN_NORM = "blk.{bid}.hc_attn_norm"
    HC_ATTN_DOWN = "blk.{bid}.hc_attn_down"
    HC_ATTN_UP = "blk.{bid}.hc_attn_up"
    HC_ATTN_INJECT = "blk.{bid}.hc_attn_inject"
    HC_FFN_NORM = "blk.{bid}.hc_ffn_norm"
    HC_FFN_DOWN = "blk.{bid}.hc_ffn_down"
    HC_FFN_UP = "blk.{bid}.hc_ffn_up"
    HC_FFN_INJECT = "blk.{bid}.hc_ffn_inject"
    # qwen4exp QSA indexer (the converter splits HF's fused index_qk_proj into q and k)
    INDEXER_Q_PROJ = "blk.{bid}.indexer.q_proj"
    INDEXER_K_PROJ = "blk.{bid}.indexer.k_proj"
    INDEXER_Q_NORM = "blk.{bid}.indexer.q_norm"
    INDEXER_K_NORM = "blk.{bid}.indexer.k_norm"
    # qwen4exp PLE; the n-gram table itself is T.PER_LAYER_TOKEN_EMBD ("per_layer_token_embd")
    PLE_KEY = "blk.{bid}.ple_key"
    PLE_VALUE = "blk.{bid}.ple_value"
    PLE_NORM_KEY = "blk.{bid}.ple_norm_key"
    PLE_NORM_QUERY = "blk.{bid}.ple_norm_query"
    PLE_NORM_CONV = "blk.{bid}.ple_norm_conv"
    PLE_CONV1D = "blk.{bid}.ple_conv1d"


def tensor(kind: T | X, layer: int | None = None, suffix: str = "weight") -> str:
    """Full GGUF tensor name, e.g. tensor(T.ATTN_Q, 3) -> 'blk.3.attn_q.weight'."""
    base = kind.value if isinstance(kind, X) else TENSOR_NAMES[kind]
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
    EXPERT_SHARED_FEED_FORWARD_LENGTH = "expert_shared_feed_forward_length"
    VOCAB_SIZE = "vocab_size"
    ROPE_DIMENSION_SECTIONS = "rope.dimension_sections"  # interleaved mrope: frequencies per t/h/w axis
    # Gated DeltaNet (qwen3next, qwen4exp)
    SSM_CONV_KERNEL = "ssm.conv_kernel"
    SSM_STATE_SIZE = "ssm.state_size"  # key head dim
    SSM_GROUP_COUNT = "ssm.group_count"  # key heads
    SSM_TIME_STEP_RANK = "ssm.time_step_rank"  # value heads
    SSM_INNER_SIZE = "ssm.inner_size"  # value heads * value head dim
    RECURRENT_LAYERS = "attention.recurrent_layers"  # per layer: True = DeltaNet, False = attention
    # qwen4exp: hyper-connections, QSA indexer, PLE n-gram embeddings
    HC_COUNT = "hyper_connection.count"
    HC_LOW_RANK = "hyper_connection.low_rank"
    INDEXER_HEAD_COUNT = "attention.indexer.head_count"
    INDEXER_KEY_LENGTH = "attention.indexer.key_length"
    INDEXER_TOP_K = "attention.indexer.top_k"  # token budget, a multiple of the compress ratio
    COMPRESS_RATIOS = "attention.compress_ratios"  # per layer; 0 on layers without an indexer
    PLE_LAYERS = "ple.layers"  # 0-based
    PLE_NGRAM_SIZE = "ple.ngram_size"
    PLE_HEADS_PER_NGRAM = "ple.heads_per_ngram"
    PLE_CONV_KERNEL = "ple.conv_kernel"
    PLE_LAYER_MULTIPLIERS = "ple.layer_multipliers"  # uint64
    PLE_HEAD_OFFSETS = "ple.head_offsets"  # uint64, row offset of each head's vocabulary
    PLE_HEAD_VOCAB_SIZES = "ple.head_vocab_sizes"  # uint64, one prime per head
    PLE_EOS_TOKEN_ID = "ple.eos_token_id"

"""Model shapes the synthetic writer knows: real checkpoints' widths, and tiny ones for CI.

30b-a3b is Qwen3-30B-A3B's config.json and 80b-a3b Qwen3-Next-80B-A3B's (without its MTP layer,
as `convert_hf_to_gguf.py --no-mtp` writes it). The tiny shapes keep every width a multiple of
256 so K-quants apply to every matrix, as in the real files; their size is mostly the real
151936-token vocabulary, so they tie the output head to the embedding (no output.weight: both
llama.cpp and Strata fall back to token_embd).
"""

from __future__ import annotations

from dataclasses import dataclass

QWEN3MOE = "qwen3moe"
QWEN3NEXT = "qwen3next"
ARCHES = (QWEN3MOE, QWEN3NEXT)


@dataclass(frozen=True, slots=True)
class Shape:
    arch: str
    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv: int
    head_dim: int
    n_expert: int
    top_k: int
    expert_ff: int
    dense_ff: int  # config.json intermediate_size: written as feed_forward_length, unused by the MoE layers
    n_ctx: int
    rope_base: float
    vocab: int = 151936
    eps: float = 1e-6
    tied: bool = False
    # qwen3next only
    shared_ff: int = 0
    full_attn_interval: int = 0
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_head_dim: int = 0  # key and value head dim (llama.cpp assumes they are equal)
    conv_kernel: int = 0
    rotary_factor: float = 1.0

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.rotary_factor)

    def recurrent(self, layer: int) -> bool:
        """qwen3next: layer is a Gated DeltaNet (every `full_attn_interval`-th is attention)."""
        return self.arch == QWEN3NEXT and (layer + 1) % self.full_attn_interval != 0

    @property
    def conv_channels(self) -> int:
        return (2 * self.lin_k_heads + self.lin_v_heads) * self.lin_head_dim


_QWEN3MOE_30B = Shape(
    QWEN3MOE,
    "30b-a3b",
    n_layer=48,
    d_model=2048,
    n_head=32,
    n_kv=4,
    head_dim=128,
    n_expert=128,
    top_k=8,
    expert_ff=768,
    dense_ff=6144,
    n_ctx=40960,
    rope_base=1e6,
)
_QWEN3NEXT_80B = Shape(
    QWEN3NEXT,
    "80b-a3b",
    n_layer=48,
    d_model=2048,
    n_head=16,
    n_kv=2,
    head_dim=256,
    n_expert=512,
    top_k=10,
    expert_ff=512,
    dense_ff=5120,
    n_ctx=262144,
    rope_base=1e7,
    shared_ff=512,
    full_attn_interval=4,
    lin_k_heads=16,
    lin_v_heads=32,
    lin_head_dim=128,
    conv_kernel=4,
    rotary_factor=0.25,
)
_QWEN3MOE_TINY = Shape(
    QWEN3MOE,
    "tiny",
    n_layer=2,
    d_model=256,
    n_head=4,
    n_kv=2,
    head_dim=64,
    n_expert=8,
    top_k=2,
    expert_ff=256,
    dense_ff=768,
    n_ctx=4096,
    rope_base=1e6,
    tied=True,
)
_QWEN3NEXT_TINY = Shape(
    QWEN3NEXT,
    "tiny",
    n_layer=4,
    d_model=256,
    n_head=4,
    n_kv=2,
    head_dim=64,
    n_expert=8,
    top_k=2,
    expert_ff=256,
    dense_ff=768,
    n_ctx=4096,
    rope_base=1e7,
    tied=True,
    shared_ff=256,
    full_attn_interval=4,
    lin_k_heads=2,
    lin_v_heads=4,
    lin_head_dim=64,
    conv_kernel=4,
    rotary_factor=0.25,
)

SHAPES: dict[tuple[str, str], Shape] = {
    (s.arch, s.name): s for s in (_QWEN3MOE_TINY, _QWEN3MOE_30B, _QWEN3NEXT_TINY, _QWEN3NEXT_80B)
}

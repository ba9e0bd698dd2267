"""What every architecture shares: the hyperparameters read from GGUF and the decoder loop.

A decoder layer is x += attn(norm(x)); x += ffn(norm(x)). Architectures subclass DecoderLM and
supply what differs (the FFN, q/k norms, RoPE layout); see llama.py and qwen3moe.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from strata.blocks.norms import rms_norm
from strata.blocks.rope import Rope, RopeStyle
from strata.blocks.self_attn import AttnNames, AttnParams, self_attention
from strata.errors import GGUFError
from strata.gguf import GGUFFile
from strata.gguf.names import Keys, T, tensor
from strata.runtime.kvcache import KVCache, KVType
from strata.runtime.passes import forward_pass
from strata.runtime.state import SequenceState
from strata.runtime.weights import WeightStore
from strata.tiers.kvwindow import KVWindow

if TYPE_CHECKING:
    from strata.tiers.budget import Ledger
    from strata.tiers.slots import ExpertCache

_REGISTRY: dict[str, type[Model]] = {}


def register(arch: str):  # type: ignore[no-untyped-def]
    def deco(cls: type[Model]) -> type[Model]:
        cls.arch = arch
        _REGISTRY[arch] = cls
        return cls

    return deco


def registry() -> dict[str, type[Model]]:
    return dict(_REGISTRY)


def require(g: GGUFFile, suffix: str) -> object:
    v = g.arch_get(suffix)
    if v is None:
        raise GGUFError(g.path, f"missing metadata key {g.architecture}.{suffix}")
    return v


@dataclass(frozen=True, slots=True)
class DecoderParams:
    n_layer: int
    d_model: int
    vocab: int
    n_ctx_train: int
    eps: float
    attn: AttnParams
    rope: Rope

    @classmethod
    def from_gguf(cls, g: GGUFFile, rope_style: RopeStyle, qk_norm: bool) -> DecoderParams:
        n_head = int(require(g, Keys.HEAD_COUNT))  # type: ignore[arg-type]
        d_model = int(require(g, Keys.EMBEDDING_LENGTH))  # type: ignore[arg-type]
        head_dim = int(g.arch_get(Keys.KEY_LENGTH, d_model // n_head))
        eps = float(require(g, Keys.RMS_EPS))  # type: ignore[arg-type]
        scale = 1.0
        if g.arch_get(Keys.ROPE_SCALING_TYPE) == "linear":
            scale = float(g.arch_get(Keys.ROPE_SCALING_FACTOR, 1.0))
        return cls(
            n_layer=int(require(g, Keys.BLOCK_COUNT)),  # type: ignore[arg-type]
            d_model=d_model,
            vocab=g.tensors[tensor(T.TOKEN_EMBD)].shape[0],
            n_ctx_train=int(g.arch_get(Keys.CONTEXT_LENGTH, 4096)),
            eps=eps,
            attn=AttnParams(n_head, int(g.arch_get(Keys.HEAD_COUNT_KV, n_head)), head_dim, eps, qk_norm),
            rope=Rope(
                n_rot=int(g.arch_get(Keys.ROPE_DIMENSION_COUNT, head_dim)),
                base=float(g.arch_get(Keys.ROPE_FREQ_BASE, 10000.0)),
                style=rope_style,
                scale=scale,
            ),
        )


@dataclass(frozen=True, slots=True)
class LayerNames:
    """One decoder layer's tensor names, built once at load (formatting them per token showed up
    in decode profiles). `gate_up` and `down` are the dense SwiGLU FFN's; MoE files lack them."""

    attn_norm: str
    ffn_norm: str
    attn: AttnNames
    gate_up: tuple[str, str]
    down: str

    @classmethod
    def of(cls, layer: int) -> LayerNames:
        return cls(
            attn_norm=tensor(T.ATTN_NORM, layer),
            ffn_norm=tensor(T.FFN_NORM, layer),
            attn=AttnNames.of(layer),
            gate_up=(tensor(T.FFN_GATE, layer), tensor(T.FFN_UP, layer)),
            down=tensor(T.FFN_DOWN, layer),
        )


@dataclass(frozen=True, slots=True)
class Structure:
    """What an architecture's layers are made of, declared once in its model file: the GPU path
    (strata.gpu) builds its layers from this and the file's tensors, and a model without one has no GPU path.
    """

    moe: bool = False  # routed experts (else a dense SwiGLU FFN)
    hybrid: bool = False  # Gated DeltaNet layers beside gated attention, a shared expert, attn_post_norm
    streams: bool = False  # hyper-connection streams in place of the residual and its norms (QSA, PLE)


class Model(ABC):
    """Interface the engine drives: fresh per-sequence state and a forward over new tokens."""

    arch: ClassVar[str]
    structure: ClassVar[Structure | None] = None
    params: DecoderParams
    kv_type: KVType = KVType.F32  # how new states store attention KV; Engine.load sets it from --kv-type
    kv_ledger: Ledger | None = None  # --kv-grow on the CPU: the stand-in VRAM the KV takes from the slots
    kv_resident: int = 0  # --kv-resident: a window of cells per layer (tiers/kvwindow.py); 0: none
    kv_chunk: int = 512  # the longest pass the window makes room for (the prefill chunk)
    prompt_rows: int = 0  # rows a lone prompt's pass may read past the chunk (the GPU's wide passes); 0: none

    @abstractmethod
    def new_state(self) -> SequenceState:
        """Empty state for a new sequence."""

    @abstractmethod
    def forward(self, tokens: np.ndarray, state: SequenceState, all_logits: bool = True) -> np.ndarray:
        """Consume `tokens` [T] after `state`; return logits [T, vocab] (or [1, vocab] for the last)."""

    def new_kv(self, layers: list[int]) -> KVCache:
        """An empty KV cache for these attention layers, in the model's kv_type."""
        a = self.params.attn
        window = KVWindow(self.kv_resident, self.kv_chunk) if self.kv_resident else None
        return KVCache(layers, a.n_kv, a.head_dim, kind=self.kv_type, ledger=self.kv_ledger, window=window)

    @property
    def expert_cache(self) -> ExpertCache | None:
        """The expert tiers this model reads routed experts through; None: all resident."""
        w = getattr(self, "w", None)
        return getattr(w, "tiers", None)

    def forward_batch(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        """One window: each sequence consumes its own tokens; returns each one's last logits [vocab].

        This default runs the sequences one after another; architectures that can share the
        weight reads across sequences override it.
        """
        return [self.forward(t, s, all_logits=False)[-1] for t, s in zip(tokens, states)]


class DecoderLM(Model):
    """Pre-norm decoder with self-attention in every layer; subclasses define `ffn`."""

    rope_style: ClassVar[RopeStyle]
    qk_norm: ClassVar[bool]

    def __init__(self, gguf: GGUFFile, weights: WeightStore) -> None:
        self.gguf = gguf
        self.w = weights
        self.params = DecoderParams.from_gguf(gguf, self.rope_style, self.qk_norm)
        out = tensor(T.OUTPUT)
        self.head = out if weights.has(out) else tensor(T.TOKEN_EMBD)  # tied embeddings
        self.names = [LayerNames.of(i) for i in range(self.params.n_layer)]

    def new_state(self) -> SequenceState:
        p = self.params
        return SequenceState(self.new_kv(list(range(p.n_layer))))

    @abstractmethod
    def ffn(self, layer: int, h: np.ndarray) -> np.ndarray:
        """The feed-forward sublayer of `layer` on normed h [T, D]."""

    def ahead(self, layer: int, x: np.ndarray) -> None:
        """At `layer`'s start, on its input x [N, D]: a MoE model predicts the layer's experts here (the
        expert tiers' lookahead, blocks/moe.py); dense models do nothing."""

    def forward(self, tokens: np.ndarray, state: SequenceState, all_logits: bool = True) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        x = self._layers([tokens], [state])
        if not all_logits:
            x = x[-1:]
        return self._head(x)

    def forward_batch(self, tokens: list[np.ndarray], states: list[SequenceState]) -> list[np.ndarray]:
        """All sequences in one pass: each dense weight is read once per window and MoE tokens
        are grouped by expert across sequences; attention stays per sequence."""
        tokens = [np.asarray(t, dtype=np.int64) for t in tokens]
        x = self._layers(tokens, states)
        ends = np.cumsum([len(t) for t in tokens]) - 1
        return list(self._head(x[ends]))

    def _layers(self, tokens: list[np.ndarray], states: list[SequenceState]) -> np.ndarray:
        """Run every layer over the concatenated tokens [sum T, D]; advances each state."""
        p, w = self.params, self.w
        x = self.embed_scale(w.rows(tensor(T.TOKEN_EMBD), np.concatenate(tokens)))  # [N, D]
        positions = np.concatenate([np.arange(s.n_past, s.n_past + len(t)) for t, s in zip(tokens, states)])
        cos_sin = p.rope.tables(positions)
        bounds = np.cumsum([0] + [len(t) for t in tokens])
        segments = [(int(a), int(b), s.kv) for a, b, s in zip(bounds[:-1], bounds[1:], states)]
        with forward_pass(w, states, [len(t) for t in tokens]):
            for i, names in enumerate(self.names):
                self.ahead(i, x)
                h = rms_norm(x, w.vector(names.attn_norm), p.eps)
                x = x + self_attention(h, w, names.attn, p.attn, p.rope, cos_sin, segments)
                h = rms_norm(x, w.vector(names.ffn_norm), p.eps)
                x = x + self.ffn(i, h)
        for t, s in zip(tokens, states):
            s.n_past += len(t)
            s.tokens.extend(int(v) for v in t)
        return x

    def _head(self, x: np.ndarray) -> np.ndarray:
        x = rms_norm(x, self.w.vector(tensor(T.OUTPUT_NORM)), self.params.eps)
        return self.w.matmul(x, self.head)

    def embed_scale(self, x: np.ndarray) -> np.ndarray:
        return x

"""Qwen4-Exp (Qwen3.8-Flash-Next): Qwen3-Next's hybrid decoder with three additions.

- Hyper-connections replace every layer norm: the residual is hc_count streams; a gated mixer
  reads them before each sublayer and the output is injected back into each stream; a final mixer
  feeds the LM head (there is no output norm).
- QSA sparse attention on the full-attention layers: an indexer picks compressed key blocks.
- PLE n-gram hash embeddings on selected DeltaNet layers, added to the streams before the mixer.

    streams = [embed] * n
    per layer: (+ ple) ; streams = inject(streams, mixer(mix_attn(streams))) ;
               streams = inject(streams, moe(mix_ffn(streams)))
    logits = head(mix_head(streams))

RoPE is interleaved mrope; with text positions on all three axes it is NEOX partial RoPE.
DeltaNet value heads are in llama.cpp's tiled order (see blocks/linear_attn.py).
"""

from __future__ import annotations

import numpy as np

from strata.blocks.gated_attn import gated_attention
from strata.blocks.hyper import HCNames, hc_final, hc_inject, hc_mix
from strata.blocks.linear_attn import DeltaNetParams, DeltaNetState, HeadOrder, deltanet
from strata.blocks.moe import lookahead
from strata.blocks.mrope import MRope
from strata.blocks.ple import TABLE, PLEParams, PLEState, embeddings, ple, ple_rows
from strata.blocks.qsa import QSAParams, QSAState, qsa_select
from strata.blocks.rope import RopeStyle
from strata.blocks.shared_moe import moe_shared
from strata.errors import GGUFError
from strata.gguf import GGUFFile
from strata.gguf.names import Keys, T, X, tensor
from strata.models.base import DecoderParams, Model, Structure, register
from strata.models.qwen3next import recurrent_layers, require_int
from strata.runtime.passes import forward_pass
from strata.runtime.state import LayerState, SequenceState
from strata.runtime.weights import WeightStore
from strata.tiers.tables import TableReader, TableStats


def _hc(layer: int | None, norm: X, down: X, up: X, inject: X | None) -> HCNames:
    return HCNames(
        tensor(norm, layer),
        tensor(down, layer),
        tensor(up, layer),
        None if inject is None else tensor(inject, layer),
    )


@register("qwen4exp")
class Qwen4Exp(Model):
    structure = Structure(moe=True, hybrid=True, streams=True)

    def __init__(self, gguf: GGUFFile, weights: WeightStore) -> None:
        self.gguf, self.w = gguf, weights
        self.params = p = DecoderParams.from_gguf(gguf, RopeStyle.NEOX, qk_norm=True)
        sections = [int(s) for s in gguf.arch_get(Keys.ROPE_DIMENSION_SECTIONS, [p.rope.n_rot // 2, 0, 0])]
        self.mrope = MRope(p.rope, (sections[0], sections[1], sections[2]))
        self.linear = recurrent_layers(gguf, p.n_layer)
        self.dn = DeltaNetParams.from_gguf(gguf, HeadOrder.TILED, fused_ba=False, eps=p.eps)
        self.n_streams = require_int(gguf, Keys.HC_COUNT)
        self.top_k = require_int(gguf, Keys.EXPERT_USED_COUNT)
        self.norm_topk = bool(gguf.arch_get(Keys.EXPERT_WEIGHTS_NORM, True))
        self.qsa = self._qsa_params(gguf, p.eps)
        self.ple_layers = [int(i) for i in gguf.arch_get(Keys.PLE_LAYERS, [])]
        if len(self.ple_layers) > 1:  # the converter writes one unnumbered table (per_layer_token_embd)
            raise GGUFError(
                gguf.path,
                f"{Keys.PLE_LAYERS} lists {self.ple_layers}, but the file has one n-gram "
                "table; only a single PLE layer is supported",
            )
        self.ple = PLEParams.from_gguf(gguf, self.n_streams, p.d_model, p.eps) if self.ple_layers else None
        # the n-gram table's rows: RAM, page cache or O_DIRECT (--ple-io, carried by the weight store)
        self.ple_table = TableReader(gguf, TABLE, weights.table_io) if self.ple_layers else None
        self.hc_attn = [
            _hc(i, X.HC_ATTN_NORM, X.HC_ATTN_DOWN, X.HC_ATTN_UP, X.HC_ATTN_INJECT) for i in range(p.n_layer)
        ]
        self.hc_ffn = [
            _hc(i, X.HC_FFN_NORM, X.HC_FFN_DOWN, X.HC_FFN_UP, X.HC_FFN_INJECT) for i in range(p.n_layer)
        ]
        self.hc_head = _hc(None, X.HC_HEAD_NORM, X.HC_HEAD_DOWN, X.HC_HEAD_UP, None)
        out = tensor(T.OUTPUT)
        self.head = out if weights.has(out) else tensor(T.TOKEN_EMBD)

    @property
    def ple_stats(self) -> TableStats:
        """PLE table traffic since load, for timings and benchmarks."""
        return self.ple_table.stats if self.ple_table is not None else TableStats()

    def _qsa_params(self, g: GGUFFile, eps: float) -> dict[int, QSAParams]:
        """QSA settings per attention layer that has an indexer."""
        ratios = [int(r) for r in g.arch_get(Keys.COMPRESS_RATIOS, [])]
        out = {}
        for i, lin in enumerate(self.linear):
            if lin or not self.w.has(tensor(X.INDEXER_Q_PROJ, i)):
                continue
            if i >= len(ratios) or ratios[i] <= 0:
                raise GGUFError(
                    g.path,
                    f"layer {i} has a QSA indexer but {g.architecture}.{Keys.COMPRESS_RATIOS} "
                    f"gives it no compress ratio ({ratios}); llama.cpp's converter writes zeros when "
                    "transformers renames full_attention to indexed_attention. Give the checkpoint's "
                    "indexer_compress_ratio with --override-kv "
                    f"{g.architecture}.{Keys.COMPRESS_RATIOS}=int:N (N: the config's indexer_compress_ratio)",
                )
            out[i] = QSAParams(
                n_heads=require_int(g, Keys.INDEXER_HEAD_COUNT),
                head_dim=require_int(g, Keys.INDEXER_KEY_LENGTH),
                budget=require_int(g, Keys.INDEXER_TOP_K),
                ratio=ratios[i],
                eps=eps,
            )
        return out

    def new_state(self) -> SequenceState:
        attn = [i for i, lin in enumerate(self.linear) if not lin]
        layers: dict[tuple[str, int], LayerState] = {
            ("deltanet", i): DeltaNetState.empty(self.dn) for i, lin in enumerate(self.linear) if lin
        }
        layers.update({("qsa", i): QSAState.empty(q) for i, q in self.qsa.items()})
        if self.ple is not None:
            layers.update({("ple", i): PLEState.empty(self.ple) for i in self.ple_layers})
        return SequenceState(self.new_kv(attn), layers=layers)

    def forward(self, tokens: np.ndarray, state: SequenceState, all_logits: bool = True) -> np.ndarray:
        p, w, n = self.params, self.w, self.n_streams
        tokens = np.asarray(tokens, dtype=np.int64)
        x = w.rows(tensor(T.TOKEN_EMBD), tokens)  # [T, D]
        cos_sin = self.mrope.tables(np.arange(state.n_past, state.n_past + len(tokens)))
        streams = np.tile(x, (1, n))  # [T, n*D]
        pending = {}  # the PLE layers' rows, gathered while the layers before them run
        for i in self.ple_layers:
            assert self.ple is not None and self.ple_table is not None
            pending[i] = self.ple_table.prefetch(
                ple_rows(tokens, self.ple, state.layer("ple", i, PLEState).history)
            )
        with forward_pass(w, [state], [len(tokens)]):
            for i in range(p.n_layer):
                if i in pending:
                    assert self.ple is not None and self.ple_table is not None
                    e = embeddings(self.ple_table, self.ple_table.take(pending[i], len(tokens)), len(tokens))
                    streams = streams + ple(
                        streams, tokens, w, i, self.ple, state.layer("ple", i, PLEState), e
                    )
                h, inject = hc_mix(streams, w, self.hc_attn[i], n, p.eps)  # [T, D], [T, n]
                # the mixer's input predicts the layer's experts (--prefetch): it is what the FFN's mixer
                # will read but for this layer's own addition
                lookahead(h, w, i, None, p.eps, self.top_k)
                streams = hc_inject(streams, self._mixer(i, h, state, cos_sin), inject)
                h, inject = hc_mix(streams, w, self.hc_ffn[i], n, p.eps)
                streams = hc_inject(streams, moe_shared(h, w, i, self.top_k, self.norm_topk), inject)
        state.n_past += len(tokens)
        state.tokens.extend(int(t) for t in tokens)
        if not all_logits:
            streams = streams[-1:]
        return w.matmul(hc_final(streams, w, self.hc_head, n, p.eps), self.head)

    def _mixer(
        self, i: int, h: np.ndarray, state: SequenceState, cos_sin: tuple[np.ndarray, np.ndarray]
    ) -> np.ndarray:
        """Layer i's token mixer on h [T, D]: DeltaNet, or gated attention restricted by QSA."""
        p, w = self.params, self.w
        if self.linear[i]:
            return deltanet(h, w, i, self.dn, state.layer("deltanet", i, DeltaNetState))
        select = None
        if i in self.qsa:
            st = state.layer("qsa", i, QSAState)
            select = qsa_select(h, w, i, self.qsa[i], p.rope, self.mrope.tables, cos_sin, st, state.n_past)
        return gated_attention(h, w, i, p.attn, p.rope, cos_sin, state.kv, select)

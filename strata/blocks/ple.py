"""Qwen4-Exp PLE: hashed n-gram embeddings injected into every hyper-connection stream.

Per token, each of the n-gram heads gathers one row of the (huge, mmap'd) table; the rows are
concatenated into e [T, P]. Then, with the streams' grouped-normed activations as queries:
    key = norm_key(e Wk) [T, n, D];  value = e Wv [T, D];  query = norm_query(stream) [T, n, D]
    gate = <key, query> / sqrt(D), then signed sqrt;  gv = sigmoid(gate) * value   [T, n, D]
    out = gv + silu(dilated causal depthwise conv(norm_conv(gv)))                  [T, n*D]
The conv has kernel W and dilation = ngram size, so its window holds (W-1)*ngram past rows.
Only the rows a token needs are read from the table, through a strata.tiers.tables.TableReader (RAM, page
cache or O_DIRECT, `--ple-io`), which counts them; `ple_rows` names them before the pass reaches the layer,
so the reader can gather them while earlier layers run.

Legend: T = tokens, n = streams, D = hidden size, P = PLE embedding width (heads * row width).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.blocks.deltanet import causal_conv1d
from strata.blocks.hyper import grouped_rms_norm
from strata.blocks.linear_attn import kernel
from strata.blocks.ngram_hash import ngram_rows
from strata.blocks.norms import sigmoid, silu
from strata.errors import GGUFError
from strata.gguf import GGUFFile
from strata.gguf.names import Keys, T, X, tensor
from strata.quants import dequantize
from strata.runtime.weights import WeightStore
from strata.tiers.tables import TableReader

TABLE = tensor(T.PER_LAYER_TOKEN_EMBD)


@dataclass(frozen=True, slots=True)
class PLEParams:
    ngram: int  # largest n-gram order; orders 2..ngram are hashed
    heads_per_ngram: int
    multipliers: np.ndarray  # uint64 [ngram]
    vocab_sizes: np.ndarray  # int64 [heads], primes
    offsets: np.ndarray  # int64 [heads], first row of each head's vocabulary
    eos: int
    conv_kernel: int
    n_streams: int
    d_model: int
    eps: float

    @classmethod
    def from_gguf(cls, g: GGUFFile, n_streams: int, d_model: int, eps: float) -> PLEParams:
        def need(key: str) -> Any:
            v = g.arch_get(key)
            if v is None:
                raise GGUFError(g.path, f"PLE layers present but {g.architecture}.{key} is missing")
            return v

        return cls(
            ngram=int(need(Keys.PLE_NGRAM_SIZE)),
            heads_per_ngram=int(need(Keys.PLE_HEADS_PER_NGRAM)),
            multipliers=np.asarray(need(Keys.PLE_LAYER_MULTIPLIERS)).astype(np.uint64),
            vocab_sizes=np.asarray(need(Keys.PLE_HEAD_VOCAB_SIZES)).astype(np.int64),
            offsets=np.asarray(need(Keys.PLE_HEAD_OFFSETS)).astype(np.int64),
            eos=int(need(Keys.PLE_EOS_TOKEN_ID)),
            conv_kernel=int(need(Keys.PLE_CONV_KERNEL)),
            n_streams=n_streams,
            d_model=d_model,
            eps=eps,
        )

    @property
    def conv_window(self) -> int:
        return (self.conv_kernel - 1) * self.ngram


@dataclass(slots=True)
class PLEState:
    """The last ngram-1 token ids (EOS before the start) and the PLE conv window [(W-1)*ngram, n*D]."""

    history: np.ndarray
    conv: np.ndarray

    @classmethod
    def empty(cls, p: PLEParams) -> PLEState:
        return cls(
            np.full(p.ngram - 1, p.eos, np.int64),
            np.zeros((p.conv_window, p.n_streams * p.d_model), np.float32),
        )

    def copy(self) -> PLEState:
        return PLEState(self.history.copy(), self.conv.copy())

    def nbytes(self) -> int:
        return self.history.nbytes + self.conv.nbytes


def ple_rows(tokens: np.ndarray, p: PLEParams, history: np.ndarray) -> np.ndarray:
    """The table rows [T, H] the tokens read after `history` (a PLEState's; `ple` advances it)."""
    return ngram_rows(
        history,
        np.asarray(tokens, np.int64),
        p.multipliers,
        p.vocab_sizes,
        p.offsets,
        p.heads_per_ngram,
        p.eos,
    )


def embeddings(table: TableReader, raw: np.ndarray, n_tokens: int) -> np.ndarray:
    """Gathered rows [T * H, row_bytes] -> embeddings [T, H * row width]."""
    return dequantize(raw, table.info.qtype, table.info.shape[-1]).reshape(n_tokens, -1)


def ple(
    stream: np.ndarray,
    tokens: np.ndarray,
    w: WeightStore,
    layer: int,
    p: PLEParams,
    st: PLEState,
    e: np.ndarray,
) -> np.ndarray:
    """stream [T, n*D], tokens [T], their embeddings e [T, P] -> the PLE term added to the streams [T, n*D];
    advances `st`."""
    t, n, d = len(tokens), p.n_streams, p.d_model
    st.history = np.concatenate([st.history, np.asarray(tokens, np.int64)])[-(p.ngram - 1) :]
    key = grouped_rms_norm(
        w.matmul(e, tensor(X.PLE_KEY, layer)), w.vector(tensor(X.PLE_NORM_KEY, layer)), n, p.eps
    )
    value = w.matmul(e, tensor(X.PLE_VALUE, layer))  # [T, D]
    query = grouped_rms_norm(stream, w.vector(tensor(X.PLE_NORM_QUERY, layer)), n, p.eps)
    gate = np.sum(key.reshape(t, n, d) * query.reshape(t, n, d), axis=-1) / np.float32(np.sqrt(d))  # [T, n]
    gate = np.sqrt(np.maximum(np.abs(gate), np.float32(1e-6))) * np.sign(gate)
    gated = (sigmoid(gate)[:, :, None] * value[:, None, :]).reshape(t, n * d)  # [T, n*D]
    normed = grouped_rms_norm(gated, w.vector(tensor(X.PLE_NORM_CONV, layer)), n, p.eps)
    conv, st.conv = causal_conv1d(normed, st.conv, kernel(w, tensor(X.PLE_CONV1D, layer)), dilation=p.ngram)
    return gated + silu(conv)

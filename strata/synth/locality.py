"""Routing with temporal locality in a synthetic model (`strata synth --router-mode locality`).

Real routing is bursty (tiers/trace.py: a per-layer LRU of 64 of 512 experts hits ~67%), because the hidden
state carries the context, which drifts slowly. Random weights give no such drift: the skew mode's files route
DeltaNet layers afresh every token (an LRU hits as a static cache does), and their attention layers, whose
random scores are small, would average values over the whole context, a common part that by the third qwen3moe
layer routed nearly every token to the same few experts (plan.py's QK_GAIN, which every mode now has). This
mode builds a controlled drift into the model, so the model's own router (logits = router @ normed hidden
state) has it on any token stream, GPU benchmarks' random prompts and greedy decodes included.

A "clock" head per attention layer (query head 0 and its KV head) averages its values over a window of recent
tokens: its q and k rows are zero but one (row i0, a random row), so after the q/k RMSNorm each token's q and
k are +-sqrt(hd) g along one rotary pair of frequency theta, and the score of key s for query t is +-A
cos(theta (t - s)), A = sqrt(hd) g^2 (g: the q/k norm weight at i0). Near s = t that is a Gaussian window of
width ~1/(theta sqrt(A)) over the recent keys of the query's sign (two interleaved streams; the cosine repeats
every 2 pi / theta tokens, which mixes older windows in but slides them all alike). Its output, a moving
average of values, drifts on that time scale and lands in the residual through the head's columns of
attn_output, W0 [D, hd]. The router rows of the layer (and, in Qwen3-Next, of the DeltaNet layers up to the
next attention layer) read only that subspace: row e = s_e * unit(W0 u_e), u_e random, s_e the popularity
scales of router.py. Consecutive tokens then see nearly the same logits (they share experts), and the set
drifts as the window slides; the skew still comes from s_e. The clock's window alone would carry the mean of
its values over the context, which drifts only as a cumulative average does, so the same experts would stay
popular all along: query head 1 (the clock's KV head too) attends uniformly and writes minus that mean through
the clock's own columns, and the group's other heads, whose keys hold only the clock's one rotary pair and so
attend as broadly, write nothing (`_mean_head`). Layers before the first attention layer keep the
plain router. Two gains set how local it is: the clock's values are amplified (V_GAIN, less in deeper layers,
where the slow parts of the residual have added up, and times WEIGHT_STD / attn_out_std, which restores what
attn_output's smaller std takes from the clock), and every other head attends sharply (QK_GAIN), so nothing
but the clocks drifts slowly. The file is written as usual, then patched in place (`patch`).

Legend: D = hidden size, E = experts, hd = head dim.
"""

from __future__ import annotations

import math
import os

import numpy as np
from gguf.constants import GGML_QUANT_SIZES

from strata.gguf.names import T, tensor
from strata.quants import dequantize
from strata.synth.blocks import _rescale
from strata.synth.plan import QK_GAIN, WEIGHT_STD, TensorSpec, attn_out_std
from strata.synth.router import LOGIT_STD, popularity_scales
from strata.synth.shapes import QWEN3MOE, QWEN3NEXT, Shape

MODES = ("skew", "locality")
# Calibrated with `tiers simulate --policy lru` on routes the CPU model recorded over 1,000 random tokens at
# the benchmark shapes (perf/synth_locality.py --shape: 48 layers at full width, narrow experts scaled to add
# what full-width ones do; perf/README.md "synth locality router"): a per-layer LRU of 1/8 and 1/4 of the
# experts hits 66.9% and 80.6% on the 80B, 67.2% and 88.7% on the 30B, as published routing (tiers/trace.py:
# ~67% and ~81%), while a static top 1/16 learned on the first half of the stream covers 5.1% (80B) and 4.3%
# (30B) of the second half's routing, about the 6.25% of uniform routing (published ~10%: that much
# popularity is --router-skew's to add).
WINDOW = 48.0  # tokens the clock head's window spans (1/(theta sqrt(A))): how fast the routing drifts
SHARPNESS = 96.0  # A, the clock's peak score
# the clock's values are amplified g (n + 1)^-decay at the n-th clock, (g, decay) = V_GAIN[arch]: the slow
# parts of the residual add up over the layers, so deeper clocks need less. qwen3moe attends in every layer,
# qwen3next only in every 4th, behind an output gate whose sigmoid of random gate rows is ~0.5: its clocks
# need more gain. Before the clocks subtracted the context's mean (`_mean_head`), (5.0, 1.0) and (19.0, 1.0)
# at a 16-token window gave the published LRU rates, but mostly from a mean that drifted as slowly as a
# cumulative average: the same experts stayed popular all along (static top 1/16: 42% on the 80B).
V_GAIN = {QWEN3MOE: (4.0, 0.25), QWEN3NEXT: (19.0, 0.25)}


def clock(s: Shape) -> tuple[int, float]:
    """(i0, g): the rotary pair whose frequency makes a WINDOW-token window at peak score SHARPNESS, and the
    q/k norm weight at i0 that gives that score."""
    half = np.arange(0, s.rope_dim, 2) / s.rope_dim
    theta = 1.0 / s.rope_base**half  # [rope_dim / 2], as strata.blocks.rope
    want = 1.0 / (WINDOW * math.sqrt(SHARPNESS))
    i0 = int(np.argmin(np.abs(np.log(theta) - math.log(want))))
    return i0, math.sqrt(SHARPNESS / math.sqrt(s.head_dim))


def _row_bytes(spec: TensorSpec) -> int:
    block, size = GGML_QUANT_SIZES[spec.qtype]
    return spec.shape[-1] // block * size


def _keep_one_row(fd: int, spec: TensorSpec, pos: int, hd: int, i0: int) -> None:
    """Zero rows [0, hd) of the matrix at pos but row i0 (zero bytes are 0.0 in every ggml type)."""
    rb = _row_bytes(spec)
    os.pwrite(fd, bytes(rb * i0), pos)
    os.pwrite(fd, bytes(rb * (hd - i0 - 1)), pos + rb * (i0 + 1))


def _copy_rows(fd: int, spec: TensorSpec, pos: int, src: int, dst: int, n: int) -> None:
    """Rows [dst, dst + n) of the matrix at pos become a copy of rows [src, src + n)."""
    rb = _row_bytes(spec)
    os.pwrite(fd, os.pread(fd, rb * n, pos + rb * src), pos + rb * dst)


def _head_columns(fd: int, spec: TensorSpec, pos: int, hd: int, group: int) -> None:
    """attn_output (the matrix at pos): head 1's columns become minus head 0's, and heads 2 .. group - 1's are
    zeroed (each head's hd columns are whole quant blocks)."""
    block, size = GGML_QUANT_SIZES[spec.qtype]
    w = hd // block * size  # bytes of a head's columns in a row
    rows = np.frombuffer(os.pread(fd, spec.nbytes, pos), np.uint8).reshape(spec.shape[0], -1).copy()
    minus = rows[:, :w].copy()
    _rescale(minus.reshape(-1, size), spec.qtype, -1.0)
    rows[:, w : 2 * w] = minus
    rows[:, 2 * w : group * w] = 0
    os.pwrite(fd, rows.tobytes(), pos)


def _scale_rows(fd: int, spec: TensorSpec, pos: int, n: int, gain: float) -> None:
    """Rows [0, n) of the matrix at pos times `gain` (every block's scale fields)."""
    size = GGML_QUANT_SIZES[spec.qtype][1]
    blocks = np.frombuffer(os.pread(fd, n * _row_bytes(spec), pos), np.uint8).reshape(-1, size).copy()
    _rescale(blocks, spec.qtype, gain)
    os.pwrite(fd, blocks.tobytes(), pos)


def _read(fd: int, spec: TensorSpec, pos: int) -> np.ndarray:
    raw = np.frombuffer(os.pread(fd, spec.nbytes, pos), np.uint8)
    return dequantize(raw.reshape(spec.shape[0], -1), spec.qtype, spec.shape[-1])


def _mean_head(fd: int, at: dict[str, tuple[TensorSpec, int]], s: Shape, layer: int) -> None:
    """Query head 1 (the clock's KV head too) attends uniformly (zero query rows: every score 0), so its
    output is the mean of the clock's values over the whole context, and writes it through minus the clock's
    attn_output columns (and, in Qwen3-Next, behind the clock's own output gate): the clock adds its window
    less the context's mean. The group's other heads write nothing: their keys are the clock's one rotary
    pair, so they too average broadly. Without this the routers read that mean, which drifts only as fast as a
    cumulative average: on the 80B (perf/synth_locality.py --shape 80b-a3b) a static top 1/16 learned on one
    half of a random stream covered 42% of the other half's routing (published routing: ~10%), now 5%."""
    hd = s.head_dim
    spec, pos = at[tensor(T.ATTN_Q, layer)]
    per_head = spec.shape[0] // s.n_head  # qwen3next: [query | gate] a head
    rb = _row_bytes(spec)
    os.pwrite(fd, bytes(rb * hd), pos + rb * per_head)
    if per_head == 2 * hd:
        _copy_rows(fd, spec, pos, hd, per_head + hd, hd)
    _head_columns(fd, *at[tensor(T.ATTN_OUT, layer)], hd, s.n_head // s.n_kv)


def patch(fd: int, s: Shape, plan: list[TensorSpec], offsets: list[int], skew: float, seed: int) -> None:
    """Give the file at fd (written from `plan`, tensor i at offsets[i]) its clock heads and locality
    routers."""
    at = {spec.name: (spec, off) for spec, off in zip(plan, offsets)}
    i0, g = clock(s)
    hd = s.head_dim
    v_gain, v_decay = V_GAIN[s.arch]
    gain = v_gain * WEIGHT_STD / attn_out_std(s.n_layer)
    w0, clocks = None, 0  # [D, hd]: the latest clock head's output columns; clocks so far
    for layer in range(s.n_layer):
        if not s.recurrent(layer):
            for kind in (T.ATTN_Q, T.ATTN_K):  # qwen3next's q rows are per head [query | gate]: query first
                _keep_one_row(fd, *at[tensor(kind, layer)], hd, i0)
            for kind in (T.ATTN_Q_NORM, T.ATTN_K_NORM):
                _, off = at[tensor(kind, layer)]
                gains = np.full(hd, QK_GAIN, np.float32)
                gains[i0] = g
                os.pwrite(fd, gains.tobytes(), off)
            _scale_rows(fd, *at[tensor(T.ATTN_V, layer)], hd, gain * (clocks + 1) ** -v_decay)
            _mean_head(fd, at, s, layer)
            out = _read(fd, *at[tensor(T.ATTN_OUT, layer)])  # [D, n_head * hd]
            w0, clocks = out[:, :hd], clocks + 1
        if w0 is None:
            continue
        rng = np.random.default_rng([seed, layer, 17])
        scales = popularity_scales(s.n_expert, s.top_k, skew)[rng.permutation(s.n_expert)]
        rows = rng.standard_normal((s.n_expert, hd)) @ w0.T  # [E, D]: in the clock's subspace
        rows *= (LOGIT_STD * scales / np.linalg.norm(rows, axis=1))[:, None] * math.sqrt(s.d_model / hd)
        _, off = at[tensor(T.FFN_GATE_INP, layer)]
        os.pwrite(fd, rows.astype(np.float32).tobytes(), off)


def measured_routes(
    path: os.PathLike[str] | str, out: os.PathLike[str] | str, tokens: int, chunk: int, backend: str = "numpy"
) -> np.ndarray:
    """The routing [T, L, A] a synth file's own router gives `tokens` random token ids, fed in `chunk`-token
    passes through the CPU engine (`backend`: numpy, or jit for the large shapes) with every expert resident
    and no routing profile; recorded to `out` (.npz) with --record-routes, the trace `strata tiers simulate`
    replays. How local a router mode is, measured."""
    from strata.engine import Engine
    from strata.tiers import trace

    eng = Engine.load(
        path,
        device="cpu",
        backend=backend,
        expert_cache="off",
        prefetch=0,
        routing_profile="off",
        record_routes=str(out),
    )
    ids, st = np.random.default_rng(0).integers(10, 150_000, tokens), eng.new_state()
    for i in range(0, tokens, chunk):
        eng.model.forward(ids[i : i + chunk], st, all_logits=False)
    eng.expert_cache.recorder.save()
    return trace.load(out)[0]

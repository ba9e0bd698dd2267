"""The QSA kernels' numpy twins (strata/gpu/kernels/qsa.py) composed into the CPU path they stand for: the
record's blocks are QSAState's, the selection is blocks.qsa.qsa_select's mask row for row, and the attention
is gated_attn.attend_masked's, exactly (CI; the kernels meet the twins in tests/test_gpu_qsa.py)."""

from __future__ import annotations

import numpy as np
import pytest
from dict_weights import DictWeights

from strata.blocks.gated_attn import attend_masked
from strata.blocks.qsa import QSAParams, QSAState, qsa_select
from strata.blocks.rope import Rope, RopeStyle
from strata.gguf.names import X, tensor
from strata.gpu.kernels import cells
from strata.gpu.kernels import qsa as qk
from strata.gpu.kernels import qsa_select as qsel

LAYER, D_MODEL, EPS = 3, 32, 1e-6
H, KV, HD = 4, 2, 16  # the attention that the selection restricts


def _inputs(rng: np.random.Generator, s: int, hi: int, d: int, n_rot: int, ratio: int, ties: bool):
    """Hidden rows [s, D_MODEL] and the indexer's weights. ties: the query heads are negative constants in
    the unrotated dims (n_rot..d, read from h's constant column 0) and zero elsewhere, and a block's keys
    there take the sign of its tokens' column 1: two blocks in three score exactly 0."""
    h = rng.standard_normal((s, D_MODEL)).astype(np.float32)
    wq = rng.standard_normal((hi * d, D_MODEL)).astype(np.float32) * np.float32(0.3)
    wk = rng.standard_normal((d, D_MODEL)).astype(np.float32) * np.float32(0.3)
    if ties:
        h[:, 0] = 1.0
        h[:, 1] = np.where(np.arange(s) // ratio % 3 == 1, -1.0, 1.0)  # blocks 1, 4, 7, .. score above 0
        wq[...] = 0.0
        wq.reshape(hi, d, D_MODEL)[:, n_rot:, 0] = -rng.uniform(0.5, 1.5, (hi, d - n_rot))
        wk[n_rot:] = 0.0
        wk[n_rot:, 1] = rng.uniform(0.5, 1.5, d - n_rot)
    w = DictWeights(
        {
            tensor(X.INDEXER_Q_PROJ, LAYER): wq,
            tensor(X.INDEXER_K_PROJ, LAYER): wk,
            tensor(X.INDEXER_Q_NORM, LAYER): rng.uniform(0.5, 1.5, d).astype(np.float32),
            tensor(X.INDEXER_K_NORM, LAYER): rng.uniform(0.5, 1.5, d).astype(np.float32),
        }
    )
    return h, w


def _earliest_ties(scores: np.ndarray, sel: np.ndarray, nsel: np.ndarray, complete: np.ndarray) -> bool:
    """Asserts every row keeps its zero-score blocks earliest first; True when some row had to drop some."""
    bit = False
    for r in range(sel.shape[0]):
        zeros = np.flatnonzero(scores[r, : complete[r]] == 0)
        kept = np.intersect1d(sel[r, : nsel[r]], zeros)
        np.testing.assert_array_equal(kept, zeros[: kept.size])
        bit |= 0 < kept.size < zeros.size
    return bit


@pytest.mark.parametrize(
    ("chunks", "ratio", "top", "hi", "d", "n_rot", "ties"),
    [
        ((13, 1, 1, 1, 1, 1, 1), 4, 2, 8, 16, 8, False),  # a prefill, then decode steps
        ((120, 1, 1, 50, 27, 1), 4, 8, 4, 32, 16, False),  # many blocks
        ((10, 7, 1, 1, 1, 20), 3, 3, 2, 16, 16, False),  # a ratio that does not divide the chunks
        ((13, 1, 1, 1, 1, 1, 1), 4, 2, 8, 16, 8, True),  # blocks scoring 0: the earliest win
        ((150, 1, 1), 4, 8, 4, 16, 8, True),
    ],
)
def test_twins_compose_to_qsa_select_and_attend_masked(chunks, ratio, top, hi, d, n_rot, ties):
    rng = np.random.default_rng(sum(chunks) + 10 * ratio + ties)
    rope = Rope(n_rot=n_rot, base=1e4, style=RopeStyle.NEOX)
    p = QSAParams(n_heads=hi, head_dim=d, budget=top * ratio, ratio=ratio, eps=EPS)
    s_all = sum(chunks)
    max_blocks = s_all // ratio + 2
    h, w = _inputs(rng, s_all, hi, d, n_rot, ratio, ties)
    k = rng.standard_normal((s_all, KV, HD)).astype(np.float32)
    v = rng.standard_normal((s_all, KV, HD)).astype(np.float32)
    qa = rng.standard_normal((s_all, H, HD)).astype(np.float32)
    scale = 1 / np.sqrt(HD)
    kn, qn = w.vector(tensor(X.INDEXER_K_NORM, LAYER)), w.vector(tensor(X.INDEXER_Q_NORM, LAYER))
    st = QSAState.empty(p)
    record = np.full(qk.qsa_stride(max_blocks, ratio, d), np.nan, np.float32)  # nothing unwritten is read
    n_past, budget_bit, ties_bit = 0, False, False
    for t in chunks:
        x, pos = h[n_past : n_past + t], np.arange(n_past, n_past + t)
        s = n_past + t
        mask = qsa_select(x, w, LAYER, p, rope, rope.tables, rope.tables(pos), st, n_past)  # type: ignore[arg-type]
        raw = w.matmul(x, tensor(X.INDEXER_K_PROJ, LAYER))  # [T, d], as the GPU's projection hands it over
        q_raw = w.matmul(x, tensor(X.INDEXER_Q_PROJ, LAYER)).reshape(t, hi, d)
        q = qk.ref_qsa_query(q_raw, pos, qn, EPS, rope)
        record = qk.ref_qsa_keys(raw, pos, record, max_blocks, ratio, kn, EPS, rope)
        blocks, ring = qk.record_views(record, max_blocks, ratio, d)
        n_blocks = s // ratio
        np.testing.assert_array_equal(blocks[:n_blocks], st.blocks)
        np.testing.assert_array_equal(ring[np.arange(n_blocks * ratio, s) % ratio], st.tail)
        sel, nsel = qsel.ref_qsa_select(q, blocks[:n_blocks], pos, ratio, top)
        np.testing.assert_array_equal(
            qk.ref_qsa_mask(sel, nsel, pos, ratio, s), mask, err_msg=f"rows {n_past}.."
        )
        if ties:
            ties_bit |= _earliest_ties(
                qsel.ref_qsa_scores(q, blocks[:n_blocks]), sel, nsel, (pos + 1) // ratio
            )
        budget_bit |= bool((nsel < (pos + 1) // ratio).any())
        got = qk.ref_qsa_attend(qa[n_past:s], k[:s], v[:s], pos, sel, nsel, ratio, scale)
        kv_cells = cells.ref_cells(k[:s], False), cells.ref_cells(v[:s], False)
        np.testing.assert_array_equal(got, attend_masked(qa[n_past:s], *kv_cells, scale, mask))
        n_past = s
    assert budget_bit, "the budget never bit: selection was not exercised"
    assert ties_bit or not ties, "no row had more zero-score blocks than room: the tie rule was not exercised"


def test_pick_keeps_the_best_and_the_earliest_ties():
    """ref_qsa_pick against the rule spelled out: sort by (-score, block), keep min(complete, top), ascending;
    integer scores make ties at the threshold common."""
    rng = np.random.default_rng(5)
    scores = rng.integers(0, 4, (40, 60)).astype(np.float32)
    scores[3] = 0.0
    complete = rng.integers(0, 61, 40)
    for top in (1, 7, 60):
        sel, nsel = qsel.ref_qsa_pick(scores, complete, top)
        for r in range(40):
            keep = sorted(range(complete[r]), key=lambda b, r=r: (-scores[r, b], b))[:top]
            assert nsel[r] == len(keep)
            np.testing.assert_array_equal(sel[r], sorted(keep) + [-1] * (top - len(keep)))

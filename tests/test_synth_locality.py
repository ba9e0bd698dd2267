"""`strata synth --router-mode locality` (strata/synth/locality.py): the model's own routing, recorded by the
CPU expert tiers over random tokens and replayed through a per-layer LRU of 1/8 of the experts, hits far more
often than the skew mode's routing does at layer 0 (~1/8: uniform) and in every layer, well above uniform,
while the experts it favours change: a static top 1/16 learned on the first half of the stream covers about
what it would of uniform routing in the second (1/16; 27% before the clocks subtracted the context's mean,
locality.py `_mean_head`); the skew mode's routing stays uniform in every layer (its attention no longer makes
every position alike: strata/synth/plan.py QK_GAIN).
Margins, not the calibrated values (perf/README.md "synth locality router" has those)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q

from strata.gguf import GGUFFile
from strata.gguf.names import T, tensor
from strata.quants import dequantize_rows
from strata.synth import write_synth
from strata.synth.locality import measured_routes
from strata.synth.plan import KEY_MODE
from strata.synth.shapes import QWEN3MOE, QWEN3NEXT, SHAPES
from strata.tiers import sim

E, TOKENS = 128, 600
SHAPE = dataclasses.replace(SHAPES[(QWEN3MOE, "tiny")], name="locality-test", n_layer=4, n_expert=E, top_k=4)


def _replays(tmp_path: Path, tokenizer: Path, mode: str) -> tuple[list[float], float]:
    """On the routes of TOKENS random tokens: the per-layer hit rates of an LRU of E/8 slots, and the hit
    rate of a static E/16 learned on the first half."""
    path = write_synth(
        tmp_path / f"{mode}.gguf", SHAPE, Q.Q8_0, Q.Q8_0, 0.0, tokenizer, seed=1, router_mode=mode
    ).path
    assert GGUFFile(path).get(KEY_MODE) == (None if mode == "skew" else mode)
    ids = measured_routes(path, tmp_path / f"{mode}.npz", TOKENS, 300)
    return sim.simulate(ids, E, E // 8, "lru").per_layer, sim.simulate(ids, E, E // 16, "static").hit_rate


def test_locality_mode_routes_with_more_lru_hits(tmp_path, qwen3_tokenizer_dir):
    (skew, _), (local, static) = (_replays(tmp_path, qwen3_tokenizer_dir, m) for m in ("skew", "locality"))
    assert skew[0] < 0.25  # uniform: ~1/8
    assert local[0] > skew[0] + 0.3
    assert min(local) > 0.45  # every layer drifts slowly (uniform would be ~0.125)
    assert max(skew) < 0.25  # the skew mode: uniform in every layer, deep ones included
    assert static < 0.15  # no expert stays popular all along (uniform: 1/16; 0.27 with the mean kept)


@pytest.mark.parametrize(("arch", "head_dim"), [(QWEN3MOE, 128), (QWEN3NEXT, 256)])
def test_each_clock_has_a_mean_head_that_subtracts(tmp_path, qwen3_tokenizer_dir, arch, head_dim):
    """In a Q4_K locality file, every clock layer's attn_output carries minus the clock's columns as head 1's
    (128-dim heads in Q4_K's fallback type, whose blocks divide a head), head 1 has zero query rows, and in
    Qwen3-Next the clock's gate rows: the mean head of locality.py `_mean_head`."""
    s = dataclasses.replace(SHAPES[(arch, "tiny")], name="heads", head_dim=head_dim, n_head=4, n_kv=1)
    f = GGUFFile(
        write_synth(
            tmp_path / "h.gguf", s, Q.Q4_K, Q.Q6_K, 0.0, qwen3_tokenizer_dir, router_mode="locality"
        ).path
    )
    hd, clocks = head_dim, [i for i in range(s.n_layer) if not s.recurrent(i)]
    assert clocks
    for layer in clocks:
        out = dequantize_rows(f, tensor(T.ATTN_OUT, layer), 0, s.d_model)  # [D, n_head * hd]
        assert np.abs(out[:, :hd]).max() > 0
        np.testing.assert_array_equal(out[:, hd : 2 * hd], -out[:, :hd])
        assert not out[:, 2 * hd : 4 * hd].any()  # the group's other heads write nothing
        per = 2 * hd if arch == QWEN3NEXT else hd  # qwen3next: [query | gate] a head
        q = dequantize_rows(f, tensor(T.ATTN_Q, layer), 0, s.n_head * per)
        assert not q[per : per + hd].any()
        if arch == QWEN3NEXT:
            np.testing.assert_array_equal(q[per + hd : 2 * per], q[hd:per])


def test_an_unknown_mode_and_a_shape_without_a_mean_head_are_refused(tmp_path, qwen3_tokenizer_dir):
    from strata.synth import SynthError

    with pytest.raises(SynthError, match="router mode"):
        write_synth(tmp_path / "x.gguf", SHAPE, Q.Q8_0, Q.Q8_0, 0.0, qwen3_tokenizer_dir, router_mode="drift")
    one_a_kv = dataclasses.replace(SHAPE, n_head=2, n_kv=2)  # no second query head for the mean
    with pytest.raises(SynthError, match="two query heads a kv head"):
        write_synth(
            tmp_path / "y.gguf", one_a_kv, Q.Q8_0, Q.Q8_0, 0.0, qwen3_tokenizer_dir, router_mode="locality"
        )

"""perf/synth_qwen4exp.py: the seeds preset's layout and size (from the plan, nothing written), and a tiny
quantized variant written through the streaming writer, read back with the Q4_K_M-like types and run on
the CPU model with finite, unit-scale logits."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))

from synth_qwen4exp import PRESETS, TABLE, Synth, _pad, main, plan, write

from strata.gguf import GGUFFile
from strata.gguf.names import Keys, T, X, tensor
from strata.models import model_class
from strata.runtime.weights import WeightStore

# Real structure (3 DeltaNet + 1 QSA, hyper-connections, PLE on layer 0) at toy widths; every matrix still
# divides into Q4_K blocks, and the PLE rows (32 values) take llama-quantize's Q5_0 fallback.
TINY = Synth(
    layers=4,
    experts=16,
    ple_vocab_base=3000,
    ple_dim=512,
    quant=Q.Q4_K,
    output_quant=Q.Q6_K,
    d=256,
    vocab=4096,
    heads=4,
    head_dim=64,
    lin_k_heads=2,
    lin_v_heads=4,
    lin_dim=64,
    hc_rank=32,
    top_k=4,
    ffn=256,
    shared_ffn=256,
    idx_heads=4,
    idx_dim=64,
    idx_budget=16,
    eos=7,
)


def test_seeds_preset_is_the_deployed_model_within_the_disk_budget() -> None:
    s = PRESETS["seeds"]
    specs = {t.name: t for t in plan(s)}
    linear = [s.linear(i) for i in range(s.layers)]
    assert (s.layers, sum(linear), s.experts) == (48, 36, 512)  # the seeds: 36 GDN + 12 QSA, 48 x 512 experts
    assert not linear[3] and not linear[47] and linear[0]
    assert specs[tensor(T.FFN_DOWN_EXP, 0)].shape == (512, 2048, 512)
    assert specs[tensor(T.FFN_DOWN_EXP, 0)].qtype == Q.Q4_K
    assert specs[tensor(T.OUTPUT)].qtype == Q.Q6_K
    table = specs[TABLE]
    assert table.shape[1] == 160 and table.qtype == Q.Q5_0  # the real row width, 16 rows a token
    assert specs[tensor(X.HC_ATTN_UP, 5)].qtype == Q.F16
    assert specs[tensor(T.FFN_GATE_INP, 5)].qtype == Q.F32
    assert sum(_pad(t.nbytes) for t in specs.values()) < 45 * 2**30
    # with the real table's rows: the seeds' 320,001,536
    real = {t.name: t for t in plan(replace(s, ple_vocab_base=20_000_000))}
    assert real[TABLE].shape == (320_001_536, 160)


def test_default_synth_stays_f16() -> None:
    types = {t.qtype for t in plan(Synth()) if t.numel >= 1 << 20}
    assert types == {Q.F16}


def test_tiny_quantized_variant_runs_on_the_cpu(tmp_path: Path) -> None:
    path = write(tmp_path / "tiny.gguf", TINY)
    g = GGUFFile(path)
    assert g.tensors[tensor(T.FFN_GATE_EXP, 1)].qtype == Q.Q4_K
    assert g.tensors[tensor(T.OUTPUT)].qtype == Q.Q6_K
    assert g.tensors[TABLE].qtype == Q.Q5_0
    assert g.tensors[tensor(X.INDEXER_Q_PROJ, 3)].qtype == Q.F16
    assert [bool(x) for x in g.arch_get(Keys.RECURRENT_LAYERS)] == [True, True, True, False]
    model = model_class(g)(g, WeightStore(g, 256 << 20))
    ids = np.random.default_rng(0).integers(0, TINY.vocab, 24)
    ids[10] = TINY.eos  # the PLE n-gram hash restarts here
    logits = model.forward(ids, model.new_state(), all_logits=True)
    assert logits.shape == (24, TINY.vocab) and np.isfinite(logits).all()
    # std 1/sqrt(columns) blocks keep the activations at their scale: logits neither vanish nor blow up
    assert 0.05 < float(logits.std()) < 5.0, logits.std()


def test_cli_refuses_fewer_experts_than_a_token_picks(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["--preset", "seeds", "--experts", "4", "--output", str(tmp_path / "x.gguf")])
    assert "--experts 4: a token picks 10" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())

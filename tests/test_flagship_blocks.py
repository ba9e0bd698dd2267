"""qwen4exp blocks against transformers' own modules on random inputs: interleaved mrope, the QSA
indexer's token selection (one shot and across calls), and the hyper-connection mixer."""

from __future__ import annotations

import numpy as np
import pytest
from dict_weights import DictWeights

from strata.blocks.hyper import HCNames, hc_final, hc_inject, hc_mix
from strata.blocks.mrope import MRope
from strata.blocks.qsa import QSAParams, QSAState, qsa_select
from strata.blocks.rope import Rope, RopeStyle
from strata.gguf.names import X, tensor

torch = pytest.importorskip("torch")
m = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")
# after the importorskip, so a transformers without qwen4_exp skips the module instead of failing it
from transformers.models.qwen4_exp import Qwen4ExpTextConfig  # noqa: E402

D, HEAD_DIM, ROT = 32, 16, 8


def _config(**kw):  # type: ignore[no-untyped-def]
    base = {
        "vocab_size": 100,
        "hidden_size": D,
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e4,
            "partial_rotary_factor": ROT / HEAD_DIM,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        "indexer_n_heads": 4,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 8,
        "indexer_compress_ratio": 4,
        "hc_count": 3,
        "hc_lowrank": 8,
        "eos_token_id": 1,
    }
    base.update(kw)
    return Qwen4ExpTextConfig(**base)


def _randomize(module, seed: int) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def _np(t) -> np.ndarray:  # type: ignore[no-untyped-def]
    return t.detach().numpy().astype(np.float32)


def test_mrope_text_positions_equal_plain_rope_and_axes_follow_transformers() -> None:
    cfg = _config()
    emb = m.Qwen4ExpTextRotaryEmbedding(cfg)
    mrope = MRope(Rope(ROT, 1e4, RopeStyle.NEOX), (2, 1, 1))
    pos = np.arange(37)
    cos, sin = mrope.tables(pos)
    plain = mrope.rope.tables(pos)
    np.testing.assert_array_equal(cos, plain[0])
    np.testing.assert_array_equal(sin, plain[1])
    thw = np.stack([pos, pos // 3 + 100, pos % 5 + 7])  # distinct positions per axis, as for an image
    c_t, s_t = emb(torch.zeros(1), torch.from_numpy(thw)[:, None])
    c, s = mrope.tables_thw(thw)
    np.testing.assert_allclose(np.concatenate([c, c], -1), _np(c_t[0]), atol=2e-6)
    np.testing.assert_allclose(np.concatenate([s, s], -1), _np(s_t[0]), atol=2e-6)


@pytest.mark.parametrize("splits", [(50,), (3, 1, 1, 12, 33), (1,) * 50])
def test_qsa_selection_matches_indexer(splits: tuple[int, ...]) -> None:
    cfg = _config()
    idx = m.Qwen4ExpTextQSAIndexer(cfg, 1).eval()
    _randomize(idx, 0)
    emb = m.Qwen4ExpTextRotaryEmbedding(cfg)
    t = sum(splits)
    h = torch.randn(1, t, D, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(t)[None, None].expand(3, 1, t)
    causal = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        want = idx(h, emb(h, pos), causal, None)[0, 0].numpy()  # [T, T]
    n_q = cfg.indexer_n_heads * cfg.indexer_head_dim
    w_qk = _np(idx.index_qk_proj.weight)
    weights = DictWeights(
        {
            tensor(X.INDEXER_Q_PROJ, 1): w_qk[:n_q],
            tensor(X.INDEXER_K_PROJ, 1): w_qk[n_q:],
            tensor(X.INDEXER_Q_NORM, 1): 1 + _np(idx.q_layernorm.weight),  # the converter's +1
            tensor(X.INDEXER_K_NORM, 1): 1 + _np(idx.k_layernorm.weight),
        }
    )
    p = QSAParams(
        cfg.indexer_n_heads, cfg.indexer_head_dim, cfg.indexer_budget, cfg.indexer_compress_ratio, 1e-6
    )
    mrope = MRope(Rope(ROT, 1e4, RopeStyle.NEOX), (2, 1, 1))
    st, x, n_past = QSAState.empty(p), _np(h[0]), 0
    for n in splits:
        got = qsa_select(
            x[n_past : n_past + n],
            weights,
            1,
            p,
            mrope.rope,
            mrope.tables,  # type: ignore[arg-type]
            mrope.tables(np.arange(n_past, n_past + n)),
            st,
            n_past,
        )
        np.testing.assert_array_equal(
            got, want[n_past : n_past + n, : n_past + n], err_msg=f"rows {n_past}.."
        )
        n_past += n
    assert st.blocks.shape[0] == t // p.ratio and st.tail.shape[0] == t % p.ratio
    assert (want.sum(1) < np.arange(1, t + 1)).any(), "the budget never bit: selection was not exercised"


def test_hyper_connection_mixer_matches_transformers() -> None:
    cfg = _config()
    for use_combine in (True, False):
        hc = m.Qwen4ExpTextGatedResidual(cfg, use_combine=use_combine).eval()
        _randomize(hc, 2)
        streams = torch.randn(9, cfg.hc_count * D, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            ref = hc(streams)
        names = HCNames("norm", "down", "up", "inject" if use_combine else None)
        tensors = {
            "norm": 1 + _np(hc.hc_norm.weight),
            "down": _np(hc.input_mix_weight_down.weight),
            "up": _np(hc.input_mix_weight_up.weight),
        }
        if use_combine:
            tensors["inject"] = _np(hc.block_inject_weight.weight)
        w, n = DictWeights(tensors), cfg.hc_count
        if not use_combine:
            np.testing.assert_allclose(hc_final(_np(streams), w, names, n, 1e-6), _np(ref), atol=1e-5)  # type: ignore[arg-type]
        else:
            mixed, inject = hc_mix(_np(streams), w, names, n, 1e-6)  # type: ignore[arg-type]
            np.testing.assert_allclose(mixed, _np(ref[0]), atol=1e-5)
            np.testing.assert_allclose(inject, _np(ref[2]), atol=1e-5)
            out = np.ones((9, D), np.float32)
            want = _np(ref[1]) + (_np(ref[2])[:, :, None] * out[:, None, :]).reshape(9, -1)
            np.testing.assert_allclose(hc_inject(_np(streams), out, inject), want, atol=1e-5)

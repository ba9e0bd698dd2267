"""The oracle fixtures themselves are sane: right shapes, informative (not flat) logits, self-consistent.

These guard the test data, not the engine: a broken recipe would otherwise make every oracle test
either trivially pass or fail for reasons unrelated to Strata.
"""

from __future__ import annotations

import json
import struct

import gguf
import numpy as np
import pytest
from oracle import assets


def _check_lm_oracle(ref: dict, vocab: int, n_greedy: int, min_prompt: int) -> None:
    t = len(ref["prompt_ids"])
    assert t >= min_prompt
    assert ref["logits"].shape == (t, vocab) and ref["logits"].dtype == np.float32
    assert ref["greedy"].shape == (n_greedy,)
    assert ref["greedy_logits"].shape == (n_greedy, vocab)
    assert np.isfinite(ref["logits"]).all() and np.isfinite(ref["greedy_logits"]).all()
    # Not flat: every row has real spread, and the prediction is not the same everywhere.
    assert ref["logits"].std(axis=1).min() > 0.5
    assert len(set(ref["logits"].argmax(1).tolist())) > 1 or t == 1
    assert len(set(ref["greedy"].tolist())) > 1
    # greedy_logits[i] chose greedy[i]; row 0 is the last prompt position again.
    assert (ref["greedy_logits"].argmax(1) == ref["greedy"]).all()
    np.testing.assert_allclose(ref["greedy_logits"][0], ref["logits"][-1], atol=1e-3)
    assert (ref["greedy"] >= 0).all() and (ref["greedy"] < vocab).all()


def test_smollm2_oracle(smollm2_oracle: dict) -> None:
    _check_lm_oracle(smollm2_oracle, 49152, assets.SMOLLM2_GREEDY, 5)
    # "The three primary colors are" without BOS: this GGUF sets add_bos_token=false.
    assert smollm2_oracle["prompt_ids"].tolist() == [504, 1296, 3003, 4683, 359]


@pytest.mark.parametrize("variant", ["", "_nonorm"])
def test_tiny_qwen3moe_oracle(tiny_qwen3moe: dict, variant: str) -> None:
    ref = assets.load_npz(tiny_qwen3moe["oracle" + variant])
    _check_lm_oracle(ref, 151669, assets.TINY_GREEDY, 32)
    t = len(ref["prompt_ids"])
    assert ref["hidden_states"].shape == (3, t, 64)  # embeddings, layer 0 out, final-norm output
    assert ref["router_logits"].shape == (2, t, 8)
    cfg = json.loads((tiny_qwen3moe["hf_dir" + variant] / "config.json").read_text())
    assert cfg["norm_topk_prob"] is (variant == "")
    assert cfg["vocab_size"] == 151669 and cfg["num_experts_per_tok"] == 2


def test_tiny_variants_differ_only_in_routing(tiny_qwen3moe: dict) -> None:
    a, b = assets.load_npz(tiny_qwen3moe["oracle"]), assets.load_npz(tiny_qwen3moe["oracle_nonorm"])
    assert (a["prompt_ids"] == b["prompt_ids"]).all()
    np.testing.assert_array_equal(a["hidden_states"][0], b["hidden_states"][0])  # same weights
    np.testing.assert_array_equal(
        a["router_logits"][0], b["router_logits"][0]
    )  # first router sees same input
    assert np.abs(a["logits"] - b["logits"]).max() > 0.1  # the renormalisation matters


def _fields(path) -> tuple[dict, dict]:
    """Scalar metadata and tensor type names; a lean walk, since gguf.GGUFReader takes ~10 s per file
    here to materialise the 151k-entry vocab arrays we do not need."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as fh:
        buf = memoryview(fh.read(1 << 26))  # metadata + tensor infos sit well inside 64 MiB
    pos = 0

    def take(fmt):
        nonlocal pos
        (v,) = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return bytes(buf[pos - n : pos]).decode("utf-8", "replace")

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            for _ in range(n):
                value(et)
            return None  # arrays are skipped
        return take(scalar[t])

    assert bytes(buf[:4]) == b"GGUF"
    pos = 4
    _, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("I"))
    types = {}
    for _ in range(n_tensors):
        name = string()
        n_dims = take("I")  # (not `pos += 8 * take(...)`: that would add to the stale pos)
        pos += 8 * n_dims
        types[name] = gguf.GGMLQuantizationType(take("I")).name
        pos += 8
    return kv, types


def test_tiny_ggufs(tiny_qwen3moe: dict) -> None:
    kv, types = _fields(tiny_qwen3moe["f32"])
    assert kv["general.architecture"] == "qwen3moe"
    assert kv["qwen3moe.expert_count"] == 8 and kv["qwen3moe.expert_used_count"] == 2
    assert "qwen3moe.expert_weights_norm" not in kv  # like real Qwen3 GGUFs: norm is implied
    assert set(types.values()) == {"F32"} and len(types) == 3 + 2 * 12
    _, q8 = _fields(tiny_qwen3moe["q8_0"])
    assert q8["blk.0.ffn_up_exps.weight"] == "Q8_0" and q8["output.weight"] == "Q8_0"
    assert q8["blk.0.ffn_gate_inp.weight"] == "F32" and q8["blk.0.attn_norm.weight"] == "F32"
    kv_n, _ = _fields(tiny_qwen3moe["f32_nonorm"])
    assert kv_n["qwen3moe.expert_weights_norm"] is False


def test_tokenizer_oracle(tokenizer_oracle: dict) -> None:
    models = tokenizer_oracle["models"]
    assert set(models) == {"smollm2", "gemma3", "qwen3"}
    n = len(tokenizer_oracle["corpus"])
    assert n >= 20 and "" in tokenizer_oracle["corpus"]
    for name, m in models.items():
        assert len(m["cases"]) == n
        for case in m["cases"]:
            if case["text"]:
                assert case["ids"], (name, case["text"])
        by_text = {c["text"]: c for c in m["cases"]}
        assert by_text[""]["ids"] == []
    # BOS policy per model: only Gemma adds one.
    for c in models["gemma3"]["cases"]:
        assert c["ids_special"] == [2] + c["ids"]
    for name in ("smollm2", "qwen3"):
        assert all(c["ids_special"] == c["ids"] for c in models[name]["cases"])
    # Special-token text maps to the single special id.
    qwen = {c["text"]: c["ids"] for c in models["qwen3"]["cases"]}
    assert qwen["<|im_start|>user\nhi<|im_end|>\n"][0] == 151644
    gemma = {c["text"]: c["ids"] for c in models["gemma3"]["cases"]}
    assert gemma["<start_of_turn>user\nhi<end_of_turn>\n"][0] == 105


def test_template_oracle(template_oracle: dict) -> None:
    qwen = template_oracle["models"]["qwen3"]
    assert qwen["chat_template"] and template_oracle["models"]["smollm2"]["chat_template"]
    cases = {(c["name"], c["kwargs"].get("enable_thinking")): c["rendered"] for c in qwen["cases"]}
    assert cases[("plain", False)].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert cases[("plain", True)].endswith("<|im_start|>assistant\n")
    assert '"Zürich"' in cases[("tool_call", True)]  # tojson keeps non-ASCII
    assert "<tool_response>" in cases[("tool_call", True)] and "<tools>" in cases[("tools_offer", True)]
    assert "Any of three works" not in cases[("multi_turn", True)]  # old reasoning dropped
    assert "Greet briefly." in cases[("assistant_last", True)]  # latest reasoning kept
    smol = template_oracle["models"]["smollm2"]["cases"]
    assert all(c["rendered"].startswith("<|im_start|>system\n") for c in smol)

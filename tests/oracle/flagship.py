"""Tiny random qwen3next and qwen4exp models: HF checkpoints, f32 GGUFs from llama.cpp's converter,
and transformers fp32 oracles (prompt logits, 16 greedy tokens and the logits that chose them).

Public: `tiny_qwen3next()`, `tiny_qwen4exp()`; each returns a dict of paths and is idempotent
(cached under cache_root(), built atomically, stamped with FLAGSHIP_VERSION and the tool versions).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from pathlib import Path

from oracle.fetch import LLAMA_CPP_PY, QWEN3_TOKENIZER_SHA, _cached, _run, llama_cpp_src, qwen3_tokenizer_dir
from oracle.oracles import QWEN3_PAD_ID, _lm_oracle, _save_npz, _tokenizer, _versions

FLAGSHIP_VERSION = 3
SEED = 4321
GREEDY = 16
EOS_ID = 151645  # <|im_end|>: the PLE n-gram hash restarts after it, so the prompt contains two
# Over 64 tokens and several times the QSA budget (16 tokens), with EOS tokens inside the prompt.
PROMPT = (
    "<|im_start|>user\nWhat does a hybrid linear-attention model keep per sequence?<|im_end|>\n"
    "<|im_start|>assistant\nA convolution window, a recurrent matrix per value head, the keys and values "
    "of its full-attention layers, and for n-gram embeddings the last few token ids.<|im_end|>\n"
    "<|im_start|>user\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
)


def _common(vocab: int) -> dict:
    return {
        "vocab_size": vocab,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,  # 2 value heads per key head: exercises GVA order
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "norm_topk_prob": True,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.1,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": EOS_ID,
        "pad_token_id": QWEN3_PAD_ID,
    }


def qwen3next_config() -> dict:
    """kwargs for transformers.Qwen3NextConfig: linear, full, linear, full."""
    return dict(
        _common(len(_tokenizer("qwen3"))),
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def qwen4exp_config() -> dict:
    """kwargs for transformers Qwen4ExpTextConfig: PLE on layer 0, QSA on layers 1 and 3."""
    return dict(
        _common(len(_tokenizer("qwen3"))),
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        # rotary dim = 32 * 0.25 = 8, i.e. 4 frequencies split 2/1/1 over t/h/w (interleaved)
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e6,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        hc_count=4,
        hc_lowrank=16,
        ple_layer_ids=[1],
        ple_embed_dim=64,
        ple_conv_kernel_size=4,
        ngram_size=3,
        heads_per_ngram=2,
        ngram_vocab_size_base=3000,
        make_ngram_vocab_size_divisible_by=128,
        seed=1234,
        split_ngram_parts=2,
        indexer_n_heads=8,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=16,
        indexer_compress_ratio=4,
    )


def _randomize(model, centred_norms: tuple[str, ...]) -> None:
    """Our own init, independent of transformers' init order.

    Zero-centred RMSNorm weights (y = x_hat * (1 + w)) get N(0, 0.1); direct ones N(1, 0.1), so a
    missing +1 or a missing multiply shows. A_log ~ N(0, 0.5) keeps decays in a useful range.
    """
    import torch

    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("linear_attn.norm.weight"):  # the gated norm multiplies by w itself
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(centred_norms):
                p.copy_(0.1 * noise)
            elif name.endswith("A_log") or name.startswith("lm_head"):
                p.copy_(0.5 * noise)
            elif "conv1d" in name:
                p.copy_(0.3 * noise)
            else:
                p.copy_(0.1 * noise)


def _convert(hf_dir: Path, out: Path, name: str, *extra: str, outtype: str = "f32") -> Path:
    # The converter needs the sdist's own gguf-py (it knows qwen4exp), so it goes first on PYTHONPATH.
    src = llama_cpp_src()
    path = [str(src / "gguf-py")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    _run(
        [
            sys.executable,
            str(src / "convert_hf_to_gguf.py"),
            str(hf_dir),
            "--outfile",
            str(out),
            "--outtype",
            outtype,
            "--model-name",
            name,
            *extra,
        ],
        env=env,
    )
    return out


def _build(tmp: Path, model, name: str, config: dict, extra: tuple[str, ...]) -> None:
    hf = tmp / "hf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(hf)
    # save_pretrained writes Qwen4-Exp's internal "indexed_attention"; the released checkpoint says
    # "full_attention" (the config maps it back on load), and the converter only recognises that when
    # it writes attention.compress_ratios. Write what the real checkpoint has.
    cfg_path = hf / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if "layer_types" in cfg:
        cfg["layer_types"] = ["full_attention" if t == "indexed_attention" else t for t in cfg["layer_types"]]
        cfg_path.write_text(json.dumps(cfg, indent=2))
    tok_dir = qwen3_tokenizer_dir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, hf / f)
    prompt_ids = _tokenizer("qwen3")(PROMPT)["input_ids"]
    assert len(prompt_ids) >= 64 and prompt_ids.count(EOS_ID) >= 2, len(prompt_ids)
    _save_npz(tmp / "oracle.npz", _lm_oracle(model, prompt_ids, GREEDY, QWEN3_PAD_ID))
    out = _convert(hf, tmp / f"{name}-f32.gguf", name, *extra)
    if "indexer_compress_ratio" in config:
        _restore_compress_ratios(out, config)
    (tmp / "recipe.json").write_text(
        json.dumps({"seed": SEED, "prompt": PROMPT, "greedy": GREEDY, "config": config}, indent=1)
    )


def _restore_compress_ratios(path: Path, config: dict) -> None:
    """Write the per-layer QSA compress ratios the converter meant to write.

    The converter reads the config through transformers' AutoConfig, which renames the released
    checkpoint's "full_attention" layers to "indexed_attention"; its test for "full_attention" then
    never matches and attention.compress_ratios comes out all zeros. Only patched when that happened.
    """
    from functools import partial

    import gguf
    import gguf.scripts.gguf_new_metadata as gnm

    key = "qwen4exp.attention.compress_ratios"
    reader = gguf.GGUFReader(path)
    if any(int(r) for r in reader.get_field(key).contents()):
        return
    ratios = [config["indexer_compress_ratio"] if t == "full_attention" else 0 for t in config["layer_types"]]
    fixed = path.with_suffix(".fixed")
    writer = gguf.GGUFWriter(fixed, arch="qwen4exp")
    new = {key: gnm.MetadataDetails(gguf.GGUFValueType.ARRAY, ratios)}
    bar, gnm.tqdm = gnm.tqdm, partial(gnm.tqdm, disable=True)  # its progress bar is just noise
    try:
        gnm.copy_with_new_metadata(reader, writer, new, [])
    finally:
        gnm.tqdm = bar
    del reader
    fixed.replace(path)


def _paths(d: Path, name: str) -> dict[str, Path]:
    return {
        "hf_dir": d / "hf",
        "f32": d / f"{name}-f32.gguf",
        "oracle": d / "oracle.npz",
        "recipe": d / "recipe.json",
    }


def _key(config: dict) -> str:
    return f"v{FLAGSHIP_VERSION}|{_versions()}|{QWEN3_TOKENIZER_SHA}|{LLAMA_CPP_PY}|{json.dumps(config)}"


def tiny_qwen3next() -> dict[str, Path]:
    """Random tiny Qwen3-Next (Gated DeltaNet + gated attention + shared-expert MoE)."""
    config = qwen3next_config()

    def build(tmp: Path) -> None:
        import torch
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        torch.manual_seed(SEED)
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**config)).eval()
        _randomize(model, ("layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight"))
        # The tiny checkpoint has no MTP block; --no-mtp stops the converter from looking for one.
        _build(tmp, model, "strata-tiny-qwen3next", config, ("--no-mtp",))
        # the converter's q8_0 as well: small enough to carry to the GPU machine (tests/gpu_fixtures.py)
        _convert(
            tmp / "hf",
            tmp / "strata-tiny-qwen3next-q8_0.gguf",
            "strata-tiny-qwen3next",
            "--no-mtp",
            outtype="q8_0",
        )

    paths = _paths(_cached("tiny_qwen3next", _key(config), build), "strata-tiny-qwen3next")
    return dict(paths, q8_0=paths["f32"].with_name("strata-tiny-qwen3next-q8_0.gguf"))


def tiny_qwen4exp() -> dict[str, Path]:
    """Random tiny Qwen4-Exp (Qwen3.8-Flash-Next): hyper-connections, QSA, PLE n-gram tables."""
    config = qwen4exp_config()

    def build(tmp: Path) -> None:
        import torch
        from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

        torch.manual_seed(SEED)
        model = Qwen4ExpForCausalLM(Qwen4ExpTextConfig(**config)).eval()
        _randomize(
            model,
            ("norm.weight", "norm_key.weight", "norm_query.weight", "norm_conv.weight", "layernorm.weight"),
        )
        _build(tmp, model, "strata-tiny-qwen4exp", config, ())

    return _paths(_cached("tiny_qwen4exp", _key(config), build), "strata-tiny-qwen4exp")

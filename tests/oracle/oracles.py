"""Reference outputs from transformers fp32 (the oracles), built into the fixture cache.

transformers is imported lazily so that importing this module stays cheap for tests that only
read finished fixtures.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from functools import cache, partial
from pathlib import Path

from oracle.corpus import CONVERSATIONS, TOKENIZER_CORPUS
from oracle.fetch import (
    GEMMA3_SHA,
    LLAMA_CPP_PY,
    QWEN3_NPM,
    QWEN3_TOKENIZER_SHA,
    SMOLLM2_SHA,
    _cached,
    _convert,
    _sha256,
    gemma3_gguf,
    llama_cpp_src,
    qwen3_tokenizer_dir,
    smollm2_gguf,
)

# Local paths only: a hub lookup would hang or fail on CI.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMOLLM2_PROMPT = "The three primary colors are"
SMOLLM2_GREEDY = 24
TINY_PROMPT = (
    "Strata loads GGUF files and runs mixture-of-experts models on small GPUs.\n"
    "def add(a, b):\n    return a + b  # sum\nprint(add(2, 40))\n"
)
TINY_GREEDY = 16
# Picked by scanning seeds 0-39 (same init recipe): with 13, simulated Q8_0 weights flip no top-2 expert
# choice on the prompt in either variant, so q8_0-vs-fp32 comparisons are not dominated by routing flips.
TINY_SEED = 13
QWEN3_PAD_ID = 151643  # <|endoftext|>


def _versions() -> str:
    # From package metadata, so checking a stamp never pays for importing torch/transformers.
    from importlib.metadata import version

    return f"transformers={version('transformers')},torch={version('torch')}"


@cache
def _tokenizer(kind: str):
    """transformers tokenizer per model; from the GGUF for smollm2/gemma3, from tokenizer.json for qwen3."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "qwen3":
            return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
        path = smollm2_gguf() if kind == "smollm2" else gemma3_gguf()
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _load_gguf_lm(path: Path):
    """transformers' own GGUF dequantization into an fp32 model; returns (model, loader name)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import is_accelerate_available, logging

    logging.disable_progress_bar()
    if is_accelerate_available():
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        return model.eval(), "from_pretrained"
    # from_pretrained(gguf_file=) insists on accelerate, which is not a dev dependency; this runs the same
    # legacy dequantizer from_pretrained uses for llama (checked bit-identical logits on SmolLM2).
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    sd = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model, torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(sd["tensors"], strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"} or (missing and not cfg.tie_word_embeddings):
        raise RuntimeError(f"GGUF load mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    return model.eval(), "load_gguf_checkpoint"


def _lm_oracle(model, prompt_ids: list[int], n_greedy: int, pad_id: int, extra: bool = False) -> dict:
    """Prompt logits, n_greedy greedy tokens (EOS does not stop it), and the logits that chose each one."""
    import numpy as np
    import torch
    from transformers import GenerationConfig

    x = torch.tensor([prompt_ids])
    t = len(prompt_ids)
    hooks, router = [], []
    if extra:  # record router logits of every MoE layer (Qwen3MoeTopKRouter returns them first)
        for layer in model.model.layers:
            hooks.append(layer.mlp.gate.register_forward_hook(lambda m, i, o: router.append(o[0].detach())))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(x, output_hidden_states=extra)
        for h in hooks:
            h.remove()
        gc = GenerationConfig(
            do_sample=False, max_new_tokens=n_greedy, eos_token_id=None, pad_token_id=pad_id
        )
        seq = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
        greedy = seq[0, t:]
        full = model(seq[:, :-1]).logits[0, t - 1 :]  # position t-1+i predicts greedy[i]
    if len(greedy) != n_greedy or not torch.equal(full.argmax(-1), greedy):
        raise RuntimeError("greedy tokens disagree with argmax of the single-forward logits")
    logits = out.logits[0].float()

    def margin(lg):  # top1 - top2 gap per row; tiny gaps mean argmax may legitimately flip
        top = torch.topk(lg, 2, dim=-1).values
        return (top[:, 0] - top[:, 1]).numpy()

    res = {
        "prompt_ids": np.asarray(prompt_ids, dtype=np.int32),
        "logits": logits.numpy(),
        "greedy": greedy.numpy().astype(np.int32),
        "greedy_logits": full.float().numpy(),
        "logits_margin": margin(logits),
        "greedy_margin": margin(full.float()),
    }
    if extra:  # [L+1, T, H]: embeddings, each layer's output; the last one is after the final norm
        res["hidden_states"] = torch.stack(out.hidden_states)[:, 0].float().numpy()
        res["router_logits"] = torch.stack(router).float().numpy()
    return res


def _save_npz(path: Path, arrays: dict) -> None:
    import numpy as np

    np.savez(path, **arrays)


# ---------------------------------------------------------------- oracles


def tiny_qwen3moe_config(norm_topk_prob: bool = True) -> dict:
    """The tiny Qwen3-MoE recipe (kwargs for transformers.Qwen3MoeConfig)."""
    return {
        "vocab_size": len(_tokenizer("qwen3")),  # 151669: the tokenizer's full size, no padding rows
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "rope_theta": 1e6,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.1,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": 151645,
        "pad_token_id": QWEN3_PAD_ID,
    }


def _tiny_model(norm_topk_prob: bool):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # save_pretrained's shard bar is noise in the build log
    torch.manual_seed(TINY_SEED)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**tiny_qwen3moe_config(norm_topk_prob))).eval()
    # Our own init, independent of transformers' init order: norms drawn around 1 (not exactly 1, so a
    # missing norm multiply shows), weights N(0, 0.1), lm_head N(0, 0.5) so the logits are far from flat.
    gen = torch.Generator().manual_seed(TINY_SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(noise * (0.5 if name.startswith("lm_head") else 0.1))
    return model


def tiny_qwen3moe() -> dict[str, Path]:
    """Random tiny Qwen3-MoE: HF dirs, converter GGUFs (f32, q8_0, f32_nonorm) and fp32 oracles (npz).

    The nonorm variant has the same weights; only routing differs (top-k weights not renormalised).
    The converter does not record norm_topk_prob and llama.cpp hard-codes it on for qwen3moe, so the
    nonorm GGUF gets `qwen3moe.expert_weights_norm = false` added by us; the others lack the key.
    """
    tok_dir, src = qwen3_tokenizer_dir(), llama_cpp_src()

    def build(tmp: Path) -> None:
        import gguf
        import gguf.scripts.gguf_new_metadata as gnm
        from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

        prompt_ids = _tokenizer("qwen3")(TINY_PROMPT)["input_ids"]
        for norm, sfx in ((True, ""), (False, "_nonorm")):
            hf = tmp / f"hf{sfx}"
            model = _tiny_model(norm)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.save_pretrained(hf)  # safetensors, fp32
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(tok_dir / f, hf / f)
            res = _lm_oracle(model, prompt_ids, TINY_GREEDY, QWEN3_PAD_ID, extra=True)
            _save_npz(tmp / f"oracle{sfx}.npz", res)
            if norm:
                _convert(src, hf, tmp / "tiny-f32.gguf", "f32")
                _convert(src, hf, tmp / "tiny-q8_0.gguf", "q8_0")
            else:
                raw = _convert(src, hf, tmp / "raw.gguf", "f32")
                reader = gguf.GGUFReader(raw)
                writer = gguf.GGUFWriter(tmp / "tiny-f32-nonorm.gguf", arch="qwen3moe")
                key = gguf.Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch="qwen3moe")
                new = {key: MetadataDetails(gguf.GGUFValueType.BOOL, False)}
                bar, gnm.tqdm = gnm.tqdm, partial(gnm.tqdm, disable=True)  # its progress bar is just noise
                try:
                    copy_with_new_metadata(reader, writer, new, [])
                finally:
                    gnm.tqdm = bar
                del reader
                raw.unlink()
        (tmp / "recipe.json").write_text(
            json.dumps(
                {
                    "seed": TINY_SEED,
                    "prompt": TINY_PROMPT,
                    "greedy": TINY_GREEDY,
                    "config": tiny_qwen3moe_config(True),
                    "nonorm_config": tiny_qwen3moe_config(False),
                },
                indent=1,
            )
        )

    d = _cached(
        "tiny_qwen3moe", f"{_versions()}|{_recipe_hash()}|{QWEN3_TOKENIZER_SHA}|{LLAMA_CPP_PY}", build
    )
    return {
        "hf_dir": d / "hf",
        "f32": d / "tiny-f32.gguf",
        "q8_0": d / "tiny-q8_0.gguf",
        "oracle": d / "oracle.npz",
        "hf_dir_nonorm": d / "hf_nonorm",
        "f32_nonorm": d / "tiny-f32-nonorm.gguf",
        "oracle_nonorm": d / "oracle_nonorm.npz",
        "recipe": d / "recipe.json",
    }


def smollm2_oracle() -> Path:
    """fp32 logits/greedy of SmolLM2 as transformers dequantizes its Q4_1 GGUF (so only our math differs)."""
    path = smollm2_gguf()

    def build(tmp: Path) -> None:
        import numpy as np

        tok = _tokenizer("smollm2")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, loader = _load_gguf_lm(path)
        ids = tok(SMOLLM2_PROMPT)["input_ids"]  # add_special_tokens default; this GGUF says add_bos=false
        res = _lm_oracle(model, ids, SMOLLM2_GREEDY, tok.pad_token_id or 0)
        res["loader"] = np.array(loader)
        _save_npz(tmp / "smollm2_oracle.npz", res)

    return (
        _cached("smollm2_oracle", f"{_versions()}|{_recipe_hash()}|{SMOLLM2_SHA}", build)
        / "smollm2_oracle.npz"
    )


def tokenizer_oracle() -> Path:
    """ids with/without special tokens for TOKENIZER_CORPUS under the smollm2, gemma3 and qwen3 tokenizers."""

    def build(tmp: Path) -> None:
        out: dict = {"corpus": TOKENIZER_CORPUS, "versions": _versions(), "models": {}}
        sources = {
            "smollm2": f"AutoTokenizer gguf_file={smollm2_gguf().name}",
            "gemma3": f"AutoTokenizer gguf_file={gemma3_gguf().name}",
            "qwen3": f"AutoTokenizer {QWEN3_NPM} package/models",
        }
        for kind, source in sources.items():
            tok = _tokenizer(kind)
            rows = []
            for text in TOKENIZER_CORPUS:
                ids = tok(text, add_special_tokens=False)["input_ids"]
                special = tok(text, add_special_tokens=True)["input_ids"]
                rows.append({"text": text, "ids": ids, "ids_special": special, "decoded": tok.decode(ids)})
            out["models"][kind] = {
                "source": source,
                "class": type(tok).__name__,
                "vocab_size": len(tok),
                "bos_token_id": tok.bos_token_id,
                "eos_token_id": tok.eos_token_id,
                "cases": rows,
            }
        (tmp / "tokenizer_oracle.json").write_text(json.dumps(out, ensure_ascii=False, indent=1))

    key = f"{_versions()}|{_recipe_hash()}|{SMOLLM2_SHA}|{GEMMA3_SHA}|{QWEN3_TOKENIZER_SHA}"
    return _cached("tokenizer_oracle", key, build) / "tokenizer_oracle.json"


def template_oracle() -> Path:
    """apply_chat_template(tokenize=False) of CONVERSATIONS with the Qwen3 and SmolLM2 chat templates."""

    def build(tmp: Path) -> None:
        out: dict = {"versions": _versions(), "models": {}}
        for kind in ("qwen3", "smollm2"):
            tok = _tokenizer(kind)
            variants = [{"enable_thinking": True}, {"enable_thinking": False}] if kind == "qwen3" else [{}]
            cases = []
            for name, (messages, tools, overrides) in CONVERSATIONS.items():
                for extra in variants:
                    kwargs = {"add_generation_prompt": True, **extra, **overrides}
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
                    cases.append(
                        {
                            "name": name,
                            "messages": messages,
                            "tools": tools,
                            "kwargs": kwargs,
                            "rendered": text,
                        }
                    )
            # transformers also passes the special-token strings into the template context.
            out["models"][kind] = {
                "chat_template": tok.chat_template,
                "special_tokens": {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)},
                "cases": cases,
            }
        (tmp / "template_oracle.json").write_text(json.dumps(out, ensure_ascii=False, indent=1))

    key = f"{_versions()}|{_recipe_hash()}|{SMOLLM2_SHA}|{QWEN3_TOKENIZER_SHA}"
    return _cached("template_oracle", key, build) / "template_oracle.json"


def _recipe_hash() -> str:
    """Any edit to the oracle recipe or corpus rebuilds the oracles, without remembering to bump a version."""
    here = Path(__file__).parent
    return "recipe=" + "".join(_sha256(here / f)[:12] for f in ("oracles.py", "corpus.py"))

"""Tokenizer metadata as llama.cpp's converter writes it for a GPT-2-style BPE model (Qwen3):
`convert_hf_to_gguf.py`'s `get_vocab_base` + `_set_vocab_gpt2`, without transformers.

Everything is read from the HF files (`tokenizer.json`, `tokenizer_config.json`): tokens and
token types here, merges / special ids / add_* flags / chat template through gguf's SpecialVocab,
the same class the converter uses. tests/tokenizer_helpers.py checks this against the
transformers-based original.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path

import gguf

#: What Qwen3's config.json says (the npm tokenizer package ships no config.json).
QWEN3_CONFIG = {"bos_token_id": 151643, "eos_token_id": 151645}
#: Qwen3 checkpoints pad the embedding to 151936 rows; the converter pads the vocab to match.
QWEN3_VOCAB_SIZE = 151936
#: llama.cpp's pre-tokenizer name for Qwen2/Qwen3's regex.
QWEN_PRE = "qwen2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def looks_special(token: str) -> bool:
    """convert_hf_to_gguf's ModelBase.does_token_look_special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<｜") and token.endswith("｜>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def vocab_base(tokenizer_dir: str | os.PathLike[str], vocab_size: int) -> tuple[list[str], list[int]]:
    """Tokens and gguf.TokenType per id, padded with [PADn] UNUSED tokens up to `vocab_size`.

    The converter's rules: added tokens that are special (or look special) are CONTROL, other added
    tokens USER_DEFINED; a non-normalized added token is round-tripped through the tokenizer first.
    """
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    tok = Tokenizer.from_file(str(path))
    reverse = {i: t for t, i in spec["model"]["vocab"].items()}
    added = {a["id"]: a for a in spec.get("added_tokens", [])}
    reverse.update((i, a["content"]) for i, a in added.items())
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if i in added:
            if not added[i].get("normalized", True):
                ids = tok.encode(token, add_special_tokens=False).ids
                token = tok.decode(ids, skip_special_tokens=False)
            if added[i].get("special", False) or looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def special_vocab(
    tokenizer_dir: str | os.PathLike[str], n_vocab: int, config: dict | None
) -> gguf.SpecialVocab:
    """Merges, special token ids, add_* flags and chat template; `config` stands in for config.json
    (where the converter finds bos/eos ids the tokenizer files do not name)."""
    with tempfile.TemporaryDirectory(prefix="strata-vocab-") as tmp:
        for name in TOKENIZER_FILES:
            shutil.copy(Path(tokenizer_dir) / name, Path(tmp) / name)
        if config is not None:
            (Path(tmp) / "config.json").write_text(json.dumps(config))
        return gguf.SpecialVocab(tmp, load_merges=True, n_vocab=n_vocab)


def add_tokenizer(
    writer: gguf.GGUFWriter,
    tokens: list[str],
    types: list[int],
    special: gguf.SpecialVocab,
    pre: str = QWEN_PRE,
) -> None:
    """Write the tokenizer.* keys in the converter's order."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special.add_to_gguf(writer, quiet=True)


def missing_files(tokenizer_dir: str | os.PathLike[str]) -> list[str]:
    """The HF tokenizer files this directory lacks (empty when it can be used)."""
    return [n for n in TOKENIZER_FILES if not (Path(tokenizer_dir) / n).is_file()]


@cache
def _qwen3(tokenizer_dir: str, vocab_size: int) -> tuple[tuple[str, ...], tuple[int, ...], gguf.SpecialVocab]:
    # Reading the vocabulary takes ~1.5 s; a process writing several files (tests) reads it once.
    tokens, types = vocab_base(tokenizer_dir, vocab_size)
    return tuple(tokens), tuple(types), special_vocab(tokenizer_dir, len(tokens), QWEN3_CONFIG)


def add_qwen3_tokenizer(
    writer: gguf.GGUFWriter, tokenizer_dir: str | os.PathLike[str], vocab_size: int = QWEN3_VOCAB_SIZE
) -> None:
    """The whole Qwen3 tokenizer as a converted Qwen3 checkpoint carries it (read once per process)."""
    tokens, types, special = _qwen3(os.fspath(Path(tokenizer_dir).resolve()), vocab_size)
    add_tokenizer(writer, list(tokens), list(types), special)

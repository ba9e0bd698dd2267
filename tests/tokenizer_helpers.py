"""Shared by test_tokenizer / test_detok / test_chat_template: the corpus, per-process caches of
the (slow to build) tokenizers, and a writer for a vocab-only Qwen3 GGUF.

Caches are module-level functools caches rather than fixtures so the three test modules share one
transformers load per model (gemma3 from GGUF takes ~25 s in transformers).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from functools import cache
from pathlib import Path

from oracle.corpus import TOKENIZER_CORPUS

from strata.gguf import GGUFFile
from strata.synth.vocab import QWEN3_CONFIG, QWEN3_VOCAB_SIZE, add_tokenizer, special_vocab
from strata.synth.vocab import looks_special as _looks_special
from strata.text.tokenizer import Tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Hazards beyond the shared oracle corpus; the comment says which.
EXTRA_CORPUS: list[str] = [
    "cafe\u0301 nai\u0308ve",  # decomposed accents (NFC changes them for Qwen)
    "🧑🏿‍🚀 ❤️‍🔥 🫠 🏴󠁧󠁢󠁳󠁣󠁴󠁿",  # ZWJ sequences, variation selector, tag-sequence flag
    "class A:\n\tdef f(self):\n\t\treturn {'k': [1, 2]}\n\n\n",  # tabs + trailing newlines
    "    \n        x = 1\n",  # deep indentation
    "x" * 300 + " " * 40 + "y",  # long runs
    "<think>\nreasoning\n</think>\n\nanswer",  # user-defined tokens for Qwen3
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "<|endoftext|><bos><eos><|im_end|>",  # back-to-back special texts
    "<|im_end",  # a special token's prefix must not match
    "\u200b\u200d\ufeff zero-width",  # format characters
    "Ελληνικά русский עברית العربية हिन्दी ไทย",  # scripts without spaces / RTL / combining marks
    "trailing space ",
    "0123456789 00 007 1e10 3.0",
]
CORPUS: list[str] = TOKENIZER_CORPUS + EXTRA_CORPUS


@cache
def strata_tokenizer(path: str) -> Tokenizer:
    """Our tokenizer for a GGUF, built once per process."""
    return Tokenizer.from_gguf(GGUFFile(path))


@cache
def hf_gguf_tokenizer(path: str):
    """transformers' tokenizer built from the same GGUF (the oracle)."""
    from transformers import AutoTokenizer

    p = Path(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


@cache
def hf_dir_tokenizer(directory: str):
    """transformers' tokenizer from tokenizer.json/tokenizer_config.json."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(directory)


def _vocab_base(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """convert_hf_to_gguf's get_vocab_base: tokens + gguf.TokenType per id, padded to vocab_size.

    Kept on transformers as the oracle for strata.synth.vocab.vocab_base (tests/test_synth.py)."""
    import gguf

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            if not decoder[i].normalized:
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or _looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def write_tokenizer_gguf(
    tokenizer_dir: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    pre: str = "qwen2",
    arch: str = "qwen3moe",
    vocab_size: int | None = None,
    config: dict | None = None,
) -> Path:
    """A tensor-less GGUF holding the tokenizer metadata convert_hf_to_gguf.py's `_set_vocab_gpt2`
    would write for `tokenizer_dir` (tokens, token types, merges, special ids, add_* flags,
    chat_template). `config` stands in for config.json (special ids the converter reads there);
    `vocab_size` pads with [PADn] UNUSED tokens like a config.json vocab_size larger than the vocab.
    """
    import gguf

    tok = hf_dir_tokenizer(str(tokenizer_dir))
    n_vocab = vocab_size or len(tok.get_vocab())
    tokens, types = _vocab_base(tok, n_vocab)
    special = special_vocab(tokenizer_dir, len(tokens), config)
    writer = gguf.GGUFWriter(os.fspath(out_path), arch)
    add_tokenizer(writer, tokens, types, special, pre)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return Path(out_path)


@cache
def qwen3_gguf(tokenizer_dir: str) -> str:
    """Write (once per process) a Qwen3 tokenizer GGUF into a temp dir removed at exit."""
    import atexit

    tmp = tempfile.mkdtemp(prefix="strata-qwen3-tok-")
    atexit.register(shutil.rmtree, tmp, True)
    out = Path(tmp) / "qwen3-tokenizer.gguf"
    write_tokenizer_gguf(tokenizer_dir, out, vocab_size=QWEN3_VOCAB_SIZE, config=QWEN3_CONFIG)
    return str(out)

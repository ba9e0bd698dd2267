"""strata.text.tokenizer against transformers: same ids, same decode, same special-token handling.

Oracles: transformers' GGUF loader for SmolLM2 and gemma3 (the same file we read), and Qwen3's
own tokenizer.json for a GGUF we write the way convert_hf_to_gguf.py would.
"""

from __future__ import annotations

import time
import unicodedata

import numpy as np
import pytest
from tokenizer_helpers import (
    CORPUS,
    hf_dir_tokenizer,
    hf_gguf_tokenizer,
    qwen3_gguf,
    strata_tokenizer,
)

from strata.errors import GGUFError
from strata.gguf import GGUFFile
from strata.text.tokenizer import Tokenizer
from strata.text.tokenizer_build import CONTROL, NORMAL, USER_DEFINED, build_tokenizer, derive_merges

MODELS = ["smollm2", "gemma3", "qwen3"]


@pytest.fixture(params=MODELS)
def pair(request):
    """(ours, transformers') tokenizers for one model, cached for the whole session."""
    kind = request.param
    if kind == "qwen3":
        directory = str(request.getfixturevalue("qwen3_tokenizer_dir"))
        return kind, strata_tokenizer(qwen3_gguf(directory)), hf_dir_tokenizer(directory)
    path = str(request.getfixturevalue(f"{kind}_path"))
    return kind, strata_tokenizer(path), hf_gguf_tokenizer(path)


def _diff(cases):
    return "\n".join(f"{text!r}:\n  ours {a}\n  hf   {b}" for text, a, b in cases)


def test_ids_match_transformers(pair):
    kind, ours, hf = pair
    bad = []
    for text in CORPUS:
        for special in (False, True):
            a = ours.encode(text, add_special=special)
            b = hf(text, add_special_tokens=special)["input_ids"]
            if a != b:
                bad.append((f"{text} [add_special={special}]", a, b))
    assert not bad, f"{kind}: {len(bad)} mismatches\n{_diff(bad)}"


def test_decode_matches_transformers(pair):
    kind, ours, hf = pair
    bad = []
    for text in CORPUS:
        ids = hf(text, add_special_tokens=True)["input_ids"]
        for skip in (False, True):
            a, b = ours.decode(ids, skip_special=skip), hf.decode(ids, skip_special_tokens=skip)
            if a != b:
                bad.append((f"{text} [skip={skip}]", a, b))
    assert not bad, f"{kind}:\n{_diff(bad)}"


def test_roundtrip_where_transformers_roundtrips(pair):
    kind, ours, hf = pair
    checked = 0
    for text in CORPUS:
        if hf.decode(hf(text, add_special_tokens=False)["input_ids"]) != text:
            continue  # e.g. NFC-normalized input under Qwen
        checked += 1
        assert ours.decode(ours.encode(text, add_special=False)) == text, (kind, text)
    assert checked >= len(CORPUS) - 3


def test_parse_special_false_matches_split_special_tokens(pair):
    kind, ours, hf = pair
    for text in CORPUS:
        a = ours.encode(text, add_special=False, parse_special=False)
        b = hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert a == b, (kind, text, a, b)
    # and parse_special=False is per call: the next default call parses again
    im_end = "<end_of_turn>" if kind == "gemma3" else "<|im_end|>"
    special_id = hf.convert_tokens_to_ids(im_end)
    assert special_id not in ours.encode(im_end, add_special=False, parse_special=False)
    assert ours.encode(im_end, add_special=False) == [special_id]


EXPECTED_SPECIALS = {
    # kind: (vocab_size, bos, eos, eot ids that must be present, add_bos)
    "smollm2": (49152, 1, 2, {0, 2}, False),
    "gemma3": (262144, 2, 1, {1, 106}, True),
    "qwen3": (151936, 151643, 151645, {151643, 151645}, False),
}


def test_special_ids(pair):
    kind, ours, hf = pair
    size, bos, eos, eot, add_bos = EXPECTED_SPECIALS[kind]
    assert (ours.vocab_size, ours.bos_id, ours.eos_id, ours.add_bos) == (size, bos, eos, add_bos)
    assert eot <= ours.eot_ids
    assert ours.eos_id in ours.eot_ids
    assert ours.is_special(eos) and ours.token_text(eos) == hf.convert_ids_to_tokens(eos)
    for tid in ours.eot_ids:
        assert ours.is_special(tid), (kind, tid, ours.token_text(tid))
    plain = ours.encode("hello", add_special=False)[0]
    assert not ours.is_special(plain)


def test_user_defined_tokens_are_not_special(pair):
    kind, ours, _ = pair
    text = {"gemma3": "\n\n", "qwen3": "<think>", "smollm2": None}[kind]
    if text is None:
        pytest.skip("SmolLM2 has no user-defined tokens")
    (tid,) = ours.encode(text, add_special=False, parse_special=False)
    assert not ours.is_special(tid)
    assert ours.decode([tid], skip_special=True) == text


def test_token_bytes_concatenate_to_text(pair):
    kind, ours, _ = pair
    for text in CORPUS:
        ids = ours.encode(text, add_special=False, parse_special=False)
        raw = b"".join(ours.token_bytes(i) for i in ids)
        expected = unicodedata.normalize("NFC", text) if kind == "qwen3" else text  # Qwen normalizes
        assert raw.decode("utf-8") == expected, (kind, text)


def test_encode_chat_adds_bos_once(pair):
    _, ours, _ = pair
    ids = ours.encode_chat(f"{ours.bos_token}hi" if ours.add_bos else "hi")
    assert ids.count(ours.bos_id) == (1 if ours.add_bos else 0)
    if ours.add_bos:
        assert ours.encode_chat("hi")[0] == ours.bos_id


def test_gemma3_build_is_fast(gemma3_path):
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(GGUFFile(gemma3_path))
    seconds = time.perf_counter() - t0
    print(f"gemma3 tokenizer (262k vocab) open+build: {seconds:.2f} s")
    assert tok.vocab_size == 262144
    assert seconds < 8.0  # ~1.5-2.5 s on a busy 2-core box; this only catches gross regressions


# ---- builder units ----------------------------------------------------------------------------
def _meta(tokens, types=None, **extra):
    meta = {"tokenizer.ggml.tokens": tokens, "general.architecture": "llama"}
    if types is not None:
        meta["tokenizer.ggml.token_type"] = np.asarray(types, np.int32)
    meta.update({f"tokenizer.ggml.{k}": v for k, v in extra.items()})
    return meta


def test_unknown_pre_tokenizer_is_a_clear_error():
    meta = _meta(["a", "b"], model="gpt2", pre="no-such-pre", merges=[])
    with pytest.raises(GGUFError, match="no-such-pre"):
        build_tokenizer(meta, "x.gguf")


def test_malformed_merges_are_a_clear_error():
    with pytest.raises(GGUFError, match="malformed merge"):
        build_tokenizer(_meta(["a", "b", "ab"], model="gpt2", pre="default", merges=["a b c"]), "x.gguf")
    with pytest.raises(GGUFError, match="do not fit"):
        build_tokenizer(_meta(["a", "b"], model="gpt2", pre="default", merges=["a c"]), "x.gguf")


def test_unknown_tokenizer_model_is_a_clear_error():
    with pytest.raises(GGUFError, match="bert"):
        build_tokenizer(_meta(["a"], model="bert"), "x.gguf")


def test_derive_merges_matches_transformers_generate_merges():
    from transformers.tokenization_utils_base import generate_merges

    rng = np.random.default_rng(0)
    alphabet = list("ab▁c\x00é😀")
    tokens = list(
        dict.fromkeys(alphabet + ["".join(rng.choice(alphabet, rng.integers(2, 6))) for _ in range(400)])
    )
    tokens += ["ab" * 20, "a" * 33, "ab" * 17]  # longer than the 32-char hash width
    vocab = {t: i for i, t in enumerate(tokens)}
    scores = rng.integers(-5, 0, len(tokens)).astype(np.float64)  # many ties
    expected = generate_merges(vocab, dict(zip(tokens, scores.tolist())))
    assert derive_merges(tokens, vocab, scores) == expected


def test_sentencepiece_with_space_prefix_strips_on_decode():
    """A Llama-style vocab (add_space_prefix) prepends ▁ to the text and strips it on decode."""
    tokens = ["<unk>", "<s>", "</s>", "▁", "h", "i", "▁h", "▁hi", "hi"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, CONTROL, CONTROL] + [NORMAL] * 6 + [6] * 256
    meta = _meta(
        tokens,
        types,
        model="llama",
        scores=np.arange(len(tokens), 0, -1, dtype=np.float32),
        bos_token_id=1,
        eos_token_id=2,
        unknown_token_id=0,
    )
    tok = Tokenizer(build_tokenizer(meta), meta)
    assert tok.add_bos  # SentencePiece vocabularies add BOS unless told otherwise
    ids = tok.encode("hi hi")
    assert ids == [1, 7, 7]
    # Only the first token's ▁ is stripped; after a BOS it stays (as in transformers and llama.cpp).
    assert tok.decode(ids) == "<s> hi hi" and tok.decode(ids, skip_special=True) == "hi hi"
    assert tok.decode(ids[1:]) == "hi hi"
    assert tok.decode(tok.encode("é", add_special=False)) == "é"  # byte fallback


def test_byte_level_added_token_outside_alphabet_keeps_its_id():
    """A control token spelled with characters outside the byte alphabet still maps to its id
    (transformers drops such tokens; llama.cpp matches them)."""
    from strata.text.tokenizer_build import bytes_to_unicode

    alpha = list(bytes_to_unicode().values())
    tokens = alpha + ["<｜end▁of▁sentence｜>", "<tool call>"]
    types = [NORMAL] * 256 + [CONTROL, USER_DEFINED]
    meta = _meta(tokens, types, model="gpt2", pre="default", merges=[], eos_token_id=256)
    tok = Tokenizer(build_tokenizer(meta), meta)
    assert tok.encode("x<｜end▁of▁sentence｜>", add_special=False)[-1] == 256
    assert tok.encode("<tool call>", add_special=False) == [257]
    assert tok.decode([256, 257]) == "<｜end▁of▁sentence｜><tool call>"


@pytest.mark.slow
def test_real_converter_gguf_matches_qwen3_tokenizer_json(tiny_qwen3moe, qwen3_tokenizer_dir):
    """The tiny Qwen3-MoE GGUF made by llama.cpp's own convert_hf_to_gguf.py (no vocab padding,
    no bos in its config) tokenizes like Qwen3's tokenizer.json."""
    ours = Tokenizer.from_gguf(GGUFFile(tiny_qwen3moe["f32"]))
    hf = hf_dir_tokenizer(str(qwen3_tokenizer_dir))
    assert (ours.vocab_size, ours.bos_id, ours.eos_id) == (151669, None, 151645)
    for text in CORPUS:
        ids = ours.encode(text)
        assert ids == hf(text)["input_ids"], text
        assert ours.decode(ids) == hf.decode(ids), text

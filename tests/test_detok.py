"""StreamDecoder: pushing ids one at a time yields whole characters only, and the pieces add up
to tokenizer.decode(all ids)."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizer_helpers import CORPUS, qwen3_gguf, strata_tokenizer

from strata.text.detok import StreamDecoder
from strata.text.tokenizer import Tokenizer
from strata.text.tokenizer_build import CONTROL, NORMAL, build_tokenizer


@pytest.fixture(params=["smollm2", "gemma3", "qwen3"])
def tok(request) -> Tokenizer:
    if request.param == "qwen3":
        return strata_tokenizer(qwen3_gguf(str(request.getfixturevalue("qwen3_tokenizer_dir"))))
    return strata_tokenizer(str(request.getfixturevalue(f"{request.param}_path")))


def _stream(tok: Tokenizer, ids, skip_special: bool = False) -> list[str]:
    dec = StreamDecoder(tok, skip_special=skip_special)
    pieces = [dec.push(i) for i in ids]
    pieces.append(dec.flush())
    return pieces


def _assert_clean(pieces: list[str], full: str) -> None:
    for p in pieces:
        assert isinstance(p, str)
        p.encode("utf-8")  # no lone surrogates
        if "\ufffd" not in full:
            assert "\ufffd" not in p, pieces


@pytest.mark.parametrize("skip_special", [False, True])
def test_stream_concatenation_equals_decode(tok, skip_special):
    for text in CORPUS:
        ids = tok.encode(text, add_special=True)
        pieces = _stream(tok, ids, skip_special)
        full = tok.decode(ids, skip_special=skip_special)
        _assert_clean(pieces, full)
        assert "".join(pieces) == full, (text, pieces)


def test_multibyte_characters_are_held_back(tok):
    """Emoji that take several tokens (byte pieces) appear in one piece, never half of one."""
    text = "ok 🫠🧑🏿‍🚀 𝟙 漢"
    ids = tok.encode(text, add_special=False)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == text
    assert len(ids) > len(text.split())  # at least one character is split over tokens
    assert all("\ufffd" not in p for p in pieces)
    # every emitted piece ends on a character boundary of the final text
    pos = 0
    for p in pieces:
        assert text[pos : pos + len(p)] == p
        pos += len(p)


@pytest.mark.parametrize("skip_special", [False, True])
def test_random_ids_never_break_the_invariant(tok, skip_special):
    """Arbitrary id streams (lone and misordered byte pieces, specials inside a character, invalid
    UTF-8) still concatenate to exactly decode(all)."""
    rng = np.random.default_rng(1)
    high_bytes = [i for i in range(2000) if len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80]
    assert len(high_bytes) >= 64  # every vocabulary here has single-byte pieces for 0x80-0xFF
    emoji = tok.encode("é😀漢", add_special=False)
    pool = np.array(
        high_bytes + emoji + [tok.eos_id, tok.bos_id or 0] + rng.integers(0, tok.vocab_size, 16).tolist()
    )
    for _ in range(60):
        ids = rng.choice(pool, int(rng.integers(1, 16))).tolist()
        pieces = _stream(tok, ids, skip_special)
        assert "".join(pieces) == tok.decode(ids, skip_special=skip_special), ids
        for p in pieces:
            p.encode("utf-8")


def test_flush_emits_incomplete_tail_as_replacement(tok):
    ids = tok.encode("a😀", add_special=False)
    if len(ids) < 3:
        pytest.skip("emoji is a single token here")
    dec = StreamDecoder(tok)
    out = "".join(dec.push(i) for i in ids[:-1])
    assert out == "a"
    assert dec.flush() == tok.decode(ids[:-1])[1:]


def test_leading_space_prefix_vocab_streams_like_decode():
    """SentencePiece with add_space_prefix: decode strips the first ▁; streaming must agree."""
    tokens = ["<unk>", "<s>", "</s>", "▁", "h", "i", "▁h", "▁hi", "hi"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, CONTROL, CONTROL] + [NORMAL] * 6 + [6] * 256
    meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.asarray(types, np.int32),
        "tokenizer.ggml.scores": np.arange(len(tokens), 0, -1, dtype=np.float32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    tok = Tokenizer(build_tokenizer(meta), meta)
    for text in ("hi hi", " hi", "hi  é hi"):
        for add_special in (False, True):
            ids = tok.encode(text, add_special=add_special)
            for skip in (False, True):
                pieces = _stream(tok, ids, skip)
                assert "".join(pieces) == tok.decode(ids, skip_special=skip), (text, ids, pieces)
    assert _stream(tok, tok.encode("hi hi", add_special=False))[:2] == ["hi", " hi"]

"""Text <-> token ids for a GGUF model, on top of HF `tokenizers` (built in tokenizer_build.py).

    tok = Tokenizer.from_gguf(GGUFFile(path))
    ids = tok.encode("Hello")            # BOS/EOS added per tokenizer.ggml.add_bos/eos_token
    text = tok.decode(ids)

Rendered chat prompts already contain the template's BOS; encode them with `encode_chat` (adds BOS
only when the model wants one and the text does not start with it) so the prompt never gets two.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from strata.gguf.reader import GGUFFile
from strata.text.tokenizer_build import (
    BYTE,
    CONTROL,
    UNUSED,
    USER_DEFINED,
    BuiltTokenizer,
    build_tokenizer,
    bytes_to_unicode,
)

#: Token texts that end a turn in the chat formats we know (llama.cpp's EOG list, minus
#: format-specific oddities). Only looked up when the token exists in the vocabulary.
END_OF_TURN_TEXTS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
    "<|return|>",
    "<|call|>",
)


_SPLIT_ABOVE = 1 << 16  # characters; shorter texts take a few ms and go through encode in one piece
_PIECE = 1 << 14
_WORD_START = re.compile(r"(?<=\S) (?=[^\W\d_])")  # a space between a non-space and a letter


def _word_splits(text: str, size: int) -> list[tuple[int, int]]:
    """[start, end) pieces of about `size` characters, each cut just before a " word"; a stretch
    with no such place stays whole."""
    out, start = [], 0
    while len(text) - start > size:
        m = _WORD_START.search(text, start + size)
        if m is None:
            break
        out.append((start, m.start()))
        start = m.start()
    out.append((start, len(text)))
    return out


class Tokenizer:
    """A GGUF model's tokenizer: encode/decode plus the special ids generation needs."""

    def __init__(self, built: BuiltTokenizer, meta: Mapping[str, Any]) -> None:
        """Wrap a built backend; `meta` supplies the special ids and add_* flags. Use from_gguf."""
        self._hf = built.backend
        self._tokens: list[str] = built.tokens
        self._types: np.ndarray = built.token_types
        self._byte_level: bool = built.byte_level
        self._lock = threading.Lock()  # encode_special_tokens is backend-wide state
        self._long_backends: dict[bool, Any] = {}  # parse_special -> backend copy (see _encode_long)
        self._piece_bytes: dict[int, bytes] = {}
        self._max_piece_bytes = 0  # computed on first use
        n = len(self._tokens)

        def tok_id(key: str) -> int | None:
            v = meta.get(f"tokenizer.ggml.{key}")
            return int(v) if v is not None and 0 <= int(v) < n else None

        self.bos_id, self.eos_id = tok_id("bos_token_id"), tok_id("eos_token_id")
        self.pad_id, self.unk_id = tok_id("padding_token_id"), tok_id("unknown_token_id")
        # llama.cpp adds BOS to SentencePiece vocabularies that do not say otherwise.
        default_bos = meta.get("tokenizer.ggml.model") == "llama"
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)) and self.bos_id is not None
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and self.eos_id is not None
        eot = {self.eos_id, tok_id("eot_token_id"), tok_id("eom_token_id")}
        ids = self._hf.token_to_id
        eot.update(ids(t) for t in END_OF_TURN_TEXTS)
        self._eot_ids = frozenset(i for i in eot if i is not None)
        self._special = frozenset(np.nonzero(self._types == CONTROL)[0].tolist())

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile | str | os.PathLike[str]) -> Tokenizer:
        """Build from an opened GGUFFile (or a path to one)."""
        if not isinstance(gguf_file, GGUFFile):
            gguf_file = GGUFFile(gguf_file)
        meta = dict(gguf_file.metadata)
        return cls(build_tokenizer(meta, gguf_file.path), meta)

    # ---- properties ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def eot_ids(self) -> frozenset[int]:
        """Ids that end generation: EOS plus end-of-turn tokens (<|im_end|>, <end_of_turn>, ...)."""
        return self._eot_ids

    @property
    def bos_token(self) -> str:
        return self._tokens[self.bos_id] if self.bos_id is not None else ""

    @property
    def eos_token(self) -> str:
        return self._tokens[self.eos_id] if self.eos_id is not None else ""

    @property
    def backend(self) -> Any:
        """The underlying HF `tokenizers.Tokenizer` (for batch APIs; do not mutate)."""
        return self._hf

    @property
    def byte_level(self) -> bool:
        """True for GPT-2 style byte-level vocabularies, False for SentencePiece (byte fallback)."""
        return self._byte_level

    def is_byte_token(self, token_id: int) -> bool:
        """True for SentencePiece byte-fallback pieces such as <0xF0>."""
        return int(self._types[token_id]) == BYTE

    def is_special(self, token_id: int) -> bool:
        """True for CONTROL tokens (BOS/EOS/<|im_end|>...): hidden by decode(skip_special=True)."""
        return token_id in self._special

    def token_id(self, text: str) -> int | None:
        """The id whose vocabulary entry is exactly `text` (as token_text spells it), else None."""
        return self._hf.token_to_id(text)

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry as stored in the GGUF ("Ġhello", "▁hello", "<0x0A>", "<|im_end|>")."""
        return self._tokens[token_id]

    # ---- encode / decode ----------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`.

        add_special: prepend BOS / append EOS as the GGUF's add_bos_token/add_eos_token say.
        parse_special: special-token texts in `text` ("<|im_end|>") become their ids; when False
        they are tokenized as plain text (user-defined tokens such as <think> still match whole,
        as in llama.cpp).
        """
        if len(text) > _SPLIT_ABOVE and self._byte_level:
            ids = self._encode_long(text, parse_special)
        else:
            with self._lock:
                self._hf.encode_special_tokens = not parse_special
                try:
                    ids = self._hf.encode(text, add_special_tokens=False).ids
                finally:
                    self._hf.encode_special_tokens = False
        if add_special:
            if self.add_bos:
                ids.insert(0, self.bos_id)
            if self.add_eos:
                ids.append(self.eos_id)
        return ids

    def _encode_long(self, text: str, parse_special: bool) -> list[int]:
        """Long text as pieces through encode_batch, which (unlike encode) releases the GIL: seconds of
        tokenizing in a worker thread then never stall the event loop. Pieces start at " word" after
        a non-space, where byte-level pre-tokenizers (GPT-2, Llama 3, Qwen) always split, so the ids
        are those of one encode. A private backend copy per mode keeps the shared one's flag untouched."""
        backend = self._long_backends.get(parse_special)
        if backend is None:
            backend = self._hf.from_str(self._hf.to_str())
            backend.encode_special_tokens = not parse_special
            self._long_backends[parse_special] = backend
        pieces = [text[a:b] for a, b in _word_splits(text, _PIECE)]
        return [i for enc in backend.encode_batch(pieces, add_special_tokens=False) for i in enc.ids]

    def encode_chat(self, text: str, literal: Iterable[tuple[int, int]] = ()) -> list[int]:
        """Encode a rendered chat prompt: special texts parsed, BOS added only if missing, never EOS.

        The one BOS rule for chat prompts (the CLI's, the Python API's and the server's): the template's
        own BOS text counts; BOS is prepended only when the GGUF's add_bos_token asks for one and the text
        does not already start with it, so a prompt never carries two. (tests/test_chat_template.py's
        gemma3 test and tests/test_tokenizer.py's test_encode_chat_adds_bos_once hold it.)

        literal: sorted, disjoint [start, end) spans of `text` (a client's own words) whose special
        texts stay plain text, so a message cannot forge "<|im_end|><|im_start|>system" turns.
        """
        ids: list[int] = []
        pos = 0
        for start, end in literal:
            ids += self.encode(text[pos:start], add_special=False, parse_special=True)
            ids += self.encode(text[start:end], add_special=False, parse_special=False)
            pos = end
        ids += self.encode(text[pos:], add_special=False, parse_special=True)
        if self.add_bos and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids

    @property
    def special_texts(self) -> tuple[str, ...]:
        """Texts that parse_special turns into CONTROL token ids ("<|im_end|>", ...), longest first."""
        return tuple(
            sorted((self._tokens[i] for i in self._special if self._tokens[i]), key=len, reverse=True)
        )

    @property
    def max_piece_bytes(self) -> int:
        """UTF-8 length of the longest vocabulary entry: a bound on the text one token can cover
        (entries spell bytes with one or more characters each, never fewer)."""
        if self._max_piece_bytes == 0:
            self._max_piece_bytes = max(len(t.encode("utf-8", "replace")) for t in self._tokens)
        return self._max_piece_bytes

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 (e.g. half an emoji) decodes to U+FFFD."""
        return self._hf.decode(list(ids), skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token contributes to the output (for logprobs / byte-level consumers).

        SentencePiece "▁" counts as a space here, including a leading one that decode() may strip.
        """
        cached = self._piece_bytes.get(token_id)
        if cached is None:
            cached = self._piece_bytes[token_id] = self._compute_bytes(token_id)
        return cached

    def _compute_bytes(self, token_id: int) -> bytes:
        text, kind = self._tokens[token_id], int(self._types[token_id])
        if kind in (CONTROL, USER_DEFINED, UNUSED):
            return text.encode("utf-8", "surrogateescape")
        if self._byte_level:
            if all(c in _BYTE_DECODER for c in text):
                return bytes(_BYTE_DECODER[c] for c in text)
            return text.encode("utf-8", "surrogateescape")
        if kind == BYTE and len(text) == 6 and text.startswith("<0x"):
            return bytes([int(text[3:5], 16)])
        return text.replace("\u2581", " ").encode("utf-8", "surrogateescape")


_BYTE_DECODER: dict[str, int] = {c: b for b, c in bytes_to_unicode().items()}

"""Rendering a chat so that the client's own words stay text.

The template's markup ("<|im_start|>user\\n") is parsed for special tokens; a client's strings
(message content, tool arguments, tool definitions) are not, so "<|im_end|>\\n<|im_start|>system"
typed by a user stays those characters instead of becoming a forged system turn. Strings holding
special text are swapped for ASCII markers before rendering (markers survive templates and tojson
unchanged), then swapped back, which tells exactly which spans of the prompt are the client's.
Prompts without such strings (nearly all) render and tokenize exactly as before.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from strata.text.tokenizer import Tokenizer


class Marks:
    """Client strings that hold special-token text, replaced by markers."""

    def __init__(self, tok: Tokenizer) -> None:
        specials = tok.special_texts
        self._special = re.compile("|".join(re.escape(s) for s in specials)) if specials else None
        self._nonce = secrets.token_hex(4)
        self._marker = re.compile(f"STRATAMARK{self._nonce}N(\\d+)E")
        self.originals: list[str] = []

    def swap(self, obj: Any) -> Any:
        """A copy of obj (messages or tools) with every string value holding special text marked."""
        if isinstance(obj, str):
            if self._special is None or not self._special.search(obj):
                return obj
            self.originals.append(obj)
            return f"STRATAMARK{self._nonce}N{len(self.originals) - 1}E"
        if isinstance(obj, dict):
            return {k: self.swap(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.swap(v) for v in obj]
        return obj

    def restore(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text with the originals back, and the [start, end) spans they occupy."""
        out: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = size = 0
        for m in self._marker.finditer(text):
            out.append(text[pos : m.start()])
            size += m.start() - pos
            original = self.originals[int(m.group(1))]
            spans.append((size, size + len(original)))
            out.append(original)
            size += len(original)
            pos = m.end()
        out.append(text[pos:])
        return "".join(out), spans


def min_tokens(tok: Tokenizer, text: str) -> int:
    """A lower bound on the tokens of `text`, without tokenizing it: no token covers more than
    max_piece_bytes of text (halved again for normalizers that fold characters)."""
    return len(text.encode("utf-8", "replace")) // (2 * tok.max_piece_bytes)

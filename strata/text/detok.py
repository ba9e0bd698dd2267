"""Incremental detokenization for streaming.

Decoding tokens one at a time is wrong in two ways: a character split over several tokens (an
emoji as byte-fallback pieces <0xF0><0x9F>..., or as byte-level pieces) decodes to U+FFFD until
its last byte arrives, and SentencePiece decoders treat the first token of a decode call
specially (a leading "▁" is stripped for add_space_prefix vocabularies). So we decode a sliding
window with one token of left context and emit the difference between "window with the new
tokens" and "window without them" (the prefix/read-offset scheme of HF TGI and vLLM).

When to hold back is decided on bytes, not on a trailing U+FFFD (which may be real output):
* byte-level vocabularies: while the pending bytes end inside a UTF-8 sequence;
* SentencePiece: while the newest token is a <0xNN> piece. HF's ByteFallback decodes a whole
  run of byte pieces at once and turns *every* byte of an invalid run into U+FFFD, so text from
  an open run may still change; a run is final once a non-byte token follows it.

Guarantee: "".join(pushes) + flush() == tokenizer.decode(all_ids, skip_special).
"""

from __future__ import annotations

import codecs

from strata.text.tokenizer import Tokenizer


class StreamDecoder:
    """Turns a stream of token ids into a stream of complete text pieces."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []
        self._prefix = 0  # window start: one token of already-emitted context
        self._read = 0  # ids before this have been emitted
        self._emitted: list[str] = []

    @property
    def token_ids(self) -> list[int]:
        """Every id pushed so far."""
        return self._ids

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is still partial)."""
        self._ids.append(int(token_id))
        if self._holding():
            return ""
        decode = self._tok.decode
        done = decode(self._ids[self._prefix : self._read], self._skip)
        text = decode(self._ids[self._prefix :], self._skip)
        if len(text) <= len(done) or not text.startswith(done):
            return ""  # nothing new yet (a skipped special token, a ▁ the decoder strips)
        piece = text[len(done) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._emitted.append(piece)
        return piece

    def flush(self) -> str:
        """Return whatever is still held back (a trailing partial character becomes U+FFFD)."""
        full = self._tok.decode(self._ids, self._skip)
        sent = "".join(self._emitted)
        # Decoding everything once makes the total exact; the window tail is a fallback that only
        # a decoder which is not prefix-stable could need.
        if full.startswith(sent):
            rest = full[len(sent) :]
        else:
            done = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
            rest = self._tok.decode(self._ids[self._prefix :], self._skip)[len(done) :]
        self._emitted = [sent + rest]
        if self._read < len(self._ids):
            self._prefix, self._read = self._read, len(self._ids)
        return rest

    def _holding(self) -> bool:
        """True while the newest pending bytes may still change (see module docstring)."""
        tok = self._tok
        visible = (i for i in reversed(self._ids[self._read :]) if not (self._skip and tok.is_special(i)))
        if not tok.byte_level:
            last = next(visible, None)
            return last is not None and tok.is_byte_token(last)
        tail = b""
        for i in visible:  # newest first, until we have the 3 bytes an unfinished char can span
            tail = tok.token_bytes(i) + tail
            if len(tail) >= 3:
                break
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        decoder.decode(tail[-3:], final=False)
        return bool(decoder.getstate()[0])  # bytes buffered = a valid but unfinished sequence

"""Build a HF `tokenizers.Tokenizer` from the tokenizer metadata llama.cpp writes into a GGUF.

A GGUF carries no tokenizer.json, only `tokenizer.ggml.*` arrays. We rebuild the pipeline the
model was trained with, mirroring what transformers does for `from_pretrained(gguf_file=...)`
(`transformers/integrations/gguf/gguf_tokenizer_mapping.py`), so ids match that oracle:

* `tokenizer.ggml.model == "gpt2"`: byte-level BPE. The split regex comes from
  `tokenizer.ggml.pre` (PRE_TOKENIZERS below). Where transformers and the model's own
  tokenizer.json disagree we follow tokenizer.json: `smollm`/`starcoder` isolate digits, the
  Qwen family NFC-normalizes, `llama-bpe`/`tekken` use `ignore_merges`. An unknown `pre` is a
  GGUFError rather than a silent fallback, because a wrong split degrades generation quietly.
* `tokenizer.ggml.model == "llama"`: SentencePiece-style BPE with byte fallback. The GGUF has no
  merges, so they are derived from the vocabulary (every split of a token into two vocabulary
  pieces, ranked by the token's score; Gemma ranks by file position like transformers does).
* CONTROL tokens become special added tokens, USER_DEFINED ones plain added tokens, so both are
  matched whole in the input text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import getitem
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from strata.errors import GGUFError

# llama.cpp token types (gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How one `tokenizer.ggml.pre` value splits text before byte-level BPE."""

    split: str = _GPT2_SPLIT
    digits: bool = False  # isolate every digit first (StarCoder/SmolLM vocabularies have no digit merges)
    nfc: bool = False  # Qwen's tokenizer.json NFC-normalizes; llama.cpp does not
    ignore_merges: bool = False  # whole-word vocab hits win over merges (Llama 3, Tekken)


_GPT2 = PreTokenizer()
_STARCODER = PreTokenizer(digits=True)
_LLAMA3 = PreTokenizer(_LLAMA3_SPLIT, ignore_merges=True)
_QWEN2 = PreTokenizer(_QWEN2_SPLIT, nfc=True)
_QWEN2_PLAIN = PreTokenizer(_QWEN2_SPLIT)  # same split; NFC is only known for the Qwen tokenizers

#: `tokenizer.ggml.pre` -> pre-tokenizer. "default" is GPT-2's regex, which is also what
#: transformers applies to any `pre` it does not know.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **dict.fromkeys(("default", "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"), _GPT2),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell", "minerva-7b", "exaone"), _STARCODER),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "midm-2.0", "lfm2"), _LLAMA3),
    "dbrx": PreTokenizer(_LLAMA3_SPLIT),
    "smaug-bpe": PreTokenizer(_LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2),
    **dict.fromkeys(("kormo", "f2llmv2", "megrez", "stablelm2"), _QWEN2_PLAIN),
    "qwen35": PreTokenizer(_QWEN35_SPLIT, nfc=True),
    "tekken": PreTokenizer(_TEKKEN_SPLIT, ignore_merges=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "minimax-m2"), PreTokenizer(_GPT4O_SPLIT)),
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@dataclass
class BuiltTokenizer:
    """The HF backend plus what the wrapper needs to know about the vocabulary."""

    backend: HFTokenizer
    tokens: list[str]
    token_types: np.ndarray
    byte_level: bool


def build_tokenizer(meta: Mapping[str, Any], path: str = "<gguf>") -> BuiltTokenizer:
    """Build the backend tokenizer from `tokenizer.ggml.*` metadata (see module docstring)."""
    model = meta.get("tokenizer.ggml.model")
    if "tokenizer.ggml.tokens" not in meta:
        raise GGUFError(path, "no tokenizer.ggml.tokens: this GGUF has no vocabulary")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = meta.get("tokenizer.ggml.token_type")
    types = np.full(len(tokens), NORMAL, np.int32) if types is None else np.asarray(types, np.int32)
    if len(types) != len(tokens):
        raise GGUFError(path, f"token_type has {len(types)} entries for {len(tokens)} tokens")
    if model == "gpt2":
        backend = _build_byte_level(meta, tokens, types, path)
    elif model == "llama":
        backend = _build_sentencepiece(meta, tokens, types, path)
    else:
        raise GGUFError(path, f"tokenizer.ggml.model={model!r} is not supported (we read 'gpt2' and 'llama')")
    return BuiltTokenizer(backend, tokens, types, model == "gpt2")


# ---- byte-level BPE ('gpt2') ----------------------------------------------------------------
def _build_byte_level(
    meta: Mapping[str, Any], tokens: list[str], types: np.ndarray, path: str
) -> HFTokenizer:
    pre_name = str(meta.get("tokenizer.ggml.pre", "default"))
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise GGUFError(
            path, f"tokenizer.ggml.pre={pre_name!r} is unknown; known: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    spelling = bytes_to_unicode()
    alphabet = frozenset(spelling.values())
    vocab: dict[str, int] = {}
    for i, (tok, kind) in enumerate(zip(tokens, types.tolist())):
        # Vocab entries are stored byte-encoded already. Added tokens spelled outside that alphabet
        # stay as written so they keep their id (transformers drops them instead) and get matched whole.
        if kind not in (CONTROL, USER_DEFINED) and not alphabet.issuperset(tok):
            tok = "".join(spelling[b] for b in tok.encode("utf-8", "surrogateescape"))
        vocab[tok] = i
    merges = _file_merges(meta, path) or []
    try:
        bpe = BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            ignore_merges=pre.ignore_merges,
        )
    except Exception as e:
        raise GGUFError(path, f"tokenizer.ggml.merges do not fit the vocabulary: {e}") from None
    backend = HFTokenizer(bpe)
    steps = [pre_tokenizers.Digits(individual_digits=True)] if pre.digits else []
    if pre.split == _GPT2_SPLIT:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(pre.split), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    backend.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    if pre.nfc:
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    _add_added_tokens(backend, tokens, types, vocab)
    return backend


# ---- SentencePiece-style BPE ('llama') ------------------------------------------------------
def _build_sentencepiece(
    meta: Mapping[str, Any], tokens: list[str], types: np.ndarray, path: str
) -> HFTokenizer:
    arch = str(meta.get("general.architecture", ""))
    gemma = arch.startswith("gemma")
    spelled = tokens
    if gemma:
        # Gemma's converter writes runs of spaces as real spaces; its merges were learned on "▁".
        spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    merges = _file_merges(meta, path)
    derived = merges is None
    if derived:
        # Gemma's scores do not follow its merge order, its file order does (as in transformers).
        scores = meta.get("tokenizer.ggml.scores")
        if gemma or scores is None:
            rank = -np.arange(len(spelled), dtype=np.float64)
        else:
            rank = np.asarray(scores, np.float64)
        merges = derive_merges(spelled, vocab, rank)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = spelled[unk_id] if unk_id is not None and 0 <= unk_id < len(spelled) else None
    bpe_args = {"fuse_unk": True, "unk_token": unk, "byte_fallback": True, "dropout": None}
    try:
        backend = HFTokenizer(BPE(vocab=vocab, merges=merges, **bpe_args))
    except Exception as e:
        if not derived:
            raise GGUFError(path, f"tokenizer.ggml.merges do not fit the vocabulary: {e}") from None
        # derive_merges trusts 64-bit hashes; a collision yields a merge with a piece that is not in
        # the vocabulary, which BPE rejects. Drop those and rebuild (never seen in practice).
        merges = [m for m in merges if m[0] in vocab and m[1] in vocab]
        backend = HFTokenizer(BPE(vocab=vocab, merges=merges, **bpe_args))
    steps: list[Any] = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend.normalizer = normalizers.Replace(" ", "\u2581")
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
        )
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    _add_added_tokens(backend, tokens, types, vocab)
    return backend


def _file_merges(meta: Mapping[str, Any], path: str) -> list[tuple[str, str]] | None:
    """`tokenizer.ggml.merges` as pairs ("a b" per entry; spaces inside pieces are byte-encoded)."""
    raw = meta.get("tokenizer.ggml.merges")
    if raw is None:
        return None
    merges = []
    for m in raw:
        parts = m.split(" ")
        if len(parts) != 2:
            raise GGUFError(path, f"malformed merge {m!r} in tokenizer.ggml.merges")
        merges.append((parts[0], parts[1]))
    return merges


def derive_merges(
    tokens: Sequence[str], vocab: Mapping[str, int], score: np.ndarray
) -> list[tuple[str, str]]:
    """Every split of a vocabulary token into two vocabulary pieces, as BPE merges.

    Ordered like transformers' `generate_merges(vocab, scores)`: token score descending, then
    longer left piece first, then file order. A Python loop over Gemma's 262k tokens (1.2M
    splits) takes over a second, so membership is tested vectorised on 64-bit polynomial hashes
    of every prefix and suffix; the rare tokens longer than the hashed widths use the loop.
    """
    if len(vocab) == len(tokens):  # no duplicate spellings: every index is the dict's own
        canon = np.ones(len(tokens), bool)
    else:
        canon = np.fromiter((vocab.get(t) == i for i, t in enumerate(tokens)), bool, len(tokens))
    lens = np.fromiter(map(len, tokens), np.int64, len(tokens))
    full = np.zeros(len(tokens), np.uint64)
    buckets = []
    lo = -1
    for width in _WIDTHS:  # buckets, so short tokens do not pay for the longest one's width
        idx = np.nonzero((lens > lo) & (lens <= width))[0]
        lo = width
        if len(idx):
            prefix = _prefix_hashes([tokens[i] for i in idx.tolist()], width)
            full[idx] = prefix[np.arange(len(idx)), lens[idx]]
            buckets.append((idx, prefix))
    members = _HashSet(full[lens <= _WIDTHS[-1]])
    rows, cuts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for idx, prefix in buckets:
        r, c = _hashed_splits(prefix, lens[idx], full[idx], canon[idx], members)
        rows.append(idx[r])
        cuts.append(c)
    for i in np.nonzero(canon & (lens > _WIDTHS[-1]))[0].tolist():
        t = tokens[i]
        found = [c for c in range(1, len(t)) if t[:c] in vocab and t[c:] in vocab]
        rows.append(np.full(len(found), i, np.int64))
        cuts.append(np.asarray(found, np.int64))
    row, cut = np.concatenate(rows), np.concatenate(cuts)
    order = np.lexsort((row, -(lens[row] - cut), -cut, -score[row]))
    words = list(map(tokens.__getitem__, row[order].tolist()))
    cut_list = cut[order].tolist()
    # C-level slicing: ~3x faster than a comprehension over 500k pairs.
    lefts = map(getitem, words, map(slice, cut_list))
    rights = map(getitem, words, map(slice, cut_list, repeat(None)))
    return list(zip(lefts, rights))


_WIDTHS = (8, 16, 32)
_MULT = 0x9E3779B97F4A7C15
_POW = np.array([pow(_MULT, k, 1 << 64) for k in range(_WIDTHS[-1] + 1)], np.uint64)
_INV_POW = np.array([pow(pow(_MULT, -1, 1 << 64), k, 1 << 64) for k in range(_WIDTHS[-1] + 1)], np.uint64)


def _prefix_hashes(strings: list[str], width: int) -> np.ndarray:
    """[n, width+1] uint64: column k is the hash of s[:k] (sum of (codepoint+1) * MULT**j, mod 2**64)."""
    n = len(strings)
    # +1 so NUL code points (and numpy's NUL padding) still change the hash with length.
    cp = np.array(strings, dtype=f"U{width}").view(np.uint32).reshape(n, width).astype(np.uint64) + np.uint64(
        1
    )
    out = np.zeros((n, width + 1), np.uint64)
    np.cumsum(cp * _POW[:width], axis=1, out=out[:, 1:])  # uint64 arithmetic wraps mod 2**64
    return out


def _hashed_splits(
    prefix: np.ndarray, lens: np.ndarray, full: np.ndarray, want: np.ndarray, members: _HashSet
) -> tuple[np.ndarray, np.ndarray]:
    """(row, cut) for every split of a `want` row whose prefix and suffix hashes are members."""
    width = prefix.shape[1] - 1
    cut = np.arange(1, width)
    rows, cuts = np.nonzero(want[:, None] & (cut[None, :] < lens[:, None]))
    cuts = cuts + 1
    left = prefix[rows, cuts]
    keep = members.contains(left)
    rows, cuts, left = rows[keep], cuts[keep], left[keep]
    right = (full[rows] - left) * _INV_POW[cuts]  # hash of t[c:], re-based to position 0
    keep = members.contains(right)
    return rows[keep], cuts[keep]


class _HashSet:
    """Open-addressing set of uint64 hashes, probed vectorised (np.searchsorted is several times
    slower). Keys are stored multiplied by an odd constant (a bijection) so the top bits that pick
    the slot are well mixed even for one-character strings; 0 marks empty slots, so the key 0 is
    tracked apart."""

    _MIX = np.uint64(0xD6E8FEB86659FD93)

    def __init__(self, keys: np.ndarray) -> None:
        self.has_zero = bool((keys == 0).any())
        keys = np.sort(keys[keys != 0] * self._MIX)
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        self.bits = max(4, len(keys).bit_length() + 2)  # load factor <= 1/4
        self.shift = np.uint64(64 - self.bits)
        self.mask = (1 << self.bits) - 1
        self.table = np.zeros(1 << self.bits, np.uint64)
        slots = (keys >> self.shift).astype(np.int64)
        pending = np.arange(len(keys))
        while len(pending):
            s, k = slots[pending], keys[pending]
            free = self.table[s] == 0
            self.table[s[free]] = k[free]  # several keys may race for a slot: the last write wins
            lost = self.table[s] != k
            pending = pending[lost]
            slots[pending] = (slots[pending] + 1) & self.mask

    def contains(self, queries: np.ndarray) -> np.ndarray:
        """Boolean membership of each query hash."""
        q = queries * self._MIX
        found = (queries == 0) & self.has_zero
        slots = (q >> self.shift).astype(np.int64)
        active = np.nonzero(queries != 0)[0]
        while len(active):
            stored = self.table[slots[active]]
            hit = stored == q[active]
            found[active[hit]] = True
            active = active[(stored != 0) & ~hit]
            slots[active] = (slots[active] + 1) & self.mask
        return found


def _add_added_tokens(
    backend: HFTokenizer, tokens: list[str], types: np.ndarray, vocab: Mapping[str, int]
) -> None:
    """CONTROL -> special added tokens, USER_DEFINED -> plain added tokens, both matched on raw text."""
    control = [
        AddedToken(tokens[i], normalized=False, special=True)
        for i in np.nonzero(types == CONTROL)[0].tolist()
        if vocab.get(tokens[i]) == i
    ]
    if control:
        backend.add_special_tokens(control)
    user = [
        AddedToken(tokens[i], normalized=False, special=False)
        for i in np.nonzero(types == USER_DEFINED)[0].tolist()
        if vocab.get(tokens[i]) == i
    ]
    if user:
        backend.add_tokens(user)

"""Qwen4-Exp PLE n-gram hashing, in exact 64-bit integer arithmetic.

For every token the n-gram of order m (2..n) is the token and the m-1 before it. Its hash is
    x = tok_0 * mult_0  ^  tok_1 * mult_1  ^ ... ^ tok_{m-1} * mult_{m-1}     (int64, wrapping)
where tok_s is the token s places back, and head j of that order looks up row
    offset_j + (x mod vocab_j)        (floor mod: a non-negative remainder, vocab_j prime)
in one table shared by all heads. A token s places back that lies before the previous EOS (or
before the start of the sequence) is replaced by EOS, so n-grams never straddle documents.
transformers does this in torch int64 (two's complement wrap-around); numpy uint64 multiplies and
xors wrap identically, and the bits are reinterpreted as int64 before the mod.
"""

from __future__ import annotations

import numpy as np

# Up to this many tokens (decode steps, a few rows a pass) the rows come from Python ints: numpy's ~20 calls
# cost ~50 us whatever the length, the integer loop ~3 us a token.
SCALAR_TOKENS = 8
MASK64 = (1 << 64) - 1


def shifted_tokens(seq: np.ndarray, shift: int, eos: int) -> np.ndarray:
    """seq [L] shifted right by `shift`, EOS wherever the source is before the last EOS or the start."""
    if shift == 0:
        return seq
    pos = np.arange(len(seq))
    eos_at = np.where(seq == eos, pos, -1)
    last_eos_before = np.concatenate([[-1], np.maximum.accumulate(eos_at)[:-1]])  # strictly before p
    src = pos - shift
    valid = (src > last_eos_before) & (src >= 0)
    return np.where(valid, seq[np.maximum(src, 0)], eos).astype(np.int64)


def ngram_hashes(seq: np.ndarray, multipliers: np.ndarray, eos: int) -> list[np.ndarray]:
    """Hashes [L] int64 of the n-grams ending at each position of seq, for orders 2..n."""
    n = len(multipliers)
    mult = np.asarray(multipliers).astype(np.uint64)
    prods = [shifted_tokens(seq, s, eos).astype(np.int64).view(np.uint64) * mult[s] for s in range(n)]
    out, acc = [], prods[0]
    for order in range(2, n + 1):
        acc = acc ^ prods[order - 1]
        out.append(acc.view(np.int64))
    return out


def ngram_rows(
    history: np.ndarray,
    tokens: np.ndarray,
    multipliers: np.ndarray,
    vocab_sizes: np.ndarray,
    offsets: np.ndarray,
    heads_per_ngram: int,
    eos: int,
) -> np.ndarray:
    """Table rows [T, n_heads] for `tokens`, continuing after `history` (the previous n-1 ids).

    Heads are ordered by n-gram order, then head: [order 2: h0..h_{k-1}, order 3: ..., ...].
    """
    t = len(tokens)
    if t <= SCALAR_TOKENS:
        seq_ = [*np.asarray(history, np.int64).tolist(), *np.asarray(tokens, np.int64).tolist()]
        mult = np.asarray(multipliers).astype(np.uint64).tolist()
        vocab_, off_ = np.asarray(vocab_sizes).tolist(), np.asarray(offsets).tolist()
        return _rows_scalar(seq_, t, mult, vocab_, off_, heads_per_ngram, eos)
    seq = np.concatenate([np.asarray(history, np.int64), np.asarray(tokens, np.int64)])
    vocab = np.asarray(vocab_sizes).astype(np.int64)
    off = np.asarray(offsets).astype(np.int64)
    cols = []
    for i, x in enumerate(ngram_hashes(seq, multipliers, eos)):
        heads = slice(i * heads_per_ngram, (i + 1) * heads_per_ngram)
        cols.append(np.mod(x[-t:, None], vocab[None, heads]) + off[None, heads])  # [T, k]
    return np.concatenate(cols, axis=1)


def _rows_scalar(
    seq: list[int], t: int, mult: list[int], vocab: list[int], offsets: list[int], k: int, eos: int
) -> np.ndarray:
    """ngram_rows of the last t positions of seq, one position at a time: walking back from a position, the
    first EOS met (the token itself excepted) and all before it read as EOS, as shifted_tokens' rule."""
    n = len(mult)
    out = np.empty((t, (n - 1) * k), np.int64)
    for r, p in enumerate(range(len(seq) - t, len(seq))):
        x, blocked, row = (seq[p] * mult[0]) & MASK64, False, out[r]
        for s in range(1, n):
            src = p - s
            if blocked or src < 0:
                tok = eos
            else:
                tok = seq[src]
                blocked = tok == eos
            x ^= (tok * mult[s]) & MASK64
            signed = x - (1 << 64) if x >> 63 else x
            for j in range((s - 1) * k, s * k):
                row[j] = signed % vocab[j] + offsets[j]  # Python's % is the floor mod, as np.mod
    return out

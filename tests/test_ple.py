"""PLE n-gram hashing and table gathering (qwen4exp).

The hash must be bit-exact: one wrong row is a different embedding. It is checked against a plain
Python-int transcription of transformers' Qwen4ExpTextNGramEmbedding (wrap to signed 64 bits, floor
mod), and against the torch module itself, on ids that overflow int64 products.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.blocks.ngram_hash import SCALAR_TOKENS, ngram_rows, shifted_tokens
from strata.blocks.ple import TABLE, embeddings
from strata.gguf import GGUFFile
from strata.gguf.names import Keys
from strata.tiers.tables import TableReader

EOS = 7
MULT = np.array([2888661069073, 9952268366771, 10840069598351], dtype=np.uint64)  # the tiny model's
VOCAB = np.array([3001, 3011, 3019, 3023], dtype=np.int64)
OFFSETS = np.array([0, 3001, 6012, 9031], dtype=np.int64)
MASK64 = (1 << 64) - 1


# ------------------------------------------------------------------ Python-int transcription


def _signed(x: int) -> int:
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


def ref_rows(
    seq: list[int], n_out: int, mult: list[int], vocab: list[int], offsets: list[int], k: int, eos: int
) -> list[list[int]]:
    """Rows of the last n_out positions of seq, computed position by position in Python ints."""
    n = len(mult)
    out = []
    for p in range(len(seq) - n_out, len(seq)):
        last_eos = max([i for i in range(p) if seq[i] == eos], default=-1)
        toks = [seq[p - s] if (p - s > last_eos and p - s >= 0) else eos for s in range(n)]
        row = []
        for order in range(2, n + 1):
            x = 0
            for s in range(order):
                x ^= (toks[s] * mult[s]) & MASK64  # int64 multiply wraps; xor on the same bits
            x = _signed(x)
            for j in range((order - 2) * k, (order - 1) * k):
                row.append(x % vocab[j] + offsets[j])  # Python % is floor mod, like torch.remainder
        out.append(row)
    return out


def _random_ids(rng: np.random.Generator, n: int, huge: bool) -> np.ndarray:
    if not huge:
        ids = rng.integers(0, 151669, n)
    else:  # values near 2^63 make every product overflow int64
        ids = (np.int64(2**62) + rng.integers(0, 2**62, n, dtype=np.int64)).astype(np.int64)
        ids[rng.integers(0, n, 3)] = np.iinfo(np.int64).max
    ids[rng.random(n) < 0.15] = EOS
    return ids.astype(np.int64)


@pytest.mark.parametrize("huge", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_match_python_int_transcription(seed: int, huge: bool) -> None:
    rng = np.random.default_rng(seed)
    ids = _random_ids(rng, 40, huge)
    history = np.full(2, EOS, np.int64)
    got = ngram_rows(history, ids, MULT, VOCAB, OFFSETS, 2, EOS)
    want = ref_rows(
        [EOS, EOS, *ids.tolist()], len(ids), MULT.tolist(), VOCAB.tolist(), OFFSETS.tolist(), 2, EOS
    )
    np.testing.assert_array_equal(got, np.array(want))
    assert (got >= OFFSETS).all() and (got < OFFSETS + VOCAB).all()


@pytest.mark.parametrize("huge", [False, True])
def test_decode_steps_match_python_int_transcription(huge: bool) -> None:
    """Passes of up to SCALAR_TOKENS tokens take the integer loop, not numpy: the same rows, EOS and
    overflowing products included."""
    rng = np.random.default_rng(7)
    ids = _random_ids(rng, 60, huge)
    seq = [EOS, EOS, *ids.tolist()]
    history, pos = np.full(2, EOS, np.int64), 0
    for n in (1, 1, 2, 1, SCALAR_TOKENS, 3, 1):
        piece = ids[pos : pos + n]
        got = ngram_rows(history, piece, MULT, VOCAB, OFFSETS, 2, EOS)
        want = ref_rows(seq[: 2 + pos + n], n, MULT.tolist(), VOCAB.tolist(), OFFSETS.tolist(), 2, EOS)
        np.testing.assert_array_equal(got, np.array(want))
        history, pos = np.concatenate([history, piece])[-2:], pos + n


def test_incremental_equals_one_shot() -> None:
    """Feeding tokens in pieces with the n-1 token history == hashing the whole sequence."""
    rng = np.random.default_rng(3)
    ids = _random_ids(rng, 50, False)
    whole = ngram_rows(np.full(2, EOS, np.int64), ids, MULT, VOCAB, OFFSETS, 2, EOS)
    history, parts = np.full(2, EOS, np.int64), []
    for a, b in ((0, 1), (1, 2), (2, 9), (9, 10), (10, 50)):
        parts.append(ngram_rows(history, ids[a:b], MULT, VOCAB, OFFSETS, 2, EOS))
        history = np.concatenate([history, ids[a:b]])[-2:]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


# ------------------------------------------------------------------ against the torch module


def _torch_module(vocab: int):  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    from transformers.models.qwen4_exp import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextNGramEmbedding

    cfg = Qwen4ExpTextConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_experts=4,
        num_experts_per_tok=2,
        ple_layer_ids=[1],
        ple_embed_dim=64,
        ngram_size=3,
        heads_per_ngram=2,
        ngram_vocab_size_base=3000,
        eos_token_id=EOS,
    )
    mod = Qwen4ExpTextNGramEmbedding(cfg, 64, layer_idx=0, ple_layer_index=0)
    with torch.no_grad():  # column 0 of every row holds the row's own index, exactly (< 2^24)
        mod.ngram_embedding.weight.zero_()
        mod.ngram_embedding.weight[:, 0] = torch.arange(
            mod.ngram_embedding.weight.shape[0], dtype=torch.float32
        )
    return torch, mod


@pytest.mark.parametrize("huge", [False, True])
def test_rows_match_transformers_module(huge: bool) -> None:
    torch, mod = _torch_module(151669)
    rng = np.random.default_rng(11)
    ids = _random_ids(rng, 64, huge)
    with torch.no_grad():
        emb = mod(torch.from_numpy(ids)[None], None)[0]  # [T, heads * 16]
    want = emb[:, ::16].to(torch.int64).numpy()
    mult = mod.layer_multipliers.numpy().astype(np.uint64)
    got = ngram_rows(
        np.full(2, EOS, np.int64),
        ids,
        mult,
        mod.ngram_heads_vocab_sizes.numpy(),
        mod.ngram_heads_offsets.numpy(),
        2,
        EOS,
    )
    np.testing.assert_array_equal(got, want)


def test_eos_shift_matches_transformers() -> None:
    torch, mod = _torch_module(151669)
    rng = np.random.default_rng(12)
    seq = _random_ids(rng, 80, False)
    seq[:3] = EOS
    seq[40:42] = EOS
    for shift in range(3):
        want = mod._shift_right_ignore_eos(torch.from_numpy(seq)[None], shift)[0].numpy()
        np.testing.assert_array_equal(shifted_tokens(seq, shift, EOS), want)


def test_gguf_constants_match_transformers() -> None:
    """The converter's ple.* keys equal what transformers derives from the config (seed, primes)."""
    pytest.importorskip("torch")
    from flagship_checks import build
    from oracle import flagship
    from transformers.models.qwen4_exp import modeling_qwen4_exp as m

    g = GGUFFile(build(flagship.tiny_qwen4exp)["f32"])
    cfg = flagship.qwen4exp_config()
    want = m._build_layer_multipliers(cfg["vocab_size"], cfg["ngram_size"], 0, cfg["seed"]).tolist()
    assert [int(x) for x in g.arch_get(Keys.PLE_LAYER_MULTIPLIERS)] == want
    sizes = [int(x) for x in g.arch_get(Keys.PLE_HEAD_VOCAB_SIZES)]
    assert sizes == [
        m._find_nth_prime_after(cfg["ngram_vocab_size_base"] - 1, j + 1) for j in range(len(sizes))
    ]
    assert all(m._is_prime(s) for s in sizes)
    assert [int(x) for x in g.arch_get(Keys.PLE_HEAD_OFFSETS)] == list(np.cumsum([0, *sizes[:-1]]))


# ------------------------------------------------------------------ gathering


class _RecordingRows:
    """Stands in for the table's mmap view and records which rows were asked for."""

    def __init__(self, raw: np.ndarray) -> None:
        self.raw, self.asked = raw, []

    def __getitem__(self, idx):  # type: ignore[no-untyped-def]
        idx = np.asarray(idx)
        assert idx.dtype.kind == "i", "the table may only be indexed by explicit row ids"
        self.asked.append(idx.copy())
        return self.raw[idx]

    def __array__(self, *a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the whole PLE table was materialised")


def test_gather_reads_only_needed_rows() -> None:
    from flagship_checks import build
    from oracle import flagship

    g = GGUFFile(build(flagship.tiny_qwen4exp)["f32"])
    real = g.raw(TABLE)
    rec = _RecordingRows(real)
    g.raw = lambda name: rec if name == TABLE else real  # type: ignore[method-assign]
    rows = np.array([[0, 3001, 6012, 9031], [5, 3005, 6100, 12053]])
    table = TableReader(g, TABLE, "mmap")
    emb = embeddings(table, table.gather(rows, 2), 2)
    stats = table.stats
    np.testing.assert_array_equal(np.concatenate(rec.asked), rows.reshape(-1))
    values = real.view(np.float32)  # f32 table: the bytes are the values
    np.testing.assert_array_equal(emb, values[rows.reshape(-1)].reshape(2, -1))
    row_bytes = g.tensors[TABLE].row_bytes
    assert (stats.tokens, stats.rows, stats.bytes) == (2, 8, 8 * row_bytes)
    assert stats.per_token() == (4.0, 4.0 * row_bytes)

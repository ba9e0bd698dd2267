"""Router weights (ffn_gate_inp) with Zipf-like expert popularity, and a cache hit-rate estimator.

Legend: N = sampled tokens, D = hidden size, E = experts, A = active experts per token (top-k).

The skew lives in the row norms. Router row e is sigma * s_e * u_e with u_e a random unit vector, so
for a random hidden state h ~ N(0, I_D) (what an RMS-normed state looks like to a random router)
u_e . h is N(0, 1) and expert e's logit is N(0, (sigma s_e)^2): a wider logit wins top-k more often.
Target inclusion rate (fraction of tokens routed to it) of the expert of popularity rank r:

    q_r = min(q_max, c * r^-S),   c such that sum_r q_r = A,   q_max = max(0.45, A / E)

so routed picks follow a Zipf law with exponent S (S = 0: uniform), except at the head, which is
capped: an expert serves a token at most once, and with symmetric logits even an infinitely wide
expert wins only when its logit is positive (q -> 1/2). The scales solve q_r = P(logit_r > tau):

    s_r = tau / z(q_r),   z(q) = the standard normal quantile exceeded with probability q,

where tau (the A-th largest logit, nearly constant for large E) is a free overall scale, set here
so that the rms of s is 1. Because sum_r q_r = A, the expected number of logits above tau is A,
which is what makes tau the top-k threshold; sampling puts measured rates within a few percent of
q_r (tests/test_synth.py). Each layer shuffles which expert gets which scale, as real popular
experts differ by layer.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

LOGIT_STD = 1.0  # sigma: rms router logit std for a unit-RMS hidden state
Q_MAX = 0.45


def target_inclusion(n_expert: int, top_k: int, skew: float) -> np.ndarray:
    """q_r [E], descending: the fraction of tokens that should route to the rank-r expert."""
    ranks = np.arange(1, n_expert + 1, dtype=np.float64)
    zipf = ranks**-skew
    q_max = max(Q_MAX, top_k / n_expert)
    lo, hi = 0.0, top_k / zipf[-1]  # bisect c: sum(min(q_max, c * zipf)) is increasing in c
    for _ in range(100):
        c = 0.5 * (lo + hi)
        lo, hi = (c, hi) if np.minimum(q_max, c * zipf).sum() < top_k else (lo, c)
    return np.minimum(q_max, hi * zipf)


def expected_hit_rate(n_expert: int, top_k: int, skew: float, cache_fraction: float) -> float:
    """The design value of hit_rate: share of routed picks that go to the top cache_fraction experts."""
    q = target_inclusion(n_expert, top_k, skew)
    return float(q[: min(n_expert, math.ceil(cache_fraction * n_expert))].sum() / q.sum())


def topk_ids(logits: np.ndarray, top_k: int) -> np.ndarray:
    """Ids [N, A] of each row's top_k logits (softmax top-k picks the same set)."""
    return np.argpartition(-logits, top_k - 1, axis=1)[:, :top_k]


def _inclusion(logits: np.ndarray, top_k: int) -> np.ndarray:
    return np.bincount(topk_ids(logits, top_k).ravel(), minlength=logits.shape[1]) / logits.shape[0]


def popularity_scales(n_expert: int, top_k: int, skew: float) -> np.ndarray:
    """s_r [E] in rank order (rms 1): logit std multipliers that meet target_inclusion."""
    z = NormalDist().inv_cdf
    q = target_inclusion(n_expert, top_k, skew)
    s = np.array([1.0 / z(1.0 - float(x)) if x < 0.5 else 1.0 for x in q])
    if top_k * 2 >= n_expert:  # q >= 1/2 everywhere: no threshold to place, keep it uniform
        s[:] = 1.0
    return s / np.sqrt(np.mean(s**2))


def router_weights(
    d_model: int, n_expert: int, top_k: int, skew: float, rng: np.random.Generator
) -> np.ndarray:
    """float32 [E, D] (GGUF ne [D, E]) router with the popularity law above; rows shuffled by `rng`."""
    scales = popularity_scales(n_expert, top_k, skew)[rng.permutation(n_expert)]
    u = rng.standard_normal((n_expert, d_model), dtype=np.float32)  # [E, D]
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return (u * (LOGIT_STD * scales)[:, None]).astype(np.float32)


def _hidden(n_tokens: int, d_model: int, seed: int) -> np.ndarray:
    """Random unit-RMS hidden states h ~ N(0, I), [N, D]."""
    return np.random.default_rng(seed).standard_normal((n_tokens, d_model), dtype=np.float32)


def _hit_rate(
    router: np.ndarray, top_k: int, cache_fraction: float, h_rank: np.ndarray, h_eval: np.ndarray
) -> float:
    n_cached = min(router.shape[0], math.ceil(cache_fraction * router.shape[0]))
    ranked = np.argsort(-_inclusion(h_rank @ router.T, top_k))
    held_out = _inclusion(h_eval @ router.T, top_k)
    return float(held_out[ranked[:n_cached]].sum() / held_out.sum())


def hit_rate(
    router: np.ndarray, top_k: int, cache_fraction: float, n_tokens: int = 4096, seed: int = 0
) -> float:
    """Share of routed (token, expert) picks served by caching the most popular experts of `router` [E, D].

    The cache holds the ceil(cache_fraction * E) experts most popular on one sample of random hidden
    states; the rate is measured on a second, independent sample (no credit for fitting noise).
    """
    d = router.shape[1]
    return _hit_rate(
        router, top_k, cache_fraction, _hidden(n_tokens, d, seed), _hidden(n_tokens, d, seed + 1)
    )


def file_hit_rate(path: str, cache_fraction: float, n_tokens: int = 4096, seed: int = 0) -> float:
    """hit_rate averaged over the layers of a GGUF's routers (blk.N.ffn_gate_inp.weight).

    Each layer caches its own top experts; the layers share one pair of hidden-state samples (their
    routers are independent, so this costs no accuracy and saves most of the time).
    """
    from strata.gguf import GGUFFile
    from strata.gguf.names import Keys, T, tensor
    from strata.quants import dequantize

    g = GGUFFile(path)
    top_k = int(g.arch_get(Keys.EXPERT_USED_COUNT))
    d = int(g.arch_get(Keys.EMBEDDING_LENGTH))
    h_rank, h_eval = _hidden(n_tokens, d, seed), _hidden(n_tokens, d, seed + 1)
    rates = []
    for layer in range(int(g.arch_get(Keys.BLOCK_COUNT))):
        info = g.tensors[tensor(T.FFN_GATE_INP, layer)]
        router = dequantize(g.raw(info.name), info.qtype, info.shape[-1])  # [E, D]
        rates.append(_hit_rate(router, top_k, cache_fraction, h_rank, h_eval))
    return float(np.mean(rates))

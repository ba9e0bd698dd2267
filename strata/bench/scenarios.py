"""The load scenarios: the concurrency sweep, prompt sizes, one long generation, prefill interference and
prefix reuse. Each returns its rows; a row that spans time carries t0 / t1 (perf_counter) and its tokens,
from which the runner adds joules per token when the GPU's power is known."""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from strata.bench.client import stream_chat
from strata.bench.stats import Stream, percentile, windowed_rates
from strata.conf.bench import BenchConfig

Row = dict[str, Any]
QUESTIONS = [
    "Explain how a rainbow forms.",
    "Write a short poem about the sea.",
    "What is a prime number?",
    "Describe the water cycle.",
    "Why is the sky blue?",
    "How do plants make food?",
]


class Skipped(Exception):
    """The scenario cannot run against this server; the message says why."""


@dataclass(slots=True)
class Bench:
    c: httpx.AsyncClient
    cfg: BenchConfig
    n_ctx: int | None  # the server's context, when it says
    seen: list[Stream] = field(default_factory=list)  # every request, for the client's overhead per chunk

    async def chat(self, body: dict[str, Any]) -> Stream:
        s = await stream_chat(self.c, body)
        self.seen.append(s)
        return s


def ask(content: Any, max_tokens: int, seed: int = 1, **extra: Any) -> dict[str, Any]:
    """A chat body; ignore_eos (llama-server's extension) keeps every request at its max_tokens."""
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": seed,
        "ignore_eos": True,
        **extra,
    }


def row(s: Stream, **keys: Any) -> Row:
    return {**keys, **s.summary(), "t0": s.sent, "t1": s.stamps[-1] if s.stamps else s.sent}


async def text_of(c: httpx.AsyncClient, phrase: str, n_tokens: int) -> str:
    """Exactly n_tokens of repeated `phrase`, measured with the server's own tokenizer."""
    r = await c.post("/tokenize", json={"content": phrase * (n_tokens // 2 + 1)})
    if r.status_code != 200:
        raise Skipped(f"POST /tokenize answered {r.status_code}: prompts of a given size need it")
    toks = r.json()["tokens"][:n_tokens]
    return str((await c.post("/detokenize", json={"tokens": toks})).json()["content"])


def fits(b: Bench, prompt: int, gen: int) -> bool:
    return b.n_ctx is None or prompt + gen + 32 <= b.n_ctx  # 32: the chat template's own tokens


async def concurrency(b: Bench) -> list[Row]:
    """n requests at once for each level: per-request decode rate, aggregate rate, TTFT and gaps."""
    rows = []
    for n in b.cfg.concurrency:
        t0 = time.perf_counter()
        streams = await asyncio.gather(
            *(b.chat(ask(QUESTIONS[i % len(QUESTIONS)], b.cfg.tokens, seed=i)) for i in range(n))
        )
        t1 = time.perf_counter()
        ok = [s for s in streams if s.error is None]
        ttfts, gaps = [s.ttft for s in ok], [g for s in ok for g in s.gaps]
        rows.append(
            {
                "concurrency": n,
                "failures": n - len(ok),
                "decode_tok_s": statistics.mean(s.decode_tok_s for s in ok) if ok else 0.0,
                "aggregate_tok_s": sum(s.tokens for s in ok) / (t1 - t0),
                "ttft_p50_s": percentile(ttfts, 0.5),
                "ttft_p99_s": percentile(ttfts, 0.99),
                "itl_p50_ms": percentile(gaps, 0.5) * 1e3,
                "itl_p99_ms": percentile(gaps, 0.99) * 1e3,
                "tokens": sum(s.tokens for s in ok),
                "t0": t0,
                "t1": t1,
                "requests": [s.summary() for s in streams],
            }
        )
    return rows


async def context(b: Bench) -> list[Row]:
    """One request per prompt size, each behind a unique tag so no prefix cache answers for it."""
    sizes = [n for n in b.cfg.contexts if fits(b, n, b.cfg.tokens)]
    if not sizes:
        raise Skipped(f"no prompt size of {b.cfg.contexts} fits the server's n_ctx {b.n_ctx}")
    rows = []
    for n in sizes:
        body = f"[{secrets.token_hex(4)}] " + await text_of(
            b.c, "the quick brown fox jumps over the lazy dog ", n
        )
        s = await b.chat(ask(body + "\nSummarise in one line.", b.cfg.tokens))
        rows.append(row(s, prompt_size=n, prefill_tok_s=s.prompt_tokens / s.ttft if s.stamps else 0.0))
    return rows


async def long(b: Bench) -> list[Row]:
    """One long generation, and its rate over windows of it: a rate that decays shows here."""
    n = b.cfg.long_tokens if fits(b, 16, b.cfg.long_tokens) else max(2, (b.n_ctx or 0) - 64)
    s = await b.chat(ask("Write a long story about a lighthouse keeper.", n))
    rates = windowed_rates(s.stamps, max(8, n // 16))
    return [
        row(
            s,
            max_tokens=n,
            window_tok_s_min=min(rates, default=0.0),
            window_tok_s_p50=percentile(rates, 0.5),
            window_tok_s_max=max(rates, default=0.0),
        )
    ]


async def prefill(b: Bench) -> list[Row]:
    """Decode rate of 3 running streams alone, then while a long prompt is read beside them; the long
    prompt's TTFT and prompt rate against a prompt of the same length read alone (issue 15's three promises:
    the streams keep half their pace, the TTFT stays within 2x of solo, the prompt goes at 70% of its solo
    rate)."""
    n = min(b.cfg.long_prompt, (b.n_ctx or b.cfg.long_prompt + 64) - 64)
    solo = await asyncio.gather(*(b.chat(ask(q, b.cfg.tokens)) for q in QUESTIONS[:3]))
    base = statistics.mean(s.decode_tok_s for s in solo)

    async def long_prompt() -> Stream:  # a fresh prefix each time: no prefix-cache hit
        text = f"[{secrets.token_hex(4)}] " + await text_of(b.c, "alpha beta gamma delta ", n)
        return await b.chat(ask(text + "\nSummarise.", 4))

    alone = await long_prompt()
    runners = [asyncio.create_task(b.chat(ask(q, b.cfg.tokens * 4))) for q in QUESTIONS[:3]]
    await asyncio.sleep(1.0)
    lng = await long_prompt()
    runs = await asyncio.gather(*runners)
    t_first = lng.stamps[0] if lng.stamps else time.perf_counter()
    during = []
    for s in runs:  # the runners' chunks while the long prompt was being read
        inside = [t for t in s.stamps if lng.sent <= t <= t_first]
        if len(inside) > 1:
            during.append((len(inside) - 1) / (inside[-1] - inside[0]))
    rate = statistics.mean(during) if during else 0.0
    solo_rate = alone.prompt_tokens / alone.ttft if alone.ttft else 0.0
    beside_rate = lng.prompt_tokens / lng.ttft if lng.ttft else 0.0
    return [
        {
            "long_prompt_tokens": lng.prompt_tokens,
            "solo_decode_tok_s": base,
            "decode_tok_s_during_prefill": rate,
            "kept_fraction": rate / base if base else 0.0,
            "solo_long_ttft_s": alone.ttft,
            "long_ttft_s": lng.ttft,
            "ttft_x_solo": lng.ttft / alone.ttft if alone.ttft else 0.0,
            "prompt_tok_s": beside_rate,
            "prompt_rate_of_solo": beside_rate / solo_rate if solo_rate else 0.0,
            "error": lng.error or alone.error or next((s.error for s in runs if s.error), None),
        }
    ]


async def prefix(b: Bench) -> list[Row]:
    """TTFT of a long prompt, then of the same prompt again (the prefix cache's gain)."""
    n = min(b.cfg.long_prompt, (b.n_ctx or b.cfg.long_prompt + 64) - 64)
    text = f"[{secrets.token_hex(4)}] " + await text_of(b.c, "lorem ipsum dolor sit amet ", n) + "\nOne word?"
    first = await b.chat(ask(text, 4))
    again = await b.chat(ask(text, 4))
    return [
        {
            "prompt_tokens": first.prompt_tokens,
            "first_ttft_s": first.ttft,
            "repeat_ttft_s": again.ttft,
            "repeat_cached_tokens": again.cached_tokens,
            "speedup": first.ttft / again.ttft if again.stamps and first.stamps else 0.0,
            "error": first.error or again.error,
        }
    ]

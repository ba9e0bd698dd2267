"""Serving benchmark: an asyncio streaming client that timestamps every token.

For each concurrency level it fires that many chat requests at once and reports per-request
decode tok/s (from token timestamps: (n-1) / (t_last - t_first), not tokens / total time),
aggregate tok/s, TTFT p50/p95 and failures; then two scenarios: decode rate of running streams
while a long prompt prefills, and TTFT of a repeated long prompt (prefix cache).

    python perf/bench_serve.py [--model PATH | --url URL --api-key K] [--levels 1,2,4,8,16]
                               [--tokens 32] [--long-prompt 2048] [--out perf/out]
Writes a markdown table and a PNG plot into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

QUESTIONS = ["Explain how a rainbow forms.", "Write a short poem about the sea.", "What is a prime number?",
             "Describe the water cycle.", "Why is the sky blue?", "How do plants make food?"]


@dataclass
class Sample:
    sent: float
    stamps: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.sent if self.stamps else float("nan")

    @property
    def decode_rate(self) -> float:
        if len(self.stamps) < 2 or self.stamps[-1] <= self.stamps[0]:
            return 0.0
        return (len(self.stamps) - 1) / (self.stamps[-1] - self.stamps[0])


async def stream_one(c: httpx.AsyncClient, content: str, tokens: int) -> Sample:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": tokens, "temperature": 0.7,
            "stream": True, "ignore_eos": True, "seed": 1}
    s = Sample(time.perf_counter())
    try:
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return s
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    s.error = ev["error"]["message"]
                elif ev["choices"] and ev["choices"][0]["delta"].get("content"):
                    s.stamps.append(time.perf_counter())
    except httpx.HTTPError as e:
        s.error = type(e).__name__
    if not s.stamps and s.error is None:
        s.error = "no tokens"
    return s


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


async def level(c: httpx.AsyncClient, n: int, tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    samples = await asyncio.gather(*(stream_one(c, QUESTIONS[i % len(QUESTIONS)], tokens) for i in range(n)))
    wall = time.perf_counter() - t0
    ok = [s for s in samples if s.error is None]
    return {
        "concurrency": n,
        "per_request_tok_s": statistics.mean(s.decode_rate for s in ok) if ok else 0.0,
        "aggregate_tok_s": sum(len(s.stamps) for s in ok) / wall,
        "ttft_p50_s": pct([s.ttft for s in ok], 0.5),
        "ttft_p95_s": pct([s.ttft for s in ok], 0.95),
        "failures": len(samples) - len(ok),
    }


async def text_of(c: httpx.AsyncClient, phrase: str, n_tokens: int) -> str:
    """Exactly n_tokens of repeated `phrase`, measured with the server's own tokenizer."""
    toks = (await c.post("/tokenize", json={"content": phrase * (n_tokens // 2 + 1)})).json()["tokens"]
    return (await c.post("/detokenize", json={"tokens": toks[:n_tokens]})).json()["content"]


async def prefill_interference(c: httpx.AsyncClient, long_tokens: int, tokens: int) -> dict[str, float]:
    """Decode rate of 3 running streams before and while a long prompt is prefilled."""
    solo = await asyncio.gather(*(stream_one(c, q, tokens) for q in QUESTIONS[:3]))
    base = statistics.mean(s.decode_rate for s in solo)
    runners = [asyncio.create_task(stream_one(c, q, tokens * 4)) for q in QUESTIONS[:3]]
    await asyncio.sleep(1.0)
    long_text = await text_of(c, "alpha beta gamma delta ", long_tokens)
    long = asyncio.create_task(stream_one(c, long_text + "\nSummarise.", 4))
    runs = await asyncio.gather(*runners)
    lng = await long
    t_first = lng.stamps[0] if lng.stamps else time.perf_counter()
    during = []
    for s in runs:  # tokens the runners produced while the long prompt was being read
        inside = [t for t in s.stamps if lng.sent <= t <= t_first]
        if len(inside) > 1:
            during.append((len(inside) - 1) / (inside[-1] - inside[0]))
    rate = statistics.mean(during) if during else 0.0
    return {"long_prompt_tokens": long_tokens, "solo_decode_tok_s": base, "decode_tok_s_during_prefill": rate,
            "kept_fraction": rate / base if base else 0.0, "long_ttft_s": lng.ttft if lng.stamps else float("nan")}


async def prefix_reuse(c: httpx.AsyncClient, long_tokens: int) -> dict[str, float]:
    text = await text_of(c, "lorem ipsum dolor sit amet ", long_tokens) + "\nOne-word summary?"
    first = await stream_one(c, text, 4)
    second = await stream_one(c, text, 4)
    for s in (first, second):
        if s.error:
            print(f"prefix reuse: request failed: {s.error}", file=sys.stderr)
    return {"first_ttft_s": first.ttft, "repeat_ttft_s": second.ttft, "speedup": first.ttft / second.ttft}


def write_report(out: Path, rows: list[dict[str, float]], extra: dict[str, dict[str, float]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in cols) + " |"
              for r in rows]
    for name, d in extra.items():
        lines += ["", f"**{name}**: " + ", ".join(f"{k}={v:.3f}" for k, v in d.items())]
    (out / "bench_serve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    xs = [r["concurrency"] for r in rows]
    ax[0].plot(xs, [r["per_request_tok_s"] for r in rows], "o-", label="per request")
    ax[0].plot(xs, [r["aggregate_tok_s"] for r in rows], "s-", label="aggregate")
    ax[0].set(xscale="log", xlabel="concurrency", ylabel="decode tok/s", title="throughput")
    ax[0].legend()
    ax[1].plot(xs, [r["ttft_p50_s"] for r in rows], "o-", label="p50")
    ax[1].plot(xs, [r["ttft_p95_s"] for r in rows], "s-", label="p95")
    ax[1].set(xscale="log", xlabel="concurrency", ylabel="seconds", title="time to first token")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(out / "bench_serve.png", dpi=110)


async def bench(url: str, key: str, a: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=3600) as c:
        t0 = time.perf_counter()
        first = await stream_one(c, "warm up", 4)  # the first request after /health said ready
        first_s = time.perf_counter() - t0
        rows = [await level(c, n, a.tokens) for n in a.levels]
        t0 = time.perf_counter()
        await stream_one(c, "warm up", 4)
        extra = {"first request after ready": {"first_s": first_s, "first_ttft_s": first.ttft,
                                               "steady_s": time.perf_counter() - t0},
                 "prefill interference": await prefill_interference(c, a.long_prompt, a.tokens),
                 "prefix reuse": await prefix_reuse(c, a.long_prompt)}
    write_report(a.out, rows, extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="GGUF to serve (default: SmolLM2-135M)")
    ap.add_argument("--url", default=None, help="benchmark a running server instead of starting one")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--long-prompt", type=int, default=2048, help="tokens in the long-prompt scenarios")
    ap.add_argument("--out", type=Path, default=Path("perf/out"))
    a = ap.parse_args()
    if a.url:
        asyncio.run(bench(a.url, a.api_key, a))
        return
    from oracle import assets
    from server_fixture import running_server

    model = a.model or assets.smollm2_gguf()
    with running_server(model, "--parallel", "4", "--ctx-size", str(max(4096, a.long_prompt * 2))) as s:
        asyncio.run(bench(s.url, s.key, a))


if __name__ == "__main__":
    main()

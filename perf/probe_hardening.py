"""Two overload probes against a running server (issue 13, items 5 and 6); bounded, they stop by themselves.

burst:  N concurrent short completions; how many were admitted (200) and how many refused (429).
        Run the server with --parallel 4 --queue-limit 8 to compare with the issue's 32-burst.
big:    one ~5 MB prompt while /v1/status is polled; the worst /v1/status latency while it is in
        flight, and what the big request got back.

  python perf/probe_hardening.py --url http://127.0.0.1:8080 --key sk-x burst --n 32
  python perf/probe_hardening.py --url http://127.0.0.1:8080 --key sk-x big --mib 5
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time

import httpx


async def burst(c: httpx.AsyncClient, n: int) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    rs = await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(n)])
    codes = collections.Counter(r.status_code for r in rs)
    print(f"burst of {n}: admitted {codes.get(200, 0)}, status codes {dict(sorted(codes.items()))}")


async def big(c: httpx.AsyncClient, mib: float) -> None:
    prompt = "hello world " * int(mib * (1 << 20) / 12)
    task = asyncio.create_task(c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4}))
    worst, polls = 0.0, 0
    await asyncio.sleep(0.05)
    while not task.done() and polls < 2000:
        t0 = time.perf_counter()
        r = await c.get("/v1/status")
        worst = max(worst, time.perf_counter() - t0)
        polls += 1
        assert r.status_code == 200, r.text
        await asyncio.sleep(0.02)
    r = await task
    print(
        f"{len(prompt) / (1 << 20):.1f} MiB prompt: status {r.status_code} ({r.text[:100]!r}); "
        f"/v1/status worst {worst * 1000:.0f} ms over {polls} polls"
    )


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--key", default="")
    sub = p.add_subparsers(dest="probe", required=True)
    sub.add_parser("burst").add_argument("--n", type=int, default=32)
    sub.add_parser("big").add_argument("--mib", type=float, default=5.0)
    a = p.parse_args()
    headers = {"Authorization": f"Bearer {a.key}"} if a.key else {}
    limits = httpx.Limits(max_connections=256)
    async with httpx.AsyncClient(base_url=a.url, headers=headers, timeout=120, limits=limits) as c:
        await (burst(c, a.n) if a.probe == "burst" else big(c, a.mib))


if __name__ == "__main__":
    asyncio.run(main())

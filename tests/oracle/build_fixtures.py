"""Build all oracle fixtures into the cache: `python tests/oracle/build_fixtures.py`.

Set STRATA_FIXTURES to choose the cache dir (default ~/.cache/strata/fixtures).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oracle import assets, flagship


def main() -> int:
    t0 = time.perf_counter()
    print(f"fixture cache: {assets.cache_root()} (FIXTURE_VERSION={assets.FIXTURE_VERSION})", flush=True)

    def log(name, result, secs):
        print(f"{secs:7.1f}s  {name}", flush=True)
        for k, v in result.items() if isinstance(result, dict) else [("", result)]:
            print(f"           {k + ': ' if k else ''}{v}", flush=True)

    def begin(name):  # a cold build spends minutes in some steps: say which one is running
        print(f"  ...      {name} (elapsed {time.perf_counter() - t0:.0f}s)", flush=True)

    assets.build_all(log, begin)
    for name, build in (
        ("tiny_qwen3next", flagship.tiny_qwen3next),
        ("tiny_qwen4exp", flagship.tiny_qwen4exp),
    ):
        begin(name)
        t1 = time.perf_counter()
        log(name, build(), time.perf_counter() - t1)
    print(f"{time.perf_counter() - t0:7.1f}s  total", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

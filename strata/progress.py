"""A dependency-free progress bar on stderr (download, checksum), quiet when stderr is not a TTY."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    def __init__(self, label: str, total: int, force: bool = False) -> None:
        self.label, self.total = label, max(total, 1)
        self.enabled = force or sys.stderr.isatty()
        self._t0 = time.monotonic()
        self._last = 0.0

    def __call__(self, done: int, total: int | None = None) -> None:
        if total:
            self.total = total
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and done < self.total):
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        rate = done / max(now - self._t0, 1e-9) / 2**20
        eta = (self.total - done) / 2**20 / rate if rate > 0 else 0.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:6.1%} {done / 2**20:,.0f} MiB {rate:,.0f} MiB/s "
                         f"ETA {eta:4.0f} s")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()

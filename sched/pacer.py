"""How much of a newcomer's prompt to feed in a window shared with running streams, and when.

A decode-only window costs d; a window that also reads n prompt tokens costs a + b * n, with a the
fixed part of such a pass (the decode rows, launches, weights read once) and b the per-token part. Both
are fit by least squares over recent windows, since on a GPU a is large and b small, and a model that
charged everything to b (n * per_token) fed the GPU 8-token slices that crawled.

Two promises: running streams keep KEEP of their solo pace, and a long prompt's TTFT stays within about
1 / KEEP of its solo TTFT. Two ways to keep them, and the pacer takes the one that reads the prompt faster:
- every window mixed, with n such that a + b * n <= d / KEEP;
- a full chunk in one window, then k decode-only windows so that the streams' average pace still holds:
  (k + 1) / (t + k * d) >= KEEP / d, t the chunk window's measured time. Prompt throughput then tends to
  KEEP of the solo rate.
A chunk is never larger than what is left of the prompt, and the windows owed are charged from what the
chunk window really took, not from a full chunk's prediction: a 15-token prompt owes nothing. d is the
streams' cadence (the time between two decode windows' tokens, the host's share included), which is
what their pace is. `chunk()` returns 0 for a window that must stay decode-only.
"""

from __future__ import annotations

import math
from collections import deque

KEEP = 0.5  # fraction of the solo decode rate running streams keep while a prompt is read
MIN_CHUNK = 8  # below this, per-window overhead dominates and the newcomer crawls
_ALPHA = 0.3  # weight of the newest decode-only window in its moving average
_WINDOWS = 24  # mixed windows the cost fit looks back on


class PrefillPacer:
    def __init__(self, first_guess: int = 64) -> None:
        self.first_guess = first_guess
        self.decode_s: float | None = None  # a decode-only window
        self._mixed: deque[tuple[int, float]] = deque(maxlen=_WINDOWS)  # (prompt tokens, seconds)
        self._owed = 0  # decode-only windows still owed to the streams after a full chunk
        self._charge = False  # the window just planned reads a full chunk: observe() charges what it took

    @property
    def owed(self) -> int:
        """Decode-only windows the streams are still owed (they run once the prompt is read, if not before)."""
        return self._owed

    def observe(self, seconds: float, n_prefill: int) -> None:
        """A window with running streams took `seconds` (a decode-only one: the streams' cadence)."""
        if n_prefill == 0:  # whatever planned it, a decode-only window pays one owed to the streams
            self.decode_s = seconds if self.decode_s is None else (1 - _ALPHA) * self.decode_s + _ALPHA * seconds
            self._owed = max(0, self._owed - 1)
            return
        self._mixed.append((n_prefill, seconds))
        if self._charge and self.decode_s:
            self._owed = max(0, math.ceil((KEEP * seconds / self.decode_s - 1) / (1 - KEEP)))
        self._charge = False

    def cost(self) -> tuple[float, float] | None:
        """(a, b) of a mixed window, a + b * n seconds; None until there is something to fit."""
        if not self._mixed or self.decode_s is None:
            return None
        ns = [n for n, _ in self._mixed]
        ts = [t for _, t in self._mixed]
        if len(set(ns)) >= 2:  # least squares over the recent windows
            mn, mt = sum(ns) / len(ns), sum(ts) / len(ts)
            var = sum((n - mn) ** 2 for n in ns)
            b = sum((n - mn) * (t - mt) for n, t in zip(ns, ts)) / var
            a = mt - b * mn
            if b > 0 and a >= 0:
                return a, b
        # one size seen (or a fit that makes no sense): the fixed part is at least a decode window
        a = self.decode_s
        b = max(sum(t - a for t in ts) / sum(ns), 1e-9)
        return a, b

    def chunk(self, max_chunk: int, remaining: int) -> int:
        """Prompt tokens for the next window beside running streams, of `remaining` still to read (0: this one
        stays decode-only)."""
        self._charge = False
        if self._owed > 0:  # the decode-only window this plans pays it back (observe)
            return 0
        full = max(1, min(max_chunk, remaining))
        fit = self.cost()
        if fit is None:
            return min(self.first_guess, full)
        a, b = fit
        d = self.decode_s
        assert d is not None
        budget = d / KEEP  # the longest window that keeps the streams' pace
        n_mixed = min(full, int((budget - a) / b)) if budget > a else 0
        if n_mixed >= full:  # the rest of the prompt fits a window that keeps the pace
            return full
        t_full = a + b * full
        owed = max(0, math.ceil((KEEP * t_full / d - 1) / (1 - KEEP)))
        rate_mixed = n_mixed / (a + b * n_mixed) if n_mixed >= MIN_CHUNK else 0.0
        rate_full = full / (t_full + owed * d)
        if rate_mixed >= rate_full:
            return n_mixed
        self._charge = True
        return full

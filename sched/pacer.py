"""How much of a newcomer's prompt to feed in a window shared with running streams, and when.

A decode-only window costs d (the streams' cadence: the time between two of their tokens, the host's
share included, which is what their pace is; the median of the last DECODE_WINDOWS, since a cadence that took
in an idle gap or a graph capture is 10-15x the rest, and a moving average took several windows to forget one:
on the H200 its window log implies d about twice the streams' real cadence when a 2,048-token chunk was
planned, which paid the streams half the windows the promise needs); a window that also reads n prompt
tokens costs a + b * n,
a its fixed part (the decode rows, launches, weights read once) and b the per-token part. On a GPU a is
large and b small (a model that charged everything to b fed the GPU 8-token slices that crawled), and b
is only measurable on large windows: it is taken from windows of BIG or more prompt tokens (with or
without streams beside them), a from the least-squares fit of the mixed windows, at least d, and at least
what small windows (MIN_CHUNK to BIG tokens) show: on the H200 an eager pass takes ~36 ms however few
tokens it reads (its launches), three times the line through the large windows, and mixed windows sized
by that line kept the streams at a third of their pace.

Until a large window has been seen the pacer predicts nothing: it reads a probe of BIG tokens. (b guessed
from small windows was 2.3 ms a token on the H200, 0.12 really, and the streams were owed 425 decode
windows, ~5 s, before a 2048-token chunk that took 0.26 s.) One large window alone cannot part a from b,
and charging all but d to b fails where a pass has a large fixed part of its own: at a 24 GiB budget every
pass past the staging rows copies the missing experts first (~0.56 s on the 80B, whatever its length), so a
256-token probe of 0.57 s read as 2.1 ms a token, 70x the truth, and the streams were owed 115 windows
(3.8 s) before a 1,792-token chunk that took 0.62 s. `calibrate` takes passes of two lengths timed alone
(the server's warm-up, Scheduler.calibrate): their line gives a and b before the first prompt, and later
large windows update b above that a.

Short windows are another regime. On the GPU a pass of up to SHORT rows runs its experts per (row, expert)
pair (strata/gpu/ops.py MOE_GEMV_ROWS) and, under a VRAM budget, reads its misses in place instead of
staging them: at 24 GiB a 21-token window took 0.27 s where the line through the staged passes said 0.56, and
the streams were paid 15 windows ahead of it where 6 kept their pace (0.3 s of a 4k prompt's TTFT). The
warm-up also times two short passes (SHORT_SIZES); a window of up to SHORT tokens is predicted as the cheaper
of the two lines, the short one plus a decode window for the streams' rows, since the engine takes the
cheaper path.

Two promises: running streams keep KEEP of their solo pace while a prompt is read, and a long prompt's
TTFT stays within about 1 / KEEP of its solo TTFT. Two ways to keep them; the pacer takes the one that
reads the prompt faster:
- every window mixed, with n such that a + b * n <= d / KEEP;
- a full chunk in one window, with k decode-only windows before it, so that over the k + 1 windows the
  streams keep their pace: (k + 1) / (t + k * d) >= KEEP / d, t the chunk window's time. The k windows
  are paid before the chunk (predicted from the fit), so the promise holds up to the prompt's first
  token, and what the chunk took beyond the prediction is paid after it. Prompt throughput then tends to
  KEEP of the solo rate.
A chunk is never larger than what is left of the prompt. Whatever a window took beyond its prediction
(the probe: all of it) is owed after it, so a wrong fit costs the prompt time, never the streams their
pace. Any decode-only window pays one owed window back. `chunk()` returns 0 for a window that must stay
decode-only.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

KEEP = 0.5  # fraction of the solo decode rate running streams keep while a prompt is read
MIN_CHUNK = 8  # below this, per-window overhead dominates and the newcomer crawls
BIG = 256  # prompt tokens from which a window's time is mostly the per-token part
SHORT = 64  # prompt windows up to this many tokens may run the GPU's short-pass path (strata/gpu/ops.py)
SHORT_SIZES = (8, 32)  # the short passes the warm-up times
_ALPHA = 0.3  # weight of the newest window in the per-token cost's moving average
DECODE_WINDOWS = 9  # decode-only windows whose median is the streams' cadence
_WINDOWS = 24  # mixed windows the cost fit looks back on


def calibration_sizes(chunk: int, n_ctx: int) -> tuple[int, ...] | None:
    """The prompt passes `PrefillPacer.calibrate` wants timed: SHORT_SIZES, BIG and up to 4 * BIG tokens;
    None where chunks are shorter than that (the CPU's 512: its windows cost per token, which the probe
    measures, and its long passes take seconds to time) or the context holds no two such passes."""
    n = min(4 * BIG, n_ctx - 1)
    return (*SHORT_SIZES, BIG, n) if chunk >= 4 * BIG and n >= 2 * BIG else None


def _line(ns: list[int], ts: list[float]) -> tuple[float, float]:
    """The least-squares line t = a + b * n through windows of at least two sizes: (a, b)."""
    mn, mt = sum(ns) / len(ns), sum(ts) / len(ts)
    b = sum((n - mn) * (t - mt) for n, t in zip(ns, ts)) / sum((n - mn) ** 2 for n in ns)
    return mt - b * mn, b


def _owed(t: float, d: float) -> int:
    """Decode-only windows that keep the streams at KEEP of their pace beside a window of t seconds."""
    return max(0, math.ceil((KEEP * t / d - 1) / (1 - KEEP)))


class PrefillPacer:
    def __init__(self, probe: int = BIG) -> None:
        self.probe = probe  # prompt tokens of a window read while b is unknown
        self._decode: deque[float] = deque(maxlen=DECODE_WINDOWS)  # the last decode-only windows' cadences
        self._per_token: float | None = None  # b, from windows of BIG or more prompt tokens
        self._mixed: deque[tuple[int, float]] = deque(maxlen=_WINDOWS)  # (prompt tokens, seconds)
        self._owed = 0  # decode-only windows still owed to the streams
        self._prepaid: int | None = None  # windows paid ahead of the full chunk that comes next
        self._charge: int | None = None  # windows paid ahead of the prompt window planned
        self._alone: tuple[float, float] | None = None  # (a, b) of passes timed alone (calibrate)
        self._short: tuple[float, float] | None = None  # (a, b) of short passes timed alone (calibrate)

    @property
    def decode_s(self) -> float | None:
        """The streams' cadence: the median of the last decode-only windows (None before the first)."""
        return statistics.median(self._decode) if self._decode else None

    @property
    def owed(self) -> int:
        """Decode-only windows the streams are still owed (they run once the prompt is read, if not
        before)."""
        return self._owed

    def calibrate(self, passes: list[tuple[int, float]]) -> None:
        """Passes of at least two lengths (BIG or more tokens), (tokens, seconds) each, timed alone: the line
        through them is a window's cost until windows beside streams refine it. Passes of up to SHORT tokens,
        of two lengths or more, give the short windows' line."""
        short = [(n, t) for n, t in passes if n <= SHORT]
        if len({n for n, _ in short}) >= 2:
            a, b = _line([n for n, _ in short], [t for _, t in short])
            self._short = (max(0.0, a), max(0.0, b))
        passes = [(n, t) for n, t in passes if n > SHORT]
        ns, ts = [n for n, _ in passes], [t for _, t in passes]
        if len(set(ns)) < 2 or min(ns) < BIG:
            return
        b = max(_line(ns, ts)[1], min(ts) / max(ns) / 100)  # timing noise must not make tokens free
        mean_n, mean_t = sum(ns) / len(ns), sum(ts) / len(ts)
        self._alone = (max(0.0, mean_t - b * mean_n), b)  # through the means, as the fitted line runs
        self._per_token = b

    def observe(self, seconds: float, n_prefill: int, streams: bool = True) -> None:
        """A window took `seconds`: decode-only (n_prefill 0: the streams' cadence), or reading n_prefill
        prompt tokens beside running streams (streams) or alone."""
        if n_prefill == 0:
            self._decode.append(seconds)
            self._owed = max(0, self._owed - 1)
            return
        if n_prefill >= BIG:  # what the window took beyond its fixed part, per token
            if self._alone is None:  # the fixed part taken as a decode window's
                b = max(seconds - (self.decode_s or 0.0), seconds / 2) / n_prefill
            else:
                b = max(seconds - self._alone[0], self._alone[1] * n_prefill / 2) / n_prefill
            self._per_token = b if self._per_token is None else (1 - _ALPHA) * self._per_token + _ALPHA * b
        if not streams:
            return
        self._mixed.append((n_prefill, seconds))
        if self._charge is not None and self.decode_s:  # what the chunk took beyond what was paid ahead
            self._owed = max(0, _owed(seconds, self.decode_s) - self._charge)
        self._charge = None

    def cost(self) -> tuple[float, float] | None:
        """(a, b) of a mixed window, a + b * n seconds; None until a window of BIG or more prompt tokens
        has measured b."""
        if self.decode_s is None or self._per_token is None:
            return None
        d = self.decode_s
        ns = [n for n, _ in self._mixed]
        ts = [t for _, t in self._mixed]
        floor = d if self._alone is None else max(d, self._alone[0])
        b = self._per_token
        a = max(floor, max((t - b * n for n, t in self._mixed), default=floor))
        # least squares over recent mixed windows, large ones among them
        if len(set(ns)) >= 2 and max(ns) >= BIG:
            at, slope = _line(ns, ts)
            if slope > 0 and at >= 0:
                a, b = at, slope
        small = [t - b * n for n, t in self._mixed if MIN_CHUNK <= n < BIG]
        return (max(a, statistics.median(small)) if small else a), b

    def chunk(self, max_chunk: int, remaining: int) -> int:
        """Prompt tokens for the next window beside running streams, of `remaining` still to read (0: this one
        stays decode-only)."""
        self._charge = None
        if self._owed > 0:  # the decode-only window this plans pays one back (observe)
            return 0
        n = self._choose(max(1, min(max_chunk, remaining)))
        if n and self._charge is None:  # nothing paid ahead: what it takes beyond d / KEEP is owed after it
            self._charge = 0
        return n

    def _predict(self, n: int, a: float, b: float, d: float) -> float:
        """A window of n prompt tokens beside the streams: the fitted line, or for a short one the short
        passes' line plus a decode window (the streams' rows), whichever is cheaper."""
        t = a + b * n
        if self._short is not None and n <= SHORT:
            t = min(t, self._short[0] + self._short[1] * n + d)
        return t

    def _choose(self, full: int) -> int:
        if self._prepaid is not None:  # its windows were paid ahead: the chunk now
            self._charge, self._prepaid = self._prepaid, None
            return full
        fit = self.cost()
        if fit is None:
            return min(self.probe, full)
        a, b = fit
        d = self.decode_s
        assert d is not None
        budget = d / KEEP  # the longest window that keeps the streams' pace
        n_mixed = min(full, int((budget - a) / b)) if budget > a else 0
        if self._short is not None and budget > self._short[0] + d:  # a short window may fit it
            sa, sb = self._short
            n_mixed = max(n_mixed, min(full, SHORT, int((budget - sa - d) / sb) if sb > 0 else SHORT))
        if n_mixed >= full:  # the rest of the prompt fits a window that keeps the pace
            return full
        t_full = self._predict(full, a, b, d)
        owed = _owed(t_full, d)
        rate_mixed = n_mixed / self._predict(n_mixed, a, b, d) if n_mixed >= MIN_CHUNK else 0.0
        rate_full = full / (t_full + owed * d)
        if rate_mixed >= rate_full:
            return n_mixed
        if owed == 0:
            return full
        self._owed, self._prepaid = owed, owed
        return 0

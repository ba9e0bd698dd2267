"""How much of a newcomer's prompt to feed in a window shared with running streams.

A window's time is roughly decode_s (one token for every running slot) plus n * per_token_s for
n prompt tokens. Running streams keep KEEP of their solo pace when
    decode_s / (decode_s + n * per_token_s) >= KEEP,
so n = decode_s * (1 / KEEP - 1) / per_token_s. Both costs are learned from recent windows.
"""

from __future__ import annotations

KEEP = 0.5  # fraction of the solo decode rate running streams keep while a prompt is read
MIN_CHUNK = 8  # below this, per-window overhead dominates and the newcomer crawls
_ALPHA = 0.3  # weight of the newest window in the moving averages


class PrefillPacer:
    def __init__(self, first_guess: int = 64) -> None:
        self.first_guess = first_guess
        self.decode_s: float | None = None  # a decode-only window
        self.per_token_s: float | None = None  # one extra prompt token in a window

    def observe(self, seconds: float, n_prefill: int) -> None:
        if n_prefill == 0:
            self.decode_s = _ema(self.decode_s, seconds)
        elif self.decode_s is not None:
            extra = max(seconds - self.decode_s, 0.0) / n_prefill
            self.per_token_s = _ema(self.per_token_s, extra)

    def chunk(self, max_chunk: int) -> int:
        if self.decode_s is None or not self.per_token_s:
            return min(self.first_guess, max_chunk)
        n = int(self.decode_s * (1.0 / KEEP - 1.0) / self.per_token_s)
        return max(MIN_CHUNK, min(n, max_chunk))


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _ALPHA) * old + _ALPHA * new

"""Stop strings over a text stream: emit text as soon as it cannot be the start of a stop string."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the stream, if any

    def push(self, text: str) -> tuple[str, bool]:
        """Feed new text. Returns (text safe to emit, whether a stop string was hit).

        On a hit the emitted text ends just before the stop string, which is not emitted.
        """
        buf = self._held + text
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            at, self.matched = min(hits)
            self._held = ""
            return buf[:at], True
        hold = 0
        for s in self.stops:  # longest tail of buf that is a proper prefix of some stop string
            for n in range(min(len(s) - 1, len(buf)), hold, -1):
                if s.startswith(buf[-n:]):
                    hold = n
                    break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out

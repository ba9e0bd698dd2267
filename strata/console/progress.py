"""Progress of long start-up work (download, checksum, arena fill, profile pre-fill) through tqdm on stderr.

On a terminal the bar shows the amount, the rate and the ETA. When stderr is not a terminal (a service's log,
a test's captured output) no bar is drawn: the work ends with one log line that says how much took how long.
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger("strata.progress")


class ProgressBar:
    """Call it with the amount done so far (and the total, when it becomes known); it closes at the total.
    `unit` "B" counts bytes (shown in KiB/MiB/GiB, the rate per second); any other unit counts items."""

    def __init__(self, label: str, total: int, force: bool = False, unit: str = "B") -> None:
        self.label, self.unit, self.total = label, unit, max(total, 1)
        self.done = 0
        self._t0 = time.monotonic()
        by_bytes = unit == "B"
        self._bar = tqdm(
            total=self.total,
            desc=label,
            unit=unit,
            unit_scale=by_bytes,
            unit_divisor=1024 if by_bytes else 1000,
            file=sys.stderr,
            mininterval=0.1,
            disable=not (force or sys.stderr.isatty()),
            leave=True,
            dynamic_ncols=True,
        )

    def __call__(self, done: int, total: int | None = None) -> None:
        if self.done >= self.total:  # closed
            return
        if total and total != self.total:
            self.total = self._bar.total = total
        self._bar.update(done - self.done)
        self.done = done
        if done >= self.total:
            self._close()

    def _close(self) -> None:
        drawn = not self._bar.disable  # close() sets disable
        self._bar.close()
        if drawn:  # the bar's last state is the record
            return
        seconds, done = time.monotonic() - self._t0, self.done
        if self.unit == "B":
            log.info(
                "%s: %.1f MiB in %.2f s (%.0f MB/s)",
                self.label,
                done / 2**20,
                seconds,
                done / max(seconds, 1e-9) / 1e6,
            )
        else:
            log.info("%s: %d %s in %.2f s", self.label, done, self.unit, seconds)

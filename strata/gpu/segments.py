"""A pass's rows by sequence: what the layers of every architecture need to know of who owns which rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Segment:
    """Rows [start, start + n) of the pass belong to one sequence whose cache already held n_past."""

    start: int
    n: int
    n_past: int
    kv: Any  # GpuKV

    def at(self, start: int, n: int) -> Segment:
        """Rows [start, start + n) of this one as a pass of their own (a wide pass's part)."""
        return Segment(0, n, self.n_past + start, self.kv)


def decode_rows_only(segments: list[Segment] | None) -> bool:
    """Every row a decode row (one a sequence, or None: the graph's rows, whose positions come from the
    table), so the per-row kernels serve the pass in one launch."""
    return segments is None or all(s.n == 1 for s in segments)


def runs(segments: list[Segment] | None) -> list[tuple[int, int]] | None:
    """(start, n) of each sequence's rows for the kernels that run a sequence's rows in order (the recurrent
    and convolution state), or None when every row is a decode row."""
    return None if decode_rows_only(segments) else [(s.start, s.n) for s in segments or []]

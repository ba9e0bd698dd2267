"""--kv-resident N: a sequence's recent KV cells stay on the device, the older ones move to host RAM.

A long context's KV need not all sit in VRAM: each attention layer keeps its last N or so cells there (the
window) and every older cell in (pinned) host memory, which the attention kernels read in place (zero-copy)
for the keys before the window. The window is contiguous: the device holds cells [base, length), the host
[0, base). Before a pass of t new rows (at most the prefill chunk), whole blocks of BLOCK cells leave the
front of the window while it would still hold N cells without them: they are copied to the host and the
rest moves down. The window so holds the last N to N + BLOCK - 1 cells, and the device needs N + BLOCK +
chunk, however long the context. Cell j is then `host[j]` for j < base, else
`device[j - base]`: kernels that address cells from a base pointer take `device - base` as it, so the
writes and every in-window read are unchanged, and only the keys before `base` take the host's pointer.

A rollback (truncate) behind `base` moves the window back: the cells it needs again come from the host.

`KVWindow` is the bookkeeping both KV stores share (strata/runtime/kvcache.py's cells on the CPU, where numpy
stands in for VRAM, and strata/gpu/kv.py's); each applies the copies it plans with its own memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.errors import ConfigError

BLOCK = 256  # cells a window gives up at once: one copy per (layer, head) every BLOCK tokens


def check_resident(n: int, flag: str = "--kv-resident") -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ConfigError(flag, n, f"must be 0 (every cell on the device) or a number of cells >= {BLOCK}")
    if 0 < n < BLOCK:
        raise ConfigError(flag, n, f"a window holds at least one block of {BLOCK} cells (0: no window)")


@dataclass(frozen=True, slots=True)
class Evict:
    """Cells [lo, hi) go from device rows [lo - base, hi - base) to host rows [lo, hi); then device rows
    [hi - base, length - base) move down to [0, length - hi)."""

    lo: int
    hi: int
    length: int

    @property
    def kept(self) -> int:
        return self.length - self.hi


@dataclass(frozen=True, slots=True)
class Reload:
    """Cells [lo, hi) come back from host rows [lo, hi) to device rows [0, hi - lo) (a rollback's window)."""

    lo: int
    hi: int


class KVWindow:
    """Where a sequence's cells are: [0, base) on the host, [base, length) on the device."""

    def __init__(self, resident: int, chunk: int) -> None:
        check_resident(resident)
        self.resident = -(-resident // BLOCK) * BLOCK
        self.chunk = max(1, chunk)
        self.device_cells = self.resident + BLOCK + self.chunk  # a full window, a block more, one pass's rows
        self.base = 0

    def before_pass(self, length: int, rows: int) -> Evict | None:
        """Before a pass of `rows` new cells at `length`: the blocks that leave for the host (the window keeps
        the last `resident` cells at least), or None."""
        if rows > self.chunk:
            raise ValueError(f"a pass of {rows} rows outgrows the window's room for {self.chunk} new cells")
        hi = max(self.base, self.base_for(length))
        if hi == self.base:
            return None
        ev = Evict(self.base, hi, length)
        self.base = hi
        return ev

    def base_for(self, n: int) -> int:
        """The highest block boundary a window of n cells can start at and still hold `resident` of them."""
        return max(0, (n - self.resident) // BLOCK * BLOCK)

    def truncate(self, n: int) -> Reload | None:
        """Rolled back to n cells: when n is behind `base`, the window moves back to end at n and its cells
        come from the host."""
        if n >= self.base:
            return None
        self.base = lo = self.base_for(n)
        return Reload(lo, n) if n > lo else None

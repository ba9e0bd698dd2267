"""Expert-tier counters: what every response's timings, the log line, /v1/status and /metrics read.

A lookup is one routed (token, layer, expert) triple. A hit found the expert in a VRAM slot (the
CPU stand-in's numpy slots); a miss read it from the pinned arena (zero-copy over PCIe), or, in a
prefill chunk that borrows slots, from the copy staged into a borrowed slot, or was the CPU's share
(`cpu_expert_calls`: computed on the CPU pool from RAM, no PCIe bytes). `pcie_bytes` counts
expert bytes that crossed from RAM: each miss's three matrices in decode, each staged expert once
in a borrowing prefill chunk. Under `--ram-budget-mib` some experts are only in the file's mapping:
`mmap_reads` counts experts read from it (decode: misses the CPU computed from the mapping, so also CPU
calls; prefill: experts staged from it through the bounce ring) and `mmap_bytes` their bytes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger("strata.tiers")
_WARNING = "warning: "


def note(msg: str) -> None:
    """A start-up or status line through the `strata` log (strata.logs): `strata: msg` as text, one object
    with --log-format json. A msg that starts "warning: " goes at warning level, whose text line is the
    same."""
    if msg.startswith(_WARNING):
        log.warning(msg.removeprefix(_WARNING))
    else:
        log.info(msg)


@dataclass(slots=True)
class TierCounts:
    lookups: int = 0
    hits: int = 0
    pcie_bytes: int = 0
    cpu_calls: int = 0
    mmap_reads: int = 0
    mmap_bytes: int = 0

    def add(
        self,
        lookups: int,
        hits: int,
        pcie_bytes: int,
        cpu_calls: int = 0,
        mmap_reads: int = 0,
        mmap_bytes: int = 0,
    ) -> None:
        self.lookups += lookups
        self.hits += hits
        self.pcie_bytes += pcie_bytes
        self.cpu_calls += cpu_calls
        self.mmap_reads += mmap_reads
        self.mmap_bytes += mmap_bytes

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


@dataclass(slots=True)
class TierUse:
    """Counters of one sequence, or of the whole engine: decode and prefill apart."""

    decode: TierCounts = field(default_factory=TierCounts)
    prefill: TierCounts = field(default_factory=TierCounts)

    def of(self, prefill: bool) -> TierCounts:
        return self.prefill if prefill else self.decode

    def timings(self) -> dict[str, int]:
        """The fields a response's `timings` carries."""
        d, p = self.decode, self.prefill
        return {
            "expert_lookups": d.lookups,
            "expert_hits": d.hits,
            "pcie_bytes": d.pcie_bytes,
            "cpu_expert_calls": d.cpu_calls,
            "mmap_expert_reads": d.mmap_reads,
            "mmap_bytes": d.mmap_bytes,
            "prompt_expert_lookups": p.lookups,
            "prompt_expert_hits": p.hits,
            "prompt_pcie_bytes": p.pcie_bytes,
            "prompt_cpu_expert_calls": p.cpu_calls,
            "prompt_mmap_expert_reads": p.mmap_reads,
            "prompt_mmap_bytes": p.mmap_bytes,
        }


def hit_rate_line(c: TierCounts, what: str = "decode") -> str:
    """The seeds' log line: `decode expert cache hit rate: 41.2% (hits / lookups); M more read by the
    GPU over PCIe (p% of all routed); C on the CPU`."""
    pcie = c.lookups - c.hits - c.cpu_calls
    share = pcie / c.lookups if c.lookups else 0.0
    line = (
        f"{what} expert cache hit rate: {c.hit_rate:.1%} ({c.hits:,} / {c.lookups:,}); {pcie:,} more read "
        f"over PCIe ({share:.1%} of all routed, {c.pcie_bytes / 2**30:,.2f} GiB)"
    )
    if c.cpu_calls:
        line += f"; {c.cpu_calls:,} on the CPU"
    return line + f" ({c.mmap_reads:,} from the file's mapping)" if c.mmap_reads else line

"""VRAM accounting: the start-up plan (what each component needs against the budget, and how many
expert slots the rest buys) and the live ledger that every later allocation (KV growth) draws from.

The budget is `--vram-budget-mib`, or the device's free memory minus `--vram-reserve-mib` (default
700: the CUDA context, cuBLAS workspaces and the allocator's slack). Dense weights, KV, recurrent
state and activations must fit; the expert cache takes what is left (`--expert-cache auto`), a set
size (`6GiB`, `4096MiB`, `40%` of all experts) or nothing (`off`: every expert read from RAM).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from strata.errors import ConfigError, StrataError

MIB = 1 << 20
GIB = 1 << 30
RESERVE_MIB = 700


class Lender(Protocol):
    def lend(self, need: int) -> int:
        """Free at least `need` bytes of the budget if it can (counted off the ledger's `used`); the bytes
        freed."""


class VramBudgetError(StrataError):
    """A GPU allocation would pass --vram-budget-mib; the message says what needed how much."""


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(GiB|MiB|%)", re.IGNORECASE)


def check_expert_cache(value: str, flag: str = "--expert-cache") -> None:
    """auto, off, or a size such as 6GiB, 4096MiB, 40%; errors name the flag and the value."""
    if value in ("auto", "off"):
        return
    m = _SIZE.fullmatch(value.strip())
    if m is None or (m.group(2) == "%" and not 0 <= float(m.group(1)) <= 100):
        raise ConfigError(
            flag, value, "must be auto, off, or a size such as 6GiB, 4096MiB or 40% (of all experts)"
        )


def cache_request(value: str, slot_bytes: int, n_total: int) -> int | None:
    """Slots asked for by an --expert-cache value; None for auto (whatever the budget leaves)."""
    check_expert_cache(value)
    if value == "auto":
        return None
    if value == "off":
        return 0
    m = _SIZE.fullmatch(value.strip())
    assert m is not None
    num, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        return min(n_total, int(n_total * num / 100))
    return min(n_total, int(num * (GIB if unit == "gib" else MIB)) // slot_bytes)


@dataclass(slots=True)
class VramPlan:
    budget: int  # bytes
    parts: dict[str, int] = field(default_factory=dict)  # component -> bytes, in display order
    slot_bytes: int = 0  # one expert slot (0: the model has no routed experts)
    n_total: int = 0  # experts in the model
    n_slots: int = 0  # set by size_cache
    worst_slots: int | None = None  # --kv-grow: the slots left when every sequence's KV is full
    kv_full: int = 0  # --kv-grow: those KV bytes
    prompt_rows: int = 0  # rows a lone prompt's pass reads (strata.gpu.plan.WIDE_ROWS); 0: the chunk's

    @property
    def dense(self) -> int:
        return sum(self.parts.values())

    @property
    def total(self) -> int:
        return self.dense + self.n_slots * self.slot_bytes

    def describe(self) -> str:
        rows = [f"{k} {v / MIB:,.0f} MiB" for k, v in self.parts.items()]
        if self.slot_bytes:
            rows.append(
                f"expert cache {self.n_slots:,} slots {self.n_slots * self.slot_bytes / MIB:,.0f} MiB"
            )
        worst = ""
        if self.worst_slots is not None:
            worst = (
                f"; with every KV full ({self.kv_full / MIB:,.0f} MiB) the cache keeps {self.worst_slots:,} "
                "slots"
            )
        return (
            f"{', '.join(rows)}; total {self.total / MIB:,.0f} MiB against a budget of "
            f"{self.budget / MIB:,.0f} MiB{worst}"
        )

    def size_cache(self, request: str = "auto", flag: str = "vram_budget_mib") -> None:
        """Give the expert cache its slots, or raise ConfigError naming the budget flag, with the plan, when
        the dense part (or the requested cache) does not fit."""
        if self.dense > self.budget:
            need = -(-self.dense // MIB)
            raise ConfigError(
                flag,
                self.budget // MIB,
                (
                    f"the model's dense part does not fit: {self.describe()}. Raise the budget to at least "
                    f"{need} MiB, lower n_ctx or prefill_chunk (KV cache and activations), or run on the CPU "
                    "(device=cpu)"
                ),
            )
        if not self.slot_bytes:
            return
        room = (self.budget - self.dense) // self.slot_bytes
        asked = cache_request(request, self.slot_bytes, self.n_total)
        if asked is not None and asked > room:
            raise ConfigError(
                "expert_cache",
                request,
                (
                    f"{asked:,} slots ({asked * self.slot_bytes / MIB:,.0f} MiB) do not fit beside the dense "
                    f"part: {self.describe()}; at most {room:,} slots fit"
                ),
            )
        self.n_slots = int(min(self.n_total, room) if asked is None else asked)

    def cache_line(self, free: int, reserve: int) -> str:
        """The start-up line: `expert cache auto: 21.4 GiB free, 700 MiB reserved -> 10,240 slots (41.7% of
        experts)`."""
        share = self.n_slots / self.n_total if self.n_total else 1.0
        return (
            f"expert cache: {free / GIB:,.1f} GiB free, {reserve / MIB:,.0f} MiB reserved, budget "
            f"{self.budget / GIB:,.1f} GiB, dense part {self.dense / GIB:,.2f} GiB -> {self.n_slots:,} slots "
            f"of {self.slot_bytes / MIB:,.2f} MiB ({share:.1%} of experts)"
        )


class Ledger:
    """Bytes Strata holds on the GPU, against the budget; KV caches take and give back here. With --kv-grow a
    `lender` (tiers/grow.py) frees expert slots when a take would pass the budget."""

    def __init__(self, budget: int, reserved: int) -> None:
        self.budget = budget
        self.used = reserved  # weights, activations and graph buffers, fixed at start-up
        self.lender: Lender | None = None

    def take(self, nbytes: int, what: str) -> None:
        if self.used + nbytes > self.budget and self.lender is not None:
            self.lender.lend(self.used + nbytes - self.budget)
        if self.used + nbytes > self.budget:
            raise VramBudgetError(
                f"{what} needs {nbytes / MIB:,.1f} MiB more, but {self.used / MIB:,.0f} of the "
                f"{self.budget / MIB:,.0f} MiB VRAM budget are in use (raise vram_budget_mib or shorten the "
                "context)"
            )
        self.used += nbytes

    def give(self, nbytes: int) -> None:
        self.used -= nbytes

    def fits(self, nbytes: int) -> bool:
        """Whether nbytes more (a transient copy, say) stay within the budget."""
        return self.used + nbytes <= self.budget

"""VRAM accounting: the start-up plan (what each component needs against the budget) and the live
ledger that every later allocation (KV growth) draws from.

`--vram-budget-mib` caps what Strata allocates on the GPU, so a 139 GiB H200 can stand in for a
24 GB card. Until expert tiering exists, a model that does not fit all-resident is refused at
start-up with the plan, rather than failing halfway through a request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.errors import ConfigError, StrataError

MIB = 1 << 20


class VramBudgetError(StrataError):
    """A GPU allocation would pass --vram-budget-mib; the message says what needed how much."""


@dataclass(slots=True)
class VramPlan:
    budget: int  # bytes
    parts: dict[str, int] = field(default_factory=dict)  # component -> bytes, in display order

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        rows = ", ".join(f"{k} {v / MIB:,.0f} MiB" for k, v in self.parts.items())
        return f"{rows}; total {self.total / MIB:,.0f} MiB against a budget of {self.budget / MIB:,.0f} MiB"

    def check(self, flag: str = "vram_budget_mib") -> None:
        """Raise ConfigError naming the budget flag, with the plan, when the parts do not fit."""
        if self.total <= self.budget:
            return
        need = -(-self.total // MIB)
        raise ConfigError(flag, self.budget // MIB, (
            f"the model does not fit all-resident: {self.describe()}. Expert tiering is not available yet, "
            f"so everything must fit: raise the budget to at least {need} MiB, lower n_ctx or prefill_chunk "
            f"(KV cache and activations), or run on the CPU (device=cpu)"))


class Ledger:
    """Bytes Strata holds on the GPU, against the budget; KV caches take and give back here."""

    def __init__(self, budget: int, reserved: int) -> None:
        self.budget = budget
        self.used = reserved  # weights, activations and graph buffers, fixed at start-up

    def take(self, nbytes: int, what: str) -> None:
        if self.used + nbytes > self.budget:
            raise VramBudgetError(
                f"{what} needs {nbytes / MIB:,.1f} MiB more, but {self.used / MIB:,.0f} of the "
                f"{self.budget / MIB:,.0f} MiB VRAM budget are in use (raise vram_budget_mib or shorten the context)")
        self.used += nbytes

    def give(self, nbytes: int) -> None:
        self.used -= nbytes

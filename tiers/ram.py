"""The low-RAM mode (`--ram-budget-mib`): which experts the RAM arena holds when it cannot hold them all.

Three tiers then: VRAM slots, the arena (pinned RAM on the GPU, host copies on the CPU stand-in) and the
file's mapping (the page cache, or the disk). The arena holds no copy of what the slots hold, so slots and
arena together cover as many experts as the two budgets allow, in this order:

1. the experts not in a slot, most likely routed first: by the routing profile's counts when there is one,
   else layer-balanced (expert-major, as the static fill), so each layer keeps about as many misses in RAM;
2. then the experts in the slots a long prefill chunk borrows (tiers/slots.py), so that giving the slots their
   experts back is a copy from pinned RAM, not from the mapping (seed 004's "backups of the borrowed slots").

Nothing else: a resident that is never borrowed is read from the mapping once, to fill its slot. Misses on
mapped-only experts are the CPU's in decode (the CPU pool reads the mapping in place; the CUDA graph can only
read VRAM and pinned memory), and longer passes stage them through the bounce ring (tiers/ring.py). A budget
that holds every expert keeps today's arena of every expert; 0 means no limit.

The budget counts what the tiers hold in RAM for the experts: the arena's rows and the ring's buffers. The
ring is the part a budget must at least hold.
"""

from __future__ import annotations

import numpy as np

from strata.errors import ConfigError
from strata.tiers.budget import MIB
from strata.tiers.layout import ExpertLayout
from strata.tiers.profile import Profile
from strata.tiers.ring import RING_BUFFERS, RING_EXPERTS, ring_buffer_bytes

FLAG = "ram_budget_mib"
# passes of up to this many rows are decode passes, whose mapped-only misses the CPU computes in place; longer
# ones stage them (strata/gpu/layers.py GEMV_ROWS; the CPU stand-in mirrors it)
DECODE_ROWS = 8


def ring_bytes(layout: ExpertLayout) -> int:
    """RAM the bounce ring takes (what any budget must hold)."""
    return RING_BUFFERS * ring_buffer_bytes(layout.slot_bytes)


def arena_rows(layout: ExpertLayout, budget_mib: float, flag: str = FLAG) -> int | None:
    """Experts the arena may hold under the budget; None when there is no limit (0) or the budget holds every
    expert (the arena of every expert, no ring). ConfigError naming the flag when it cannot hold the ring."""
    if budget_mib < 0:
        raise ConfigError(flag, budget_mib, "must be >= 0 (0 = no limit: every expert in RAM)")
    budget = int(budget_mib * MIB)
    full = layout.n_total * layout.slot_bytes
    if not budget or budget >= full:
        return None
    ring = ring_bytes(layout)
    if budget < ring:
        raise ConfigError(
            flag,
            budget_mib,
            (
                f"the expert arena needs {full / MIB:,.2f} MiB for every expert, and a budget below that "
                "must still hold the bounce ring that copies experts from the file's mapping: "
                f"{ring / MIB:,.3f} MiB ({RING_BUFFERS} buffers of {RING_EXPERTS} experts of "
                f"{layout.slot_bytes / MIB:,.3f} MiB); give at least {ring / MIB:,.3f} MiB, or 0 for no limit"
            ),
        )
    return (budget - ring) // layout.slot_bytes


def choose_held(
    resident: np.ndarray, borrowed: np.ndarray, rows: int, profile: Profile | None = None
) -> np.ndarray:
    """[L, E] bool: the experts the arena holds, at most `rows`: non-residents (resident [L, E]) most likely
    first, then the residents whose slots prefill borrows (borrowed [L, E]), each group in the same order."""
    n_l, n_e = resident.shape
    order = np.arange(n_e)[None, :] * n_l + np.arange(n_l)[:, None]  # [L, E] expert-major: layer-balanced
    uses = profile.uses if profile is not None else np.zeros((n_l, n_e))
    held = np.zeros((n_l, n_e), bool)
    left = rows
    for group in (~resident, resident & borrowed):
        li, e = np.nonzero(group)
        take = np.lexsort((order[li, e], -uses[li, e]))[: max(left, 0)]  # most used first, ties expert-major
        held[li[take], e[take]] = True
        left -= len(take)
    return held

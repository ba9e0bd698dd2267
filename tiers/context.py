"""The context a start-up serves when none is asked for (no --ctx-size, n_ctx=0): the model's trained
context when its KV fits, else the largest that does, with the reason in one line.

What "fits" means depends on where the KV lives. On the GPU the plan reserves KV room for every
sequence at the full context, and that room is taken from the expert cache: the trained context is
served when its KV fits beside every expert; otherwise the KV may take KV_SHARE of what the budget
leaves after the dense part (the rest stays expert slots, whose hit rate decode speed follows) or what
is left beside all the experts, whichever is more. On the CPU the KV grows with the context in RAM: a
full context for every sequence must fit in RAM_SHARE of the available memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.tiers.budget import GIB, MIB

KV_SHARE = 0.25
RAM_SHARE = 0.5
ROUND = 1024  # a reduced context is a multiple of this
FLOOR = 4096  # never chosen below this (or the trained context, if smaller): the plan refuses instead


@dataclass(frozen=True, slots=True)
class ContextChoice:
    n_ctx: int
    trained: int
    line: str  # the start-up log line: which context and why


def _size(n: int) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB else f"{n / MIB:,.0f} MiB"


def _line(n: int, trained: int, kv_per_token: int, seqs: int, why: str) -> ContextChoice:
    which = "the trained context" if n == trained else f"of the trained {trained:,}"
    return ContextChoice(
        n,
        trained,
        f"context: {n:,} tokens ({which}), KV {kv_per_token / 1024:,.1f} KiB a token "
        f"x {seqs} sequence(s): {why}",
    )


def _cut(trained: int, allowance: int, per_token: int) -> int:
    fit = allowance // max(1, per_token) // ROUND * ROUND
    return max(min(trained, FLOOR), min(trained, fit))


def on_gpu(trained: int, kv_per_token: int, seqs: int, room: int, experts: int) -> ContextChoice:
    """room: VRAM the budget leaves after the dense part (without KV); experts: all experts' bytes."""
    need = seqs * kv_per_token * trained
    if need + experts <= room:
        return _line(trained, trained, kv_per_token, seqs, f"{_size(need)} beside every expert")
    allowance = max(int(KV_SHARE * room), room - experts)
    n = _cut(trained, allowance, seqs * kv_per_token)
    if n == trained:
        return _line(
            n,
            trained,
            kv_per_token,
            seqs,
            f"{_size(need)}, within {KV_SHARE:.0%} of the {_size(room)} the dense part leaves",
        )
    return _line(
        n,
        trained,
        kv_per_token,
        seqs,
        f"at the trained context the KV would take {_size(need)} of the {_size(room)} the dense part "
        f"leaves; it keeps {_size(allowance)}, the rest holds experts (--ctx-size sets it, at the cache's "
        "expense)",
    )


def on_cpu(trained: int, kv_per_token: int, seqs: int, available: int) -> ContextChoice:
    """available: host RAM free now; the KV grows into it as the context fills."""
    need = seqs * kv_per_token * trained
    allowance = int(RAM_SHARE * available)
    if need <= allowance:
        return _line(trained, trained, kv_per_token, seqs, f"{_size(need)} in RAM when full")
    return _line(
        _cut(trained, allowance, seqs * kv_per_token),
        trained,
        kv_per_token,
        seqs,
        f"at the trained context the KV would take {_size(need)}, more than {RAM_SHARE:.0%} of the "
        f"{_size(available)} of RAM available (--kv-type int8 holds a longer one; --ctx-size sets it)",
    )


def on_window(trained: int, kv_per_token: int, seqs: int, window_cells: int, available: int) -> ContextChoice:
    """--kv-resident: the window's cells stay in VRAM (a fixed part of the plan); the older ones fill pinned
    host RAM as the context grows, within RAM_SHARE of what is available."""
    need = seqs * kv_per_token * max(0, trained - window_cells)
    allowance = int(RAM_SHARE * available)
    vram = _size(seqs * kv_per_token * min(window_cells, trained))
    if need <= allowance:
        return _line(
            trained, trained, kv_per_token, seqs, f"{vram} of window in VRAM, {_size(need)} in RAM when full"
        )
    n = min(trained, window_cells + _cut(trained, allowance, seqs * kv_per_token))
    return _line(
        n,
        trained,
        kv_per_token,
        seqs,
        f"{vram} of window in VRAM; at the trained context the rest would take {_size(need)} of RAM, more "
        f"than {RAM_SHARE:.0%} of the {_size(available)} available (--ctx-size sets it)",
    )

"""Where the experts go on the GPU path: slots in VRAM, the rest in a pinned arena, the file's pageable
mapping, or (under --ram-budget-mib) both, with a bounce ring between the mapping and the GPU.

`place_experts` builds the slot store and the cache and fills the slots (`check_staging` then refuses a
placement whose slots cannot stage what the GPU cannot read); strata/gpu/tiers.py keeps the device tables over
what it placed. The choice, in order:
- all of the arena pinned (the default);
- `--ram-budget-mib` short of every expert (tiers/ram.py): the slots are filled from the mapping through the
  ring, then only the likeliest misses (and the borrowed slots' experts) are pinned, the rest read from the
  mapping;
- pinning refused (ulimit -l, a cgroup) or `pin=False`: everything stays in the pageable mapping, which the
  GPU cannot read in place, so every decode miss is the CPU's and every longer pass stages its misses (copies
  from pageable memory run at ~8.6 GB/s against ~55 pinned on the H200 host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.gpu.ring import GpuRing
from strata.gpu.slots import DeviceSlots
from strata.tiers.arena import MmapArena, PinnedArena
from strata.tiers.layout import ExpertLayout
from strata.tiers.profile import Profile
from strata.tiers.ram import arena_rows, choose_held
from strata.tiers.ring import ring_buffer_bytes
from strata.tiers.slots import ExpertCache
from strata.tiers.store import per_segment
from strata.tiers.telemetry import note


@dataclass(slots=True)
class Placement:
    arena: PinnedArena | MmapArena
    slots: DeviceSlots
    cache: ExpertCache  # filled
    pageable: bool  # the arena is the file's pageable mapping: the GPU reads none of it in place
    ring: GpuRing | None  # the low-RAM mode's bounce ring


def place_experts(
    gguf: GGUFFile,
    layout: ExpertLayout,
    n_slots: int,
    decode_rows: int,
    kernels: Any,
    pin: bool = True,
    ram_budget_mib: float = 0,
    profile: Profile | None = None,
    kv_grow: bool = False,
) -> Placement:
    """The slots filled (from `profile` when given) and the arena chosen."""
    rows = arena_rows(layout, ram_budget_mib) if n_slots < layout.n_total else None
    if rows is not None and pin:
        return _low_ram(gguf, layout, n_slots, rows, profile, decode_rows, kv_grow, kernels)
    else:
        pageable = not pin
        arena: PinnedArena | MmapArena
        if pin:
            try:
                arena = PinnedArena(gguf, layout)
            except ConfigError as err:
                arena, pageable = _unpinned(gguf, layout, err), True
        else:
            arena = MmapArena(gguf, layout)
            note("expert arena: not pinned (asked); decode misses run on the CPU, prefill stages them")
        per = per_segment(layout.slot_bytes, n_slots, layout.n_total, kv_grow)
        slots = DeviceSlots(n_slots, layout.strides, kernels, pageable, per=per)
        cache = ExpertCache(layout, n_slots, slots, arena)
        cache.fill(profile)
        return Placement(arena, slots, cache, pageable, None)


def _unpinned(gguf: GGUFFile, layout: ExpertLayout, err: ConfigError) -> MmapArena:
    note(
        f"warning: {str(err).split(': ', 1)[-1]}. Falling back to the file's pageable mapping: every "
        "decode miss runs on the CPU and prefill copies misses at pageable speed (~8.6 GB/s instead "
        "of ~55 pinned)"
    )
    return MmapArena(gguf, layout)


def _low_ram(
    gguf: GGUFFile,
    layout: ExpertLayout,
    n_slots: int,
    rows: int,
    profile: Profile | None,
    decode_rows: int,
    grow: bool,
    kernels: Any,
) -> Placement:
    """The three tiers (tiers/ram.py): fill the slots from the mapping through the ring, then pin the
    arena's choice, `rows` experts at most, and read every other non-resident from the mapping."""
    ring: GpuRing | None = None
    pageable = False
    try:
        ring = GpuRing(ring_buffer_bytes(layout.slot_bytes))
    except ConfigError as err:  # as when the arena cannot be pinned: all from the pageable mapping
        _unpinned(gguf, layout, err)
        pageable = True
    per = per_segment(layout.slot_bytes, n_slots, layout.n_total, grow)
    slots = DeviceSlots(n_slots, layout.strides, kernels, pageable, ring, per)
    cache = ExpertCache(layout, n_slots, slots, MmapArena(gguf, layout))
    cache.fill(profile)
    slots.sync()
    if pageable:
        return Placement(cache.arena, slots, cache, True, ring)
    held = choose_held(cache.where >= 0, cache.borrowed_residents(), rows, profile)
    try:
        arena = PinnedArena(gguf, layout, held)
    except ConfigError as err:  # the pageable fallback's own copies, as without a budget
        slots.ring = None
        slots.pageable = True
        cache.arena = _unpinned(gguf, layout, err)
        return Placement(cache.arena, slots, cache, True, None)
    slots.ranges = arena.ranges()
    cache.rehome(arena, decode_rows)
    assert ring is not None
    note(
        f"low-RAM mode (room for {rows:,} arena rows): {cache.resident():,} experts in VRAM, "
        f"{int(held.sum()):,} in pinned RAM, {int((~cache.in_ram & (cache.where < 0)).sum()):,} only in the "
        f"file's mapping (decode: on the CPU; prefill: staged through a {ring.nbytes() / 2**20:,.1f} MiB "
        "bounce ring)"
    )
    return Placement(arena, slots, cache, False, ring)


def check_staging(p: Placement) -> None:
    """The GPU reads no pageable memory in place: such experts reach it only through staging into borrowed
    slots, which must hold a layer's misses; raises ConfigError where they cannot."""
    cache = p.cache
    if cache.n_slots == 0 and cache.resident() < cache.layout.n_total:
        raise ConfigError(
            "expert_cache",
            "off",
            "experts in pageable memory (an arena that could not be "
            "pinned, or beyond ram_budget_mib) reach the GPU only through staging into "
            "borrowed slots, and there are none; give the cache some VRAM (--expert-cache)",
        )
    st = cache.staging()
    if st is not None and not st.complete:
        missing = int((cache.where < 0).sum(axis=1).max())
        where = "in pageable memory" if p.pageable else "partly in the file's mapping (ram_budget_mib)"
        raise ConfigError(
            "expert_cache",
            cache.n_slots,
            f"with the arena {where} every prefill pass stages each layer's misses "
            f"(up to {missing:,}) into borrowed slots, and {cache.n_slots:,} slots cannot hold "
            "them; give the cache more VRAM (--expert-cache, --vram-budget-mib) or allow pinning "
            "(ulimit -l)",
        )

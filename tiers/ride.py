"""Admission riding the misses' own reads: how the GPU's cache policy brings experts in without a copy.

A swap done by copy moves an expert over PCIe twice: once as the miss the decode kernels read in place, once
as the copy into its slot, and the copy shares the link with the misses of the passes beside it. Zero-copy
reads are not kept in L2 (a second read of the same pinned bytes, or a copy right after, costs the first read
again: H100, 48 MB in 989 us, then 1,003), so the slot must be written by the kernel that reads the miss. A
newcomer the policy admits to *ride* is booked into its slot (its leaver goes back to the arena) and marked
riding: the decode table still reads it from the arena, and the next decode pass that routes it copies the
bytes it reads into the slot and points the table there (`admit`, strata/gpu/kernels/tiers.py): the bytes
cross PCIe once, as the miss they were. After that pass the host lands it here (`land_rides`, from the pass's
routed ids and what the device held for it); a rider no decode pass routed for a few policy windows is copied
as before (`stop_riding`).

On the device a rider's `where` is -3 - slot (`where_kinds`) and `pend` [L, P, E] holds its slot's part
addresses (0 for every other expert).
"""

from __future__ import annotations

import numpy as np

Placement = tuple[int, int, int]  # (slot, MoE layer, expert)


class Riding:
    """ExpertCache's riders: booked into a slot, landed by the first decode pass that routes them."""

    where: np.ndarray
    booked: np.ndarray
    owner: np.ndarray
    cpu: np.ndarray
    riding: np.ndarray  # [L, E] bool
    ride_since: np.ndarray  # [L, E] int64: when each rider started riding (ride's `since`)
    pend: np.ndarray  # [L, P, E] int64
    dirty: list[tuple[int, int]] | None
    expert_bytes: np.ndarray
    rides: int
    ride_bytes: int
    version: int

    def where_kinds(self) -> np.ndarray:
        """[L, E] int32 the device's counters and kernels read: the slot (>= 0), -1 read over PCIe, -2 the
        CPU's share, -3 - slot a rider."""
        kinds = np.where(self.cpu, np.int32(-2), self.where)
        return np.where(self.riding, -3 - self.booked, kinds).astype(np.int32)

    def ride(self, placements: list[Placement], since: int = 0) -> None:
        """Book each (slot, layer, expert) and let its bytes ride the next decode pass that routes it;
        `since`: the caller's clock (policy windows), for `stop_riding`."""
        for s, li, e in placements:
            self._release(s, li, e)
            self.riding[li, e] = True
            self.ride_since[li, e] = since
            self.pend[li, :, e] = [self._slot_addr(p, s) for p in range(3)]
            if self.dirty is not None:
                self.dirty.append((li, e))
        self.version += 1

    def riders(self) -> np.ndarray:
        """[L, E] int32: the slot each rider waits in, -1 elsewhere (what the device holds: `land_rides`)."""
        return np.where(self.riding, self.booked, -1).astype(np.int32)

    def land_rides(self, routed: np.ndarray, held: np.ndarray) -> int:
        """A decode pass routed ids [L, n, A] with `held` (`riders()` as pushed for it) on the device: each
        rider it routed was copied into its slot by the pass, so the tables read it there from now on. A rider
        the host has since moved (evicted, copied instead) is left to the change that moved it, which the
        device gets after the pass. Returns how many landed."""
        n = 0
        for li, e in zip(*np.nonzero(held >= 0)):
            s = int(held[li, e])
            if not (routed[li] == e).any() or not self.riding[li, e] or self.booked[li, e] != s:
                continue
            self._land(s, int(li), int(e))
            n += 1
            self.ride_bytes += int(self.expert_bytes[li])
        self.rides += n
        return n

    def stop_riding(self, before: int | None = None) -> list[Placement]:
        """Riders still waiting (those that started riding before `before` on ride's clock; None: all) go back
        to an ordinary booking: the placements to copy, then `land`."""
        waiting = self.riding if before is None else self.riding & (self.ride_since < before)
        out = [(int(self.booked[li, e]), int(li), int(e)) for li, e in zip(*np.nonzero(waiting))]
        for _, li, e in out:
            self._unride(li, e)
        if out:
            self.version += 1
        return out

    def _unride(self, li: int, e: int) -> None:
        """Expert e of layer li no longer rides (landed, copied, or evicted)."""
        if self.riding[li, e]:
            self.riding[li, e] = False
            self.pend[li, :, e] = 0
            if self.dirty is not None:
                self.dirty.append((li, e))

"""Admission riding the misses' own reads: how the GPU's cache policy brings experts in without a copy.

A newcomer the policy admits by copy crosses PCIe as the copy into its slot, beside the misses of the passes
around it, and hits from the first pass after the copy landed. Zero-copy reads are not kept in L2 (a second
read of the same pinned bytes, or a copy right after, costs the first read again: H100, 48 MB in 989 us, then
1,003), so a slot can take a miss's bytes only from the kernel that reads the miss. A newcomer the policy
admits to *ride* is booked into its slot (its leaver goes back to the arena) and marked riding: the decode
table still reads it from the arena, and the next decode pass that routes it copies the bytes it reads into
the slot and points the table there (`admit`, strata/gpu/kernels/tiers.py). After that pass the host lands
it here (`land_rides`, from the pass's routed ids and what the device held for it).

What that changes (tiers/sim.py replays both): an expert that is used after its admission crosses the link
once either way (as the copy, or as the first use's miss), but a rider the routing does not come back to costs
nothing, where its copy was spent for nothing, and no copy competes with the misses for the link. On the
calibrated trace (2 layers, 230 of 512 slots, 4-token windows, 6 newcomers a window, as the 80B at 24 GiB) the
experts crossing the link a token fell from 5.15 by copy to 4.92 riding (static: 9.94); riders hit later
(75.4% against 81.7%). A rider waits until it is routed or the policy lets it go: copying the ones not routed
within two windows moved more bytes (5.13). The swap budget bounds riders too: unbounded, they moved fewer in
the simulator (3.68) but decoded slower on the GPU (H100, the 80B locality file at 24 GiB, adaptive with the
CPU share: 70.1 tok/s against static's 97.4 at b=1, 103 newcomers a token where the budget allows 37; each
rider's admission runs before the layer's experts, and the policy's host work grows with them).

On the device a rider's `where` is -3 - slot (`where_kinds`) and `pend` [L, P, E] holds its slot's part
addresses (0 for every other expert).
"""

from __future__ import annotations

import numpy as np

Placement = tuple[int, int, int]  # (slot, MoE layer, expert)
ADMISSIONS = ("copy", "ride")  # how newcomers come in (tiers/sim.py's `admit`)


class Riding:
    """ExpertCache's riders: booked into a slot, landed by the first decode pass that routes them."""

    where: np.ndarray
    booked: np.ndarray
    owner: np.ndarray
    cpu: np.ndarray
    riding: np.ndarray  # [L, E] bool
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

    def ride(self, placements: list[Placement]) -> None:
        """Book each (slot, layer, expert) and let its bytes ride the next decode pass that routes it."""
        for s, li, e in placements:
            self._release(s, li, e)
            self.riding[li, e] = True
            self.pend[li, :, e] = self._slot_addrs([s])[0]
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
        n_l, n_e = held.shape
        used = np.zeros((n_l, n_e), bool)
        used[np.arange(n_l)[:, None], routed.reshape(n_l, -1)] = True
        li, e = np.nonzero(used & (held >= 0) & self.riding & (self.booked == held))
        if len(li):  # all at once (this runs between decode passes); pend holds their slots' addresses
            self._land_all(li, e, held[li, e], self.pend[li, :, e])
            self.ride_bytes += int(self.expert_bytes[li].sum())
        self.rides += len(li)
        return len(li)

    def stop_riding(self) -> list[Placement]:
        """Every rider still waiting goes back to an ordinary booking (before the cache resizes): the
        placements to copy, then `land`."""
        out = [(int(self.booked[li, e]), int(li), int(e)) for li, e in zip(*np.nonzero(self.riding))]
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

"""SequenceState: everything one sequence carries between forward calls.

The scheduler moves sequences between solo and batch slots and restores cached prefixes, so the
state is an explicit object with checkpoint/restore rather than hidden inside the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.kvcache import KVCache


@dataclass(slots=True)
class SequenceState:
    kv: KVCache
    n_past: int = 0  # tokens already folded into the state
    tokens: list[int] = field(default_factory=list)  # every token consumed, for penalties and prefix reuse

    def checkpoint(self) -> SequenceState:
        """An independent copy; the original keeps evolving."""
        return SequenceState(self.kv.copy(), self.n_past, list(self.tokens))

    def restore(self, snap: SequenceState) -> None:
        """Become an independent copy of `snap` (snap stays usable for further restores)."""
        copy = snap.checkpoint()
        self.kv, self.n_past, self.tokens = copy.kv, copy.n_past, copy.tokens

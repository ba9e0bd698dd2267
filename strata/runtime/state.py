"""SequenceState: everything one sequence carries between forward calls.

The scheduler moves sequences between solo and batch slots and restores cached prefixes, so the
state is an explicit object with checkpoint/restore rather than hidden inside the model.

Attention layers keep their keys and values in `kv`. Hybrid architectures (Gated DeltaNet, n-gram
embeddings, QSA indexers) also keep fixed-size per-layer state that cannot be truncated like a KV
cache; it lives in `layers`, keyed by (kind, layer), and is copied by checkpoint().
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from strata.runtime.kvcache import KVCache
from strata.tiers.telemetry import TierUse


class LayerState(Protocol):
    """Per-layer recurrent state: anything that can make an independent copy of itself."""

    def copy(self) -> LayerState: ...


S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A sequence's per-layer state as it stood at position n_past inside a longer pass, in host RAM (a
    hybrid model's prefix-cache checkpoint taken inside a wide prompt pass, `SequenceState.snapshot`)."""

    n_past: int
    layers: dict[tuple[str, int], LayerState]


@dataclass(slots=True)
class SequenceState:
    kv: KVCache
    n_past: int = 0  # tokens already folded into the state
    tokens: list[int] = field(default_factory=list)  # every token consumed, for penalties and prefix reuse
    layers: dict[tuple[str, int], LayerState] = field(default_factory=dict)  # e.g. ("deltanet", 0)
    # this sequence's expert-tier counters; not part of checkpoints (a restored prefix keeps the
    # counters of the request that restores it)
    experts: TierUse = field(default_factory=TierUse)

    def checkpoint(self) -> SequenceState:
        """An independent copy; the original keeps evolving."""
        layers = {key: st.copy() for key, st in self.layers.items()}
        return SequenceState(self.kv.copy(), self.n_past, list(self.tokens), layers)

    def snapshot(self, at: Checkpoint | None = None) -> SequenceState:
        """Like checkpoint(), but parts that live on a device are copied to host RAM (`to_host`); restoring
        from it brings them back (their copy() allocates on the device again). at: the state as it stood at
        a position inside its last pass, whose per-layer state the model kept there (the KV's cells before
        that position do not change after it)."""

        def host(part: object) -> object:
            return getattr(part, "to_host", part.copy)()  # type: ignore[attr-defined]

        if at is not None:
            return SequenceState(
                self.kv.to_host(at.n_past), at.n_past, self.tokens[: at.n_past], dict(at.layers)
            )
        layers = {key: host(st) for key, st in self.layers.items()}
        return SequenceState(host(self.kv), self.n_past, list(self.tokens), layers)  # type: ignore[arg-type]

    def restore(self, snap: SequenceState) -> None:
        """Become an independent copy of `snap` (snap stays usable for further restores)."""
        copy = snap.checkpoint()
        self.kv, self.n_past, self.tokens, self.layers = copy.kv, copy.n_past, copy.tokens, copy.layers

    def layer(self, kind: str, index: int, cls: type[S]) -> S:
        """The `kind` state of layer `index`, checked to be a `cls`."""
        st = self.layers[(kind, index)]
        assert isinstance(st, cls), f"{kind} state of layer {index} is a {type(st).__name__}"
        return st

    def nbytes(self) -> int:
        """Bytes held: attention KV plus every per-layer state that reports its size."""
        return self.kv.nbytes() + sum(getattr(st, "nbytes", lambda: 0)() for st in self.layers.values())

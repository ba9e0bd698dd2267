"""Where each routed expert's bytes are, read from the GGUF header alone.

An expert is three matrices (gate and up [F, D], down [D, F]), each a slice of a 3-D tensor
[E, rows, row_bytes] in the file, each in its own quant type. The tiers keep experts part-major:
three stores (gate, up, down), each a row of `stride` bytes per expert. A slot in VRAM and a
place in the pinned arena are such rows, so any expert of any layer fits any slot.

Legend: L = MoE layers, E = experts per layer, P = 3 parts (gate, up, down).
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.gguf import GGUFFile
from strata.gguf.names import T, tensor

PARTS = (T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP)
PART_NAMES = ("gate", "up", "down")
# each part's row starts on this boundary: the kernels read weights with 16-byte loads, and a copy
# engine moves aligned rows fastest
ALIGN = 256


@dataclass(frozen=True, slots=True)
class Part:
    """One expert's slice of a 3-D expert tensor."""

    name: str  # the GGUF tensor
    qtype: int
    rows: int
    cols: int
    row_bytes: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True, slots=True)
class ExpertLayer:
    layer: int  # the model's layer index
    parts: tuple[Part, Part, Part]  # gate, up, down

    @property
    def nbytes(self) -> int:
        """Bytes one expert of this layer occupies (what a miss reads)."""
        return sum(p.nbytes for p in self.parts)


@dataclass(frozen=True, slots=True)
class ExpertLayout:
    n_expert: int
    top_k: int
    layers: tuple[ExpertLayer, ...]  # the MoE layers, in model order
    strides: tuple[int, int, int]  # bytes per expert row in each part's store (max over layers, aligned)

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ExpertLayout | None:
        """The layout of every routed expert, or None for a model without them."""
        layers = []
        for i in range(gguf.arch_get("block_count", 0)):
            names = [tensor(k, i) for k in PARTS]
            if not all(n in gguf.tensors for n in names):
                continue
            infos = [gguf.tensors[n] for n in names]
            layers.append(
                ExpertLayer(
                    i,
                    tuple(
                        Part(t.name, int(t.qtype), t.shape[-2], t.shape[-1], t.row_bytes)  # type: ignore[arg-type]
                        for t in infos
                    ),
                )
            )
        if not layers:
            return None
        n_expert = gguf.tensors[layers[0].parts[0].name].shape[0]
        strides = tuple(_align(max(l.parts[p].nbytes for l in layers)) for p in range(3))
        top_k = int(gguf.arch_get("expert_used_count", 0))
        return cls(n_expert, top_k, tuple(layers), strides)  # type: ignore[arg-type]

    @property
    def slot_bytes(self) -> int:
        """VRAM one slot takes: a row in each of the three stores."""
        return sum(self.strides)

    @property
    def n_total(self) -> int:
        """Experts in the model (every layer's)."""
        return len(self.layers) * self.n_expert

    @property
    def total_bytes(self) -> int:
        """The experts' own bytes (as in the file)."""
        return sum(l.nbytes for l in self.layers) * self.n_expert

    def index(self) -> dict[int, int]:
        """Model layer -> position among the MoE layers."""
        return {l.layer: j for j, l in enumerate(self.layers)}

    def routed_bytes_per_token(self) -> int:
        """Expert bytes one token reads: top_k experts in every MoE layer."""
        return self.top_k * sum(l.nbytes for l in self.layers)


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN

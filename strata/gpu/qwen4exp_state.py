"""A qwen4exp sequence's own device state beside its KV (strata.gpu.qwen4exp): the QSA records and PLE conv
windows in one VRAM buffer, its host copy for the prefix cache, and the PLE n-gram history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.gpu.pinned import to_pinned
from strata.gpu.runtime import cupy_module
from strata.tiers.budget import Ledger


class ExtraState:
    """One sequence's QSA records and PLE windows in VRAM (float32, zero at the start); the row table carries
    the address (column STATE_COL of strata.gpu.qwen4exp)."""

    def __init__(self, ledger: Ledger, floats: int) -> None:
        cp = cupy_module()
        self.ledger, self.floats = ledger, floats
        ledger.take(4 * floats, "QSA and PLE state for a sequence")
        self.buf = cp.zeros(max(1, floats), cp.float32)
        cp.cuda.get_current_stream().synchronize()  # made here, used on the model's stream

    def address(self) -> int:
        return int(self.buf.data.ptr)

    def device_buffers(self) -> list[Any]:
        """What a pass advances (a graph's warm-up run puts it back)."""
        return [self.buf]

    def copy(self) -> ExtraState:
        out = ExtraState(self.ledger, self.floats)
        out.buf[...] = self.buf
        cupy_module().cuda.get_current_stream().synchronize()
        return out

    def nbytes(self) -> int:
        return 4 * self.floats

    def to_host(self) -> HostExtra:
        return HostExtra(self.ledger, self.floats, to_pinned(self.buf))

    def __del__(self) -> None:
        self.ledger.give(4 * self.floats)


class HostExtra:
    """An ExtraState in host RAM (the prefix cache's copy); copy() brings it back to the GPU."""

    def __init__(self, ledger: Ledger, floats: int, host: np.ndarray) -> None:
        self.ledger, self.floats, self.host = ledger, floats, host

    def copy(self) -> ExtraState:
        out = ExtraState(self.ledger, self.floats)
        out.buf.set(self.host)
        cupy_module().cuda.get_current_stream().synchronize()
        return out

    def nbytes(self) -> int:
        return self.host.nbytes


@dataclass(slots=True)
class PLEHistory:
    """The last ngram - 1 token ids of a sequence (EOS before its start): the n-gram hash's input."""

    ids: np.ndarray

    def copy(self) -> PLEHistory:
        return PLEHistory(self.ids.copy())

    def nbytes(self) -> int:
        return self.ids.nbytes

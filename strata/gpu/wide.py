"""A lone prompt's wide pass under tiers (strata.gpu.plan.WIDE_ROWS; GpuModel._pass runs it): every layer over
chunk-sized parts of the pass's rows, so that one staging of a layer's missing experts serves them all. A part
is the chunk's activation buffers over a slice of the pass's residual rows, with the layer's tier counters and
routed ids at its own rows; a hybrid prompt's prefix-cache checkpoints inside the pass are its recurrent state
copied to host memory as the parts reach them (GpuModel.forward_marked).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

from strata.gpu.deltanet import HostRecurrent, RecurrentState
from strata.gpu.layers import Activations, LayerWeights
from strata.gpu.pinned import snapshot_pool
from strata.gpu.runtime import DEVICE_TO_HOST, cupy_module


def part_of(act: Activations, start: int, m: int) -> Activations:
    """A wide pass's part: the chunk's buffers over residual rows [start, start + m)."""
    part = copy.copy(act)
    part.x = act.x[start : start + m]
    return part


def rows_from(layer: LayerWeights, start: int) -> LayerWeights:
    """layer for a part whose rows begin at `start` of its pass: tier counters and routed ids at theirs."""
    t = layer.tier
    if t is None or start == 0:
        return layer
    route = t.route + 4 * start * t.top_k
    return dataclasses.replace(layer, tier=dataclasses.replace(t, counts=t.counts[start:], route=route))


class Capture:
    """The recurrent state of one sequence at one position inside a pass, copied layer by layer into pinned
    host memory as the pass's parts reach it (the copies queue on the model's stream)."""

    def __init__(self, rec: RecurrentState) -> None:
        pool = snapshot_pool()
        self.rec = rec
        self.host = HostRecurrent(
            rec.ledger,
            rec.dims,
            rec.n_layer,
            pool.empty(rec.conv.shape, np.float32),
            pool.empty(rec.ssm.shape, np.float32),
        )

    def take(self, j: int, stream: Any) -> None:
        """DeltaNet layer j's conv window and matrices, as the stream has them now."""
        cp = cupy_module()
        for dev, host in ((self.rec.conv, self.host.conv), (self.rec.ssm, self.host.ssm)):
            off, nbytes = 4 * j * (dev.size // self.rec.n_layer), 4 * (dev.size // self.rec.n_layer)
            cp.cuda.runtime.memcpyAsync(
                host.ctypes.data + off, dev.data.ptr + off, nbytes, DEVICE_TO_HOST, stream.ptr
            )

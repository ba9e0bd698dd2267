"""How decode misses are split between PCIe and the CPU pool (`--pcie-frac`), and the probe it comes from.

A decode row's miss is either read by the GPU from pinned RAM over PCIe (zero-copy, inside the graph) or
computed on the CPU pool from the same RAM while the GPU computes the rest of the layer; the layer then
waits for whichever side finishes last.

Decode splits per layer and token (`take_table`): the graph's publish counts the layer's m distinct PCIe
misses and gives the CPU take[n, m] of them, the k that makes max(GPU: BASE_S + (m - k) g, CPU: fixed + k c)
least, with g and c one expert's time over PCIe and on the CPU pool. `--pcie-frac f` gives the CPU the
nearest whole (1 - f) m instead. A fixed set of CPU experts (the split of before, still `choose` below) left
one side waiting whenever routing gave it more than its average; per token the split follows each layer's
count.

`choose` is the whole-layer arithmetic: with M miss bytes a layer, a share c on the CPU costs

    GPU: (1 - c) M / pcie        CPU: c M / (cpu * CPU_EFFICIENCY) + fixed

and a layer with a share costs the slower side plus SERIAL_S. It sets the fixed split of the misses that only
the CPU can read: under `--ram-budget-mib` a share m of the misses lives only in the file's mapping, which the
GPU cannot read: the CPU takes at least m, and reads those at the mapping's rate when that is the slower (a
cold page cache: the disk); the best share makes the two sides equal, c = (M / pcie - fixed) / (M / pcie +
M / cpu'), and is taken only when it beats PCIe alone; `strata plan` shows it from given rates. `pcie` is the
in-graph zero-copy rate (the probed rate times what the kernels reach of it), `cpu` the CPU pool's rate on
this model's experts with the GPU reading RAM beside it. The probe measures both at start-up and keeps them
in the cache dir (`--probe` measures again).

Calibration (H200 host, 16 cores, 80B shape at a 24 GiB budget; perf/README.md): with a fixed set of CPU
experts and the numpy request, the probe gave the CPU pool 29.9 GB/s beside the GPU and a fixed 86 us a
layer, but inside decode a 29% share took 231 us a layer on the CPU (2.8 MB: 19 GB/s after the fixed part,
so CPU_EFFICIENCY 0.64), and a layer took 334 us where the slower side predicts 251: SERIAL_S is that 83 us.
Every fixed share tried there decoded slower than none. Split per token, with the request and its server
loop compiled (jit/share_ir.py: 37-55 us a request + 42-50 us an expert there), hosts of that kind decode
84.7-94.5 tok/s at b=1 against 77.9-78.4 over PCIe alone, and 123.4 at b=4 against 93.5.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from strata.errors import ConfigError

# in-graph zero-copy reads reached this share of the probed PCIe rate (80B shape, 24 GiB budget, H200: 462 MB
# of misses a token at 73.4 tok/s, about 37 GB/s of a 50 GB/s probe)
ZERO_COPY_EFFICIENCY = 0.74
MIN_SHARE = 0.05  # below this, the per-layer hand-off costs more than the CPU saves: give it nothing
CPU_EFFICIENCY = 0.64  # the CPU pool's rate inside decode / its probed rate (see the calibration above)
SERIAL_S = 83e-6  # a layer with a share, beyond its slower side


@dataclass(frozen=True, slots=True)
class Rates:
    """Probed rates, bytes/s, and the CPU hand-off's fixed cost, s. `zero_copy` and `cpu` are measured with
    both sides running at once, as decode runs them: they read the same RAM, so each alone is faster."""

    zero_copy: float
    copy_engine: float
    cpu: float
    cpu_fixed_s: float
    zero_copy_alone: float
    cpu_alone: float


@dataclass(frozen=True, slots=True)
class Split:
    pcie_frac: float  # share of the misses read over PCIe; the rest run on the CPU
    layer_s: float  # predicted time of one layer's misses, s
    gpu_alone_s: float
    cpu_alone_s: float
    chosen: str  # "auto" or "--pcie-frac"

    def why(self, miss_bytes: float) -> str:
        """The line start-up and `strata plan` print."""
        return (
            f"decode misses: {miss_bytes / 1e6:,.1f} MB a layer; over PCIe alone "
            f"{self.gpu_alone_s * 1e6:,.0f} us, on the CPU alone {self.cpu_alone_s * 1e6:,.0f} us -> "
            f"{self.chosen} {self.pcie_frac:.2f} ({1 - self.pcie_frac:.0%} on the CPU): "
            f"{self.layer_s * 1e6:,.0f} us a layer"
        )


def choose(
    miss_bytes: float,
    pcie_bps: float,
    cpu_bps: float,
    fixed_s: float,
    given: float | None = None,
    forced: float = 0.0,
    mapped_bps: float = float("inf"),
) -> Split:
    """The split for M = miss_bytes per layer and token (given: --pcie-frac, else the balance point);
    forced: the share the CPU must take (misses only the file's mapping holds), read at min(the CPU's
    rate, mapped_bps)."""
    inf = float("inf")
    gpu = miss_bytes / pcie_bps if pcie_bps > 0 else inf
    cpu = miss_bytes / cpu_bps if cpu_bps > 0 else inf

    cpu /= CPU_EFFICIENCY
    # s to compute a whole M read from the mapping: the slower of the CPU and the mapping, of those known
    mapped = max(cpu if cpu < inf else 0.0, miss_bytes / mapped_bps if 0 < mapped_bps < inf else 0.0)

    def layer(c: float) -> float:
        if c <= 0:
            return gpu
        side = forced * mapped + ((c - forced) * cpu if c > forced else 0.0) + fixed_s
        return max((1 - c) * gpu, side) + SERIAL_S

    if given is not None:
        c = max(1 - given, forced)
        return Split(1 - c, layer(c), gpu, layer(1.0), "--pcie-frac")
    if forced > 0:  # the CPU's part is not optional: the balance point, or the forced share past it
        bal = (gpu - fixed_s - forced * mapped + forced * cpu) / (gpu + cpu) if cpu != inf else forced
        c = min(1.0, max(forced, bal)) if gpu != inf else 1.0
        return Split(1 - c, layer(c), gpu, layer(1.0), "auto")
    if miss_bytes <= 0 or cpu == inf:
        return Split(1.0, layer(0.0), gpu, layer(1.0), "auto")
    c = min(1.0, max(0.0, (gpu - fixed_s) / (gpu + cpu))) if gpu != inf else 1.0
    if c < MIN_SHARE or layer(c) >= layer(0.0):
        c = 0.0
    return Split(1 - c, layer(c), gpu, layer(1.0), "auto")


# a decode layer's routed experts with every one in VRAM (H200, 80B shape, one row: perf/bench_misses.py's 23
# us): the GPU's side of a layer costs this plus its misses' bytes over PCIe
BASE_S = 23e-6
# what a layer that hands the CPU a share costs beyond its slower side: the publish (the rows to the mailbox,
# a system fence), the CPU seeing the ticket, the collect's polls and its read of the answer over PCIe. Fitted
# to five H200 runs of 2026-12-04 (80B at 24, 12 and 8 GiB, 30B at 12 and 8 GiB, tiers/plan.py's arithmetic):
# without it the planner ran 4.5-19% fast, with 15 us -1% to +9%
HANDOFF_S = 15e-6
# The table counts the CPU's experts at the probed rate: the request is compiled for any row count
# (jit/share_ir.py) and the probe times that same request. On the H200 host (80B shape, 24 GiB, one call):
# counting requests of 2-8 rows at CPU_EFFICIENCY instead (the numpy request's calibration) gave b=4 108.3
# tok/s, at the probed rate 123.4 (PCIe alone 93.5); one row at CPU_EFFICIENCY had cost b=1 3.2 tok/s before.


def take_table(
    rows: int,
    a: int,
    expert_bytes: float,
    pcie_bps: float,
    cpu_bps: float,
    fixed_s: float,
    given: float | None = None,
) -> np.ndarray:
    """[rows + 1, rows * a + 1] int32: how many of a decode layer's m distinct PCIe misses the CPU takes in a
    pass of n rows (cpu_publish reads entry [n, m]). given (--pcie-frac f): the nearest whole share,
    (1 - f) m. Else the k that makes the layer shortest: the GPU's side BASE_S + (m - k) g against the
    CPU's fixed + k c, the slower plus HANDOFF_S, g and c one expert's time over PCIe and on the CPU pool (at
    its probed rate, whatever the rows: a request reads each expert once); no CPU side at all when k is 0, so
    a layer whose misses are too few for the hand-off keeps them on PCIe. Made per layer and token, the split
    meets each layer's own count of misses, where a fixed set of CPU experts leaves one side waiting on the
    other whenever routing gives it more than its average."""
    m = np.arange(rows * a + 1)
    if given is not None:
        return np.tile(np.floor((1.0 - given) * m + 0.5).astype(np.int32), (rows + 1, 1))
    g, c = _per_expert(expert_bytes, pcie_bps, cpu_bps)
    t = np.maximum(BASE_S + (m[:, None] - m[None, :]) * g, fixed_s + m[None, :] * c) + HANDOFF_S
    t[:, 0] = BASE_S + m * g
    t[m[None, :] > m[:, None]] = np.inf
    out = np.tile(np.argmin(t, axis=1).astype(np.int32), (rows + 1, 1))
    out[0] = 0  # no rows, no misses
    return out


def _per_expert(expert_bytes: float, pcie_bps: float, cpu_bps: float) -> tuple[float, float]:
    """(s over PCIe, s on the CPU pool) of one expert."""
    return expert_bytes / pcie_bps, expert_bytes / cpu_bps if cpu_bps > 0 else float("inf")


def expect(
    take: np.ndarray,
    a: int,
    miss_rate: float,
    expert_bytes: float,
    pcie_bps: float,
    cpu_bps: float,
    fixed_s: float,
) -> tuple[float, float]:
    """(share of the misses read over PCIe, mean s of a layer's experts) for one decode row under uniform
    routing: m ~ Binomial(a, miss_rate) misses a layer, take[1, m] of them on the CPU."""
    from math import comb

    g, c = _per_expert(expert_bytes, pcie_bps, cpu_bps)
    over = taken = layer = 0.0
    for m in range(a + 1):
        p = comb(a, m) * miss_rate**m * (1 - miss_rate) ** (a - m)
        k = int(take[1, m])
        over += p * (m - k)
        taken += p * k
        layer += p * (max(BASE_S + (m - k) * g, fixed_s + k * c) + HANDOFF_S if k else BASE_S + m * g)
    return (over / (over + taken) if over + taken else 1.0), layer


def token_split(
    rows: int,
    a: int,
    miss_rate: float,
    expert_bytes: float,
    pcie_bps: float,
    cpu_bps: float,
    fixed_s: float,
    given: float | None = None,
) -> tuple[np.ndarray, float, float, str]:
    """The per-token split start-up and `strata plan` make: (take_table, share of the misses over PCIe and
    the mean s of a layer's experts for one row, the line they print)."""
    take = take_table(rows, a, expert_bytes, pcie_bps, cpu_bps, fixed_s, given)
    frac, layer_s = expect(take, a, miss_rate, expert_bytes, pcie_bps, cpu_bps, fixed_s)
    alone = expect(take * 0, a, miss_rate, expert_bytes, pcie_bps, cpu_bps, fixed_s)[1]
    half = a * rows // 2
    how = "auto" if given is None else f"--pcie-frac {given:.2f}"
    line = (
        f"decode misses ({how}): the CPU takes {take[1, : a + 1].tolist()} of a layer's 0..{a} misses "
        f"(one row; {take[-1, half]} of {half} in {rows} rows): {1 - frac:.0%} of them, "
        f"{layer_s * 1e6:,.0f} us a layer's experts against {alone * 1e6:,.0f} over PCIe alone"
    )
    return take, frac, layer_s, line


def parse_pcie_frac(value: str, flag: str = "--pcie-frac") -> float | None:
    """auto -> None; else a share in [0, 1]."""
    if value == "auto":
        return None
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if not 0.0 <= v <= 1.0:
        raise ConfigError(
            flag, value, "must be auto or a share of the misses read over PCIe, 0..1 (0: all on the CPU)"
        )
    return v


class ProbeCache:
    """Probed rates, kept as JSON in the cache dir by a key naming the GPU, the CPUs and the experts' shape,
    so a restart skips the probe (`--probe` measures again). A file that cannot be read is measured again."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> Rates | None:
        try:
            got = json.loads(self.path.read_text()).get(key)
            return Rates(**got) if isinstance(got, dict) else None
        except (OSError, ValueError, TypeError):
            return None

    def put(self, key: str, rates: Rates) -> None:
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[key] = asdict(rates)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError:
            pass  # a read-only cache dir only costs the next start a probe

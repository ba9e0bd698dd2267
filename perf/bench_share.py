"""The CPU share's fixed cost a layer (jit/share.py): `CpuShare.layer` on experts so small that their compute
is next to nothing, so what is timed is the host's own work per request (the selection, the task tables, the
two rounds' hand-offs, silu). Not a test: prints the median and 10th percentile per row count.

    python perf/bench_share.py [--threads 1,2] [--reps 2000]

The decode graph waits for this on every MoE layer whose misses the CPU takes (`--pcie-frac` < 1): on the
H200 host the share did not pay at batch 1 while this part was 86-108 us (perf/README.md, "the CPU's share").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from quant_blocks import random_blocks

from strata.jit.kernels import Kernels
from strata.jit.share import CpuShare, ExpertBytes, Mailbox

L, E, A, D, ROWS = 4, 64, 10, 256, 8
F = 32  # gate and up rows; down keeps 256 columns (one Q4_K block a row)


def _share(kernels: Kernels, threads: int) -> tuple[CpuShare, list]:
    """A server over L layers of E tiny Q4_K experts, every other one the CPU's; the raw arrays kept alive."""
    shapes = [(F, D), (F, D), (D, 256)]
    raws = [[np.stack([random_blocks(T.Q4_K, r, c, seed=e) for e in range(E)]) for r, c in shapes]]
    raws = raws * L  # every layer the same bytes: what is timed does not depend on them
    ex = ExpertBytes(
        np.array([[int(r.ctypes.data) for r in row] for row in raws], np.int64),
        np.array([[r.shape[1] * r.shape[2] for r in row] for row in raws], np.int64),
        np.full((L, 3), int(T.Q4_K), np.int64),
        np.array([[F, F, D]] * L, np.int64),
        np.array([[r.shape[2] for r in row] for row in raws], np.int64),
    )
    buf = np.zeros(Mailbox.nbytes(ROWS, A, D) + 64, np.uint8)
    box = Mailbox.over(buf[-buf.ctypes.data % 64 :], ROWS, A, D)
    mine = np.zeros((L, E), bool)
    mine[:, ::2] = True
    return CpuShare(kernels, ex, mine, box, threads), [raws, buf]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--reps", type=int, default=2000)
    a = ap.parse_args()
    kernels = Kernels(Path(tempfile.mkdtemp(prefix="strata-bench-share-")))
    rng = np.random.default_rng(0)
    for threads in (int(x) for x in a.threads.split(",")):
        srv, _keep = _share(kernels, threads)
        try:
            for n in (int(x) for x in a.rows.split(",")):
                h = rng.standard_normal((n, D)).astype(np.float32)
                ids = np.stack([rng.permutation(E)[:A] for _ in range(n)]).astype(np.int32)
                wts = rng.random((n, A)).astype(np.float32)
                for _ in range(200):
                    srv.layer(1, h, ids, wts)
                ts = []
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    srv.layer(1, h, ids, wts)
                    ts.append(time.perf_counter() - t0)
                print(
                    f"threads {threads} rows {n}: layer() median {np.median(ts) * 1e6:.1f} us, "
                    f"10th percentile {np.percentile(ts, 10) * 1e6:.1f} us",
                    flush=True,
                )
        finally:
            srv.close()


if __name__ == "__main__":
    main()

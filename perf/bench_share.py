"""The CPU share's fixed cost a layer (jit/share.py): `CpuShare.layer` on experts so small that their compute
is next to nothing, so what is timed is the host's own work per request (the selection, the task tables, the
two rounds' hand-offs, silu). Not a test: prints the median and 10th percentile per row count.

    python perf/bench_share.py [--threads 1,2] [--reps 2000]

The decode graph waits for this on every MoE layer whose misses the CPU takes (`--pcie-frac` < 1): on the
H200 host the share did not pay at batch 1 while this part was 86-108 us (perf/README.md, "the CPU's share").

`--shape 80b` times one-row requests on experts of the 80B shape instead (2048 x 512, Q4_K, 512 a layer, read
cold as decode reads them), K experts a request, and fits the fixed cost a request and the rate.

`--products int8,float` runs each case with the int8-input products (qdot_ir.py, the share's own)
and with the float kernels alone (the share before them), one after the other in the same run. On this
project's 2-core AVX2 machine (2026-12-05, `--shape 80b --threads 2`): float 83.0 us a request + 395 us an
expert (4.5 GB/s), int8 68.2 + 158 (11.2 GB/s).
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
from strata.jit.tasks import Waiter

L, E, A, D, ROWS = 4, 64, 10, 256, 8


class FloatKernels(Kernels):
    """The float kernels alone: every product decodes its weights to floats (the share before qdot_ir.py)."""

    def dot_fn(self, qtype: int) -> None:  # type: ignore[override]
        return None


F = 32  # gate and up rows; down keeps 256 columns (one Q4_K block a row)


def _share(kernels: Kernels, threads: int) -> tuple[CpuShare, list]:
    """A server over L layers of E tiny Q4_K experts; the raw arrays kept alive."""
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
    return CpuShare(kernels, ex, E, box, threads), [raws, buf]


def _share_80b(kernels: Kernels, threads: int, layers: int = 2) -> tuple[CpuShare, list]:
    """A server over `layers` layers of 512 experts of the 80B shape (Q4_K gate and up [512, 2048], down
    [2048, 512]): bytes of 0x01 (a finite Q4_K block), written so every page is real memory."""
    e, d, f = 512, 2048, 512
    shapes = [(f, d), (f, d), (d, f)]
    row_bytes = [c // 256 * 144 for _, c in shapes]
    raws = [[np.ones((e, r, rb), np.uint8) for (r, _), rb in zip(shapes, row_bytes)] for _ in range(layers)]
    ex = ExpertBytes(
        np.array([[int(r.ctypes.data) for r in row] for row in raws], np.int64),
        np.array([[r.shape[1] * r.shape[2] for r in row] for row in raws], np.int64),
        np.full((layers, 3), int(T.Q4_K), np.int64),
        np.array([[f, f, d]] * layers, np.int64),
        np.array([row_bytes] * layers, np.int64),
    )
    buf = np.zeros(Mailbox.nbytes(ROWS, A, d) + 64, np.uint8)
    box = Mailbox.over(buf[-buf.ctypes.data % 64 :], ROWS, A, d)
    return CpuShare(kernels, ex, e, box, threads), [raws, buf]


def _real(kernels: Kernels, threads: list[int], ks: list[int], reps: int) -> None:
    """Median one-row requests of k cold experts each, and the line through them: the fixed cost a request
    (intercept) and the rate (bytes of an expert over the slope)."""
    for t in threads:
        srv, _keep = _share_80b(kernels, t)
        h = np.random.default_rng(0).standard_normal((1, 2048)).astype(np.float32)
        wts = np.ones((1, A), np.float32)
        try:
            med = []
            for k in ks:
                total = []
                for i in range(reps):
                    ids = np.full((1, A), -1, np.int32)
                    ids[0, :k] = (np.arange(k) + 7 * k * i) % 512  # experts nothing read lately
                    t0 = time.perf_counter()
                    srv.layer(i % 2, h, ids, wts)
                    total.append(time.perf_counter() - t0)
                med.append(float(np.median(total)))
                print(
                    f"80b {_name(kernels)} threads {t} experts {k}: request median {med[-1] * 1e6:.1f} us",
                    flush=True,
                )
            if len(ks) > 1:
                slope, fixed = np.polyfit(ks, med, 1)
                print(
                    f"80b {_name(kernels)} threads {t}: {fixed * 1e6:.1f} us a request + "
                    f"{slope * 1e6:.1f} us an expert ({1.769472e6 / slope / 1e9:.1f} GB/s)",
                    flush=True,
                )
        finally:
            srv.close()


def _serve(kernels: Kernels, threads: list[int], reps: int) -> None:
    """One-row requests (5 CPU experts of 10) through the mailbox as the graph makes them (the twins of
    cpu_publish and cpu_collect, spinning): the round trip and the server's own time a request."""
    from strata.gpu.kernels import share as ks

    where = np.where(np.arange(E) % 2 == 1, -1, 0).astype(np.int32)  # odd experts read over PCIe
    take = np.arange(A + 1, dtype=np.int32)  # the CPU takes them all
    rng = np.random.default_rng(0)
    for t in threads:
        srv, _keep = _share(kernels, t)
        box, ticket = srv.box, np.array([int(srv.box.ctl[ks.MB_REQ])], np.int64)
        h = rng.standard_normal((1, D)).astype(np.float32)
        wts = rng.random(A).astype(np.float32)
        x = np.zeros((1, D), np.float32)
        wait, done = Waiter(kernels), int(box.ctl.ctypes.data) + 8 * ks.MB_DONE
        trips = []
        try:
            for i in range(reps + 200):
                ids = rng.permutation(E)[:A].astype(np.int32)
                t0 = time.perf_counter()
                ks.ref_cpu_publish(h, ids, wts, i % L, where, take, box.ctl, box.h, box.ids, box.wts, ticket)
                wait(done, int(ticket[0]) - 1, -1)  # the GIL released, as the GPU waits for the answer
                assert ks.ref_cpu_collect(x, box.ctl, box.out, ticket)
                trips.append(time.perf_counter() - t0)
            busy = srv.busy_s / max(1, srv.requests)
            trip = np.median(trips[200:]) * 1e6
            print(
                f"serve {_name(kernels)} threads {t}: round trip median {trip:.1f} us, the server's own "
                f"{busy * 1e6:.1f} us a request ({srv.requests} requests)",
                flush=True,
            )
        finally:
            srv.close()


def _name(kernels: Kernels) -> str:
    return "float" if isinstance(kernels, FloatKernels) else "int8"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--shape", choices=("tiny", "80b"), default="tiny")
    ap.add_argument("--experts", default="1,2,3", help="--shape 80b: CPU experts a request")
    ap.add_argument(
        "--serve", action="store_true", help="one-row requests through the mailbox: the round trip"
    )
    ap.add_argument("--products", default="int8", help="int8, float or both (int8,float)")
    a = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="strata-bench-share-"))
    for name in a.products.split(","):
        _run(a, {"int8": Kernels, "float": FloatKernels}[name](cache))


def _run(a: argparse.Namespace, kernels: Kernels) -> None:
    if a.shape == "80b":
        _real(kernels, [int(x) for x in a.threads.split(",")], [int(x) for x in a.experts.split(",")], a.reps)
        return
    rng = np.random.default_rng(0)
    if a.serve:
        _serve(kernels, [int(x) for x in a.threads.split(",")], a.reps)
        return
    for threads in (int(x) for x in a.threads.split(",")):
        srv, _keep = _share(kernels, threads)
        try:
            for n in (int(x) for x in a.rows.split(",")):
                h = rng.standard_normal((n, D)).astype(np.float32)
                ids = np.stack([rng.permutation(E)[:A] for _ in range(n)]).astype(np.int32)
                ids[ids % 2 == 1] = -1  # every other expert the CPU's, as the publish marks them
                wts = rng.random((n, A)).astype(np.float32)
                for _ in range(200):
                    srv.layer(1, h, ids, wts)
                ts = []
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    srv.layer(1, h, ids, wts)
                    ts.append(time.perf_counter() - t0)
                print(
                    f"{_name(kernels)} threads {threads} rows {n}: layer() median "
                    f"{np.median(ts) * 1e6:.1f} us, 10th percentile {np.percentile(ts, 10) * 1e6:.1f} us",
                    flush=True,
                )
        finally:
            srv.close()


if __name__ == "__main__":
    main()

"""Can decode steps keep their pace beside a prompt pass when they own SMs? (issue 15 item 2; GPU machine)

A second stream at the least priority did not do it on the H100 (perf/README.md, "a prompt read on a second,
low-priority stream"): a decode step is a chain of ~500 small kernels, and a stream's priority only orders the
blocks waiting for an SM, so each kernel of the chain waited for the pass's running blocks. CUDA green
contexts split the SMs instead. This probe times a decode-like chain (CHAIN launches of a few-block kernel) on
its own, beside a saturating load on plain streams at the two priorities, and on a green partition of
--decode-sms SMs beside the same load on the rest; and whether cupy's kernels launch on a green context's
stream at all (cupy loads its modules in the primary context).

    python perf/green_probe.py [--decode-sms 16] [--json OUT]

It builds perf/green_probe.cu with nvcc into /tmp. The chain is launched from Python (~6 us a launch, more
than each kernel's own time), so it tells whether the chain stalls behind the load, not a decode step's exact
cost.
Not a test: a measurement that says whether an SM split is worth building into the server.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path

import cupy as cp

CHAIN = 500  # kernels in a decode step of the 80B, about
ITERS = 40_000  # a load block's loop: ~0.1 ms, about a prefill GEMM tile's
LOAD = 400  # load launches: ~80 ms, past the chain even when each of its kernels waits for a block
SOURCE = r"""
extern "C" __global__ void tiny(const float* __restrict__ x, float* __restrict__ out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.f;
  for (int j = i; j < n; j += gridDim.x * blockDim.x) acc += x[j];
  if (acc == 1234.5f) out[0] = acc;  // never: keeps the loads
}
extern "C" __global__ void heavy(float* __restrict__ y, int iters) {
  float v = threadIdx.x;
  for (int k = 0; k < iters; k++) v = v * 1.000001f + 0.5f;
  y[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
"""


def build() -> ctypes.CDLL:
    src = Path(__file__).with_name("green_probe.cu")
    lib = Path("/tmp/green_probe.so")
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(src)]
    subprocess.run([*cmd, "-L/usr/local/cuda/lib64/stubs", "-lcuda"], check=True)
    return ctypes.CDLL(str(lib))


def chain_ms(tiny, x, out, stream) -> float:  # type: ignore[no-untyped-def]
    """CHAIN launches of 4 blocks reading 1 MiB each, one after another on `stream`."""
    n = x.size
    stream.synchronize()
    t = time.perf_counter()
    with stream:  # a RawKernel launches on the current stream
        for _ in range(CHAIN):
            tiny((4,), (256,), (x, out, cp.int32(n)))
    stream.synchronize()
    return (time.perf_counter() - t) * 1e3


def queue_load(heavy, y, stream, blocks: int) -> None:  # type: ignore[no-untyped-def]
    """LOAD launches of `blocks` load blocks on `stream`."""
    with stream:
        for _ in range(LOAD):
            heavy((blocks,), (256,), (y, cp.int32(ITERS)))


def load_rate(heavy, y, stream, blocks: int) -> float:  # type: ignore[no-untyped-def]
    """The load's blocks a ms on `stream` alone."""
    stream.synchronize()
    t = time.perf_counter()
    queue_load(heavy, y, stream, blocks)
    stream.synchronize()
    return LOAD * blocks / ((time.perf_counter() - t) * 1e3)


def beside(tiny, heavy, x, out, y, s_chain, s_load, blocks: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The chain's ms while `heavy` keeps `s_load` busy, and the load's blocks a ms meanwhile."""
    s_load.synchronize()
    t = time.perf_counter()
    queue_load(heavy, y, s_load, blocks)  # queued well past the chain, even a slowed one
    ms = chain_ms(tiny, x, out, s_chain)
    s_load.synchronize()
    return ms, LOAD * blocks / ((time.perf_counter() - t) * 1e3)


def external(ptr: int):  # type: ignore[no-untyped-def]
    """A cupy stream over a stream made elsewhere."""

    class _Handle:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, ptr)

    make = getattr(cp.cuda.Stream, "from_external", None)
    return make(_Handle()) if make is not None else cp.cuda.ExternalStream(ptr)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--decode-sms", type=int, default=16)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    mod = cp.RawModule(code=SOURCE)
    tiny, heavy = mod.get_function("tiny"), mod.get_function("heavy")
    n_sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    x = cp.ones(1 << 20, cp.float32)  # 4 MiB: 1 MiB a block
    out = cp.zeros(1, cp.float32)
    y = cp.zeros(n_sm * 16 * 256, cp.float32)
    blocks = n_sm * 16
    res: dict[str, object] = {"sms": n_sm, "chain": CHAIN}
    plain = cp.cuda.Stream(non_blocking=True)
    chain_ms(tiny, x, out, plain)  # loads the module
    res["alone_ms"] = chain_ms(tiny, x, out, plain)
    hi = cp.cuda.Stream(non_blocking=True, priority=-(1 << 20))
    lo = cp.cuda.Stream(non_blocking=True, priority=0)
    res["priority_ms"], res["priority_load_blocks_per_ms"] = beside(tiny, heavy, x, out, y, hi, lo, blocks)
    res["load_alone_blocks_per_ms"] = load_rate(heavy, y, lo, blocks)
    try:
        lib = build()
        a, b = ctypes.c_void_p(), ctypes.c_void_p()
        na, nb = ctypes.c_uint(), ctypes.c_uint()
        rc = lib.green_streams(
            args.decode_sms, ctypes.byref(a), ctypes.byref(b), ctypes.byref(na), ctypes.byref(nb)
        )
        if rc:
            raise RuntimeError(f"green_streams returned CUresult {rc}")
        res["green_sms"] = [na.value, nb.value]
        ga, gb = external(a.value), external(b.value)
        res["green_alone_ms"] = chain_ms(tiny, x, out, ga)
        res["green_ms"], res["green_load_blocks_per_ms"] = beside(tiny, heavy, x, out, y, ga, gb, blocks)
    except Exception as e:  # the answer is then why not
        res["green_error"] = f"{type(e).__name__}: {e}"
    text = json.dumps(res, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

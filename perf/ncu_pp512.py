"""One 512-token prefill pass over a GGUF on the GPU engine, for Nsight Compute to profile (perf/run_ncu.sh).

python perf/ncu_pp512.py MODEL.gguf
"""

from __future__ import annotations

import sys

import numpy as np

from strata.gguf import GGUFFile
from strata.gpu.model import GpuModel, GpuOptions
from strata.models import model_class
from strata.runtime.weights import WeightStore


def main() -> None:
    g = GGUFFile(sys.argv[1])
    gpu = GpuModel(model_class(g)(g, WeightStore(g, 0)), GpuOptions(chunk=4096, n_ctx=1024))
    ids = np.random.default_rng(0).integers(0, gpu.params.vocab, 512)
    gpu.forward(ids, gpu.new_state(), all_logits=False)
    gpu.stream.synchronize()


if __name__ == "__main__":
    main()

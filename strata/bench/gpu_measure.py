"""What perf/bench_gpu.py measures on the GPU beside tok/s: the device copy bandwidth and the weight bytes a
decode step reads (the bandwidth bound's two sides), the decode-kernel sweep (`--sweep`) and a short prompt
through each expert path."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from strata.gpu.ops import GEMV_ROWS, MOE_GEMV_MAX


def copy_bandwidth(cp: Any) -> float:
    """Device-to-device copy, bytes read + written per second (the HBM ceiling we can reach)."""
    a = cp.ones(1 << 29, cp.float32)  # 2 GiB
    b = cp.empty_like(a)
    b[...] = a
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(10):
        b[...] = a
    cp.cuda.Device().synchronize()
    return 10 * 2 * a.nbytes / (time.perf_counter() - t)


def step_bytes(gpu: Any, b: int) -> float:
    """Weight bytes one decode step of b sequences reads (expected, uniform routing)."""
    d = gpu.dims
    total = gpu.head.data.nbytes + b * gpu.embd.row_bytes
    for L in gpu.layers:
        # Qwen3-Next: a DeltaNet layer's projections, the shared expert
        dense = [*L.qkv, L.o, L.attn_gate, L.router]
        dense += [*L.dn.proj, L.dn.out] if L.dn is not None else []
        dense += [*L.shared.gate_up, L.shared.down, L.shared.gate_inp] if L.shared is not None else []
        total += sum(m.data.nbytes for m in dense if m is not None)
        if d.n_expert:
            experts = d.n_expert * (1 - (1 - d.top_k / d.n_expert) ** b)
            total += experts * sum(m.expert_stride for m in (L.gate, L.up, L.down))
        else:
            total += sum(m.data.nbytes for m in (L.gate, L.up, L.down))
    if gpu.hc is not None:  # qwen4exp: the hyper-connection mixers, QSA indexers and PLE projections
        hc = gpu.hc
        mixers = [*hc.attn, *hc.ffn, hc.head]
        mats = [m for x in mixers for m in (x.down, x.up, x.inject) if m is not None]
        mats += [m for q in hc.qsa.values() for m in (q.q, q.k)]
        mats += [m for p in hc.ple.values() for m in (p.key, p.value)]
        total += sum(m.data.nbytes for m in mats)
    return total


def sweep(gpu: Any, batches: list[int], gen: int = 64) -> dict[str, float]:
    """Decode tok/s per decode-kernel setting, graphs recaptured for each: fp32-input gemvs against the
    int8-input ones (mmvq) at several grid caps (ops.MMVQ_GRID)."""
    from strata.gpu import ops as ops_mod

    keep = ops_mod.MMVQ_GRID, gpu.ops.q8
    settings = [("fp32 gemv", False, keep[0])] + [(f"q8 grid {g}", True, g) for g in (256, 512, 1024)]
    out: dict[str, float] = {}
    try:
        for label, q8, grid in settings:
            gpu.ops.q8, ops_mod.MMVQ_GRID = q8, grid
            gpu.graphs._graphs.clear()
            for b in batches:
                gpu.graphs.greedy_loop(list(range(1, b + 1)), [gpu.new_state() for _ in range(b)], 2)
                states = [gpu.new_state() for _ in range(b)]
                gpu.stream.synchronize()
                t = time.perf_counter()
                gpu.graphs.greedy_loop(list(range(1, b + 1)), states, gen)
                out[f"{label} b{b}"] = b * gen / (time.perf_counter() - t)
            print(
                f"sweep {label}: " + ", ".join(f"b={b} {out[f'{label} b{b}']:.1f}" for b in batches),
                flush=True,
            )
    finally:
        ops_mod.MMVQ_GRID, gpu.ops.q8 = keep
        gpu.graphs._graphs.clear()
    return out


def prompt_seconds(gpu: Any, ids: np.ndarray, reps: int) -> float:
    """The median seconds of `reps` prefills of ids, each over a fresh sequence."""
    times = []
    for _ in range(reps):
        s = gpu.new_state()
        t = time.perf_counter()
        gpu.forward(ids, s, all_logits=False)
        times.append(time.perf_counter() - t)
        del s
    return statistics.median(times)


def prompt_paths(gpu: Any, ids: np.ndarray) -> dict[str, float]:
    """A short prompt (up to MOE_GEMV_MAX tokens, one pass) through the expert paths its length does not
    choose, tok/s each: `per_pair` (the decode kernels per (row, expert) pair, misses read in place),
    `grouped` (GEMM tiles, misses zero-copy), and with a cache `per_pair_staged` and `grouped_staged` (the
    misses staged in borrowed slots first)."""
    p, ops, cache = len(ids), gpu.ops, gpu.expert_cache
    if p > MOE_GEMV_MAX or p > gpu.chunk:
        return {}
    never = 1 << 30
    paths = {"per_pair": (p, never), "grouped": (GEMV_ROWS, never)}
    if cache is not None:
        paths |= {"per_pair_staged": (p, p), "grouped_staged": (GEMV_ROWS, p)}
    chosen = (ops.moe_gemv_rows, cache.borrow_min if cache is not None else never)
    out = {}
    for path, (rows, borrow) in paths.items():
        grouped = p > rows
        if grouped == (p > chosen[0]) and (borrow <= p) == (chosen[1] <= p):
            continue  # the path the default took
        ops.moe_gemv_rows = max(rows, GEMV_ROWS)
        if cache is not None:
            cache.borrow_min = borrow
        try:
            out[path] = p / prompt_seconds(gpu, ids, 2)
        finally:
            ops.moe_gemv_rows = chosen[0]
            if cache is not None:
                cache.borrow_min = chosen[1]
    return out


def ahead_rates(gpu: Any, batches: list[int], gen: int) -> dict[str, float]:
    """Decode tok/s through the server's pipeline (gpu.decode_ahead(): a step queued behind the one the host
    waits on, the draw on the device), greedy and with the server's default sampling, per batch size: what
    the server can reach at best, beside greedy_loop's tg."""
    from strata.api.sampling_args import DEFAULTS
    from strata.sampling.params import SamplingParams

    out: dict[str, float] = {}
    for label, params in (("greedy", SamplingParams(temperature=0.0)), ("sampled", DEFAULTS)):
        for b in batches:
            ahead = gpu.decode_ahead()
            if ahead is None or b > ahead.max_batch:
                continue
            states = [gpu.new_state() for _ in range(b)]
            for i, s in enumerate(states):
                gpu.forward(np.array([i + 1]), s, all_logits=False)
            ahead.start(states, list(range(2, b + 2)), [(params, i) for i in range(b)])
            ahead.advance()  # the first collected step pays the graph's capture for this batch size
            gpu.stream.synchronize()
            t = time.perf_counter()
            for _ in range(gen - 1):
                ahead.advance()
            ahead.drain()
            out[f"ahead_{label}_b{b}"] = b * gen / (time.perf_counter() - t)
    print("ahead: " + ", ".join(f"{k} {v:.1f}" for k, v in out.items()), flush=True)
    return out

"""`strata plan MODEL --vram-gib X --ram-gib Y [--pcie-gbps B] [--json]`: where every tensor would live on
that machine and the speed the placement allows, from the GGUF header alone (no GPU needed).

It runs start-up's own VRAM plan (strata.gpu.plan.vram_plan) against the given budget, so what it
prints is what `serve` would do with `--vram-budget-mib`; the arithmetic is in strata.tiers.plan.
"""

from __future__ import annotations

import argparse
import dataclasses

from strata.blocks.ple import TABLE
from strata.cli.output import dump_json
from strata.conf.engine import check_ram_budget
from strata.gguf import GGUFFile
from strata.gpu import GPU_ARCHS
from strata.gpu.plan import (
    GpuOptions,
    choose_context,
    kv_bytes_per_token,
    kv_stage_bytes,
    kv_window,
    shape_of,
    vram_plan,
    with_chunk,
)
from strata.gpu.weights import weight_bytes
from strata.models import model_class
from strata.runtime.kvcache import KVType
from strata.runtime.weights import WeightStore
from strata.tiers.budget import GIB, MIB, VramPlan, check_expert_cache
from strata.tiers.kvwindow import check_resident
from strata.tiers.layout import ExpertLayout
from strata.tiers.lookahead import PREFETCH_DEFAULT, check_prefetch
from strata.tiers.plan import MISS_EFFICIENCY, Prediction, layer_floor_us, lookahead_us, predict, table
from strata.tiers.share import parse_pcie_frac
from strata.tiers.tables import available_ram, check_mode, choose


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    p.add_argument(
        "--vram-gib", type=float, required=True, help="VRAM budget (what --vram-budget-mib would be)"
    )
    p.add_argument("--ram-gib", type=float, default=0.0, help="RAM for the pinned expert arena (0: no limit)")
    p.add_argument(
        "--ram-budget-mib",
        type=float,
        default=0.0,
        help="as on serve, and before --ram-gib: RAM for the expert arena; what it cannot hold "
        "stays in the file's mapping (the third tier)",
    )
    p.add_argument(
        "--disk-gbps",
        type=float,
        default=3.0,
        help="the file's mapping's rate, GB/s, for experts the arena cannot hold (default 3: an "
        "NVMe SSD, a cold page cache; a warm one reads at RAM speed, ~20)",
    )
    p.add_argument(
        "--pcie-gbps",
        type=float,
        default=25.0,
        help="host-to-GPU rate, GB/s (PCIe 4 x16: ~25; the H200 host measured 50 zero-copy)",
    )
    p.add_argument(
        "--cpu-gbps",
        type=float,
        default=0.0,
        help="the CPU pool's rate on the experts, GB/s (start-up's probe prints it); with it the misses are "
        "split between PCIe and the CPU as serve would split them (0: PCIe only)",
    )
    p.add_argument(
        "--cpu-fixed-us",
        type=float,
        default=30.0,
        help="what handing a layer to the CPU costs beside its compute, us (start-up's probe prints it)",
    )
    p.add_argument(
        "--pcie-frac", default="auto", help="as on serve: the share of misses read over PCIe, or auto"
    )
    p.add_argument(
        "--hbm-gbps", type=float, default=900.0, help="VRAM bandwidth, GB/s (RTX 4090: ~1000, H200: 4,270)"
    )
    p.add_argument(
        "--layer-us",
        type=float,
        default=None,
        help="the all-resident decode step a layer, us (default: measured on the H200 for this architecture, "
        "strata.tiers.plan.LAYER_FLOOR_US)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=PREFETCH_DEFAULT,
        metavar="K",
        help="as on serve: experts a decode layer's lookahead copies ahead (0: none); the prediction credits "
        "the copies its window allows (strata.tiers.plan.LOOKAHEAD_US, measured for this architecture)",
    )
    p.add_argument(
        "--ctx-size",
        type=int,
        default=0,
        help="context per sequence (0, as on serve: the trained context when its KV fits the plan, else the "
        "largest that does)",
    )
    p.add_argument(
        "--kv-type",
        default="auto",
        choices=["auto", "f16", "int8"],
        help="as on serve (auto: f16 on the GPU)",
    )
    p.add_argument(
        "--kv-grow",
        action="store_true",
        help="as on serve: KV room for each sequence's first chunk, the rest to the expert cache; prints the "
        "cache and decode speed when every sequence's KV is full (the worst case)",
    )
    p.add_argument(
        "--kv-resident",
        type=int,
        default=0,
        metavar="N",
        help="as on serve: each attention layer keeps its last N cells in VRAM, the rest in pinned RAM",
    )
    p.add_argument("--parallel", type=int, default=4, help="sequences at once (the server's --parallel)")
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="prefill chunk (as on serve: 0 = 4096, 2048 where it won't fit)",
    )
    p.add_argument("--expert-cache", default="auto", help="as on serve: auto, off, 6GiB, 4096MiB, 40%%")
    p.add_argument("--ple-io", default="auto", help="as on serve: how a qwen4exp n-gram table is read")
    p.add_argument("--json", action="store_true", help="the plan as JSON (keys documented in perf/README.md)")


def run_plan(args: argparse.Namespace) -> int:
    check_expert_cache(args.expert_cache)
    check_resident(args.kv_resident)
    check_prefetch(args.prefetch)
    check_mode(args.ple_io)
    g = GGUFFile(args.model)
    out: dict[str, object] = {}
    lines = []
    if g.architecture in GPU_ARCHS:
        pred, ctx = _gpu_plan(args, g)
        out = {**pred.json(), **ctx}
        lines.append(table(pred))
        lines.append(_context_text(ctx))
    else:  # no GPU path: only the tiers that do not depend on it
        out["gpu"] = None
        lines.append(
            f"{g.architecture}: no GPU path, so no VRAM placement (the GPU runs {', '.join(GPU_ARCHS)})"
        )
    if TABLE in g.tensors:  # the PLE table's tier: from --ram-gib when given, else this machine's free RAM
        size = g.tensors[TABLE].nbytes
        ram = int(args.ram_gib * GIB) or available_ram()
        mode = choose(args.ple_io, size, ram)
        out.update(ple_table_bytes=size, ple_io=mode)
        why = f" (auto: {'fits' if mode == 'ram' else 'does not fit'} in half of {ram / GIB:,.1f} GiB of RAM)"
        lines.append(f"PLE table: {size / GIB:,.2f} GiB -> {mode}" + (why if args.ple_io == "auto" else ""))
    if args.json:
        dump_json(out)
    else:
        print("\n".join(lines))
    return 0


def _context_text(ctx: dict[str, object]) -> str:
    per, allowed = ctx["kv_bytes_per_token"], ctx["context_allowed"]
    assert isinstance(per, dict) and isinstance(allowed, dict)
    line = ctx["context_line"] or f"context: {ctx['n_ctx']:,} tokens (--ctx-size)"
    kinds = " / ".join(f"{k} {per[k] / 1024:,.1f} KiB a token, {allowed[k]:,} tokens" for k in per)
    text = f"{line}\nKV in VRAM: {kinds} (what the budget allows with no --ctx-size)"
    tiers = ctx.get("kv_tiers")
    if isinstance(tiers, dict) and tiers["ram_bytes"]:
        text += (
            f"\n--kv-resident: {tiers['vram_cells']:,} cells a layer in VRAM "
            f"({tiers['vram_bytes'] / MIB:,.0f} MiB for every sequence, and "
            f"{tiers['stage_bytes'] / MIB:,.0f} MiB where a long prefill chunk reads one layer's older "
            "cells), the rest in pinned RAM "
            f"({tiers['ram_bytes'] / MIB:,.0f} MiB when full); at the whole context a decode token reads "
            f"{tiers['ram_bytes_per_token'] / 1e6:,.0f} MB of it over PCIe: "
            f"{tiers['decode_tok_s_full']:,.1f} tok/s"
        )
    grown = ctx.get("kv_grow")
    if isinstance(grown, dict):
        text += (
            f"\n--kv-grow: the cache starts at {grown['slots_start']:,} slots; with every sequence's KV full "
            f"({grown['kv_full_bytes'] / MIB:,.0f} MiB) it keeps {grown['slots_worst']:,} (hit rate "
            f"{grown['hit_rate_worst']:.1%} uniform), decode {grown['decode_tok_s_worst']:,.1f} tok/s"
        )
    return text


def _gpu_plan(args: argparse.Namespace, g: GGUFFile) -> tuple[Prediction, dict[str, object]]:
    cpu = model_class(g)(g, WeightStore(g, 0))
    dims, linear = shape_of(cpu)
    kind = KVType.INT8 if args.kv_type == "int8" else KVType.F16
    dims = dataclasses.replace(dims, kv8=kind is KVType.INT8)
    opts = GpuOptions(
        n_ctx=args.ctx_size,
        chunk=args.prefill,
        expert_cache=args.expert_cache,
        seqs=args.parallel,
        kv_type=kind,
        kv_grow=args.kv_grow,
        kv_resident=args.kv_resident,
    )
    budget, trained, vocab = int(args.vram_gib * GIB), cpu.params.n_ctx_train, cpu.params.vocab
    opts = with_chunk(g, dims, linear, vocab, opts, budget, trained)
    ram = int(args.ram_gib * GIB)  # the machine planned for (0: this one), for the --kv-resident context
    choice = None if args.ctx_size else choose_context(g, dims, linear, trained, vocab, opts, budget, ram)
    n_ctx = args.ctx_size or choice.n_ctx  # type: ignore[union-attr]
    dims = dataclasses.replace(shape_of(cpu, n_ctx)[0], kv8=kind is KVType.INT8)  # qwen4exp's QSA records
    per, allowed = {}, {}
    for k in (
        KVType.F16,
        KVType.INT8,
    ):  # the KV's cost in each cell type, and the context each leaves room for
        d = dataclasses.replace(dims, kv8=k is KVType.INT8)
        per[str(k)] = kv_bytes_per_token(d, linear.count(False))
        allowed[str(k)] = choose_context(g, d, linear, trained, vocab, opts, budget, ram).n_ctx
    ctx: dict[str, object] = {
        "n_ctx": n_ctx,
        "n_ctx_trained": trained,
        "kv_type": str(kind),
        "kv_bytes_per_token": per,
        "context_allowed": allowed,
        "context_line": None if choice is None else choice.line,
    }
    # where the KV lives, per tier, for every sequence at the whole context (--kv-resident: a window in VRAM)
    kv_per, seqs = per[str(kind)], args.parallel
    window = kv_window(opts)
    vram_cells = n_ctx if window is None else min(n_ctx, window.device_cells)
    # what a decode token at the whole context reads of the cells on the host: every one of them for a layer
    # of full attention, at most its selected keys for a QSA layer (qwen4exp)
    n_attn = linear.count(False)
    cold = n_ctx - vram_cells
    qsa = dims.hc.qsa if dims.hc is not None else None
    n_qsa = qsa.n_layer if qsa is not None else 0
    picked = min(cold, qsa.top_blocks * qsa.ratio) if qsa is not None else 0
    ctx["kv_tiers"] = {
        "vram_cells": vram_cells,
        "vram_bytes": seqs * vram_cells * kv_per,
        "ram_bytes": seqs * cold * kv_per,
        "ram_bytes_per_token": ((n_attn - n_qsa) * cold + n_qsa * picked) * kv_per // max(n_attn, 1),
        # a long chunk's copy of one layer's cold cells
        "stage_bytes": kv_stage_bytes(dims, n_attn, n_ctx, opts),
    }
    plan = vram_plan(g, dims, linear, n_ctx, opts.chunk, vocab, opts, budget)
    w = weight_bytes(g)
    # every decode token reads all dense weights but the embeddings (one row of those)
    dense = sum(v for k, v in w.items() if k not in ("experts", "embeddings"))
    check_ram_budget(args.ram_budget_mib)
    ram, flag = (
        (int(args.ram_budget_mib * MIB), "--ram-budget-mib")
        if args.ram_budget_mib
        else (int(args.ram_gib * GIB), "--ram-gib")
    )

    def at(p: VramPlan) -> Prediction:
        return predict(
            p,
            ExpertLayout.from_gguf(g),
            dense,
            args.hbm_gbps,
            args.pcie_gbps,
            ram,
            p.prompt_rows or opts.chunk,
            args.cpu_gbps,
            args.cpu_fixed_us * 1e-6,
            parse_pcie_frac(args.pcie_frac),
            args.disk_gbps,
            flag,
            layer_us(args, cpu),
            cpu.params.n_layer,
            args.prefetch,
            lookahead_us(type(cpu).structure),
        )

    pred = at(plan)
    tiers = ctx["kv_tiers"]
    assert isinstance(tiers, dict)
    cold_s = tiers["ram_bytes_per_token"] / (args.pcie_gbps * 1e9 * MISS_EFFICIENCY)
    tiers["decode_tok_s_full"] = 1 / (1 / pred.decode_tok_s + cold_s) if pred.decode_tok_s else 0.0
    if plan.worst_slots is not None:  # --kv-grow: the same plan once every sequence's KV is full
        worst = at(dataclasses.replace(plan, n_slots=plan.worst_slots))
        ctx["kv_grow"] = {
            "kv_full_bytes": plan.kv_full,
            "slots_start": plan.n_slots,
            "slots_worst": plan.worst_slots,
            "hit_rate_worst": worst.hit_rate_uniform,
            "decode_tok_s_worst": worst.decode_tok_s,
        }
    return pred, ctx


def layer_us(args: argparse.Namespace, cpu: object) -> float:
    """--layer-us, else the floor measured for the model file's Structure."""
    return args.layer_us if args.layer_us is not None else layer_floor_us(type(cpu).structure)

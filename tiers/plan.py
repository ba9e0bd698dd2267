"""The planner's arithmetic: from a VRAM plan, the experts' layout and bandwidths, the placement a user
would see and the speed it allows, before anything but the header is loaded (`strata plan`).

Decode reads, per token, the dense weights and the routed experts that hit from VRAM, and the misses
from pinned RAM over PCIe (zero-copy, inside the CUDA graph). Under uniform routing a slot cache of S of
the N experts hits S / N of lookups. Prefill of a chunk of C tokens copies each layer's missing experts
once (borrowed slots), so PCIe bounds it at C / (missing bytes / PCIe rate).

`ZERO_COPY_EFFICIENCY` (tiers/share.py): in-graph zero-copy reads reach that share of the probed PCIe rate,
so the prediction applies it. With a CPU rate (`--cpu-gbps`) the misses are split between PCIe and the CPU
pool as start-up splits them (tiers/share.py), and the table says why. The JSON keys are stable;
perf/README.md documents them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from strata.tiers.budget import GIB, MIB, VramPlan
from strata.tiers.layout import ExpertLayout
from strata.tiers.share import ZERO_COPY_EFFICIENCY, choose

from strata.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Prediction:
    vram_budget_bytes: int
    dense_bytes: int
    expert_slots: int
    experts_total: int
    slot_bytes: int
    cache_bytes: int
    arena_bytes: int  # pinned RAM for every expert (0 when all are resident)
    ram_budget_bytes: int
    hit_rate_uniform: float
    dense_bytes_per_token: int  # weights every decode token reads besides its experts
    routed_bytes_per_token: int  # expert bytes one token routes to
    pcie_bytes_per_token: float  # of those, read over PCIe (misses)
    decode_tok_s: float  # predicted, one sequence
    decode_bound_tok_s: float  # the bandwidth bound (PCIe at its probed rate)
    prefill_pcie_bound_tok_s: float  # a chunk's staging copies alone, at the given chunk
    prefill_chunk: int
    parts: dict[str, int]
    pcie_frac: float = 1.0  # share of the misses read over PCIe; the rest on the CPU pool
    cpu_gbps: float = 0.0  # the CPU pool's expert rate the split assumed (0: no CPU share)
    split_why: str = ""  # the split's reasoning, as start-up prints it

    def json(self) -> dict[str, object]:
        return asdict(self)


def predict(
    plan: VramPlan,
    layout: ExpertLayout | None,
    dense_per_token: int,
    hbm_gbps: float,
    pcie_gbps: float,
    ram_bytes: int,
    chunk: int,
    cpu_gbps: float = 0.0,
    cpu_fixed_s: float = 30e-6,
    pcie_frac: float | None = None,
) -> Prediction:
    """What the plan allows; raises ConfigError naming the RAM tier when the arena cannot fit."""
    n_total = layout.n_total if layout is not None else 0
    tiered = layout is not None and plan.n_slots < n_total
    arena = layout.n_total * layout.slot_bytes if tiered and layout is not None else 0
    if tiered and ram_bytes and arena > ram_bytes:
        raise ConfigError(
            "--ram-gib",
            round(ram_bytes / GIB, 1),
            (
                f"the expert arena needs {arena / GIB:,.1f} GiB of pinned RAM for every expert, "
                f"{(arena - ram_bytes) / GIB:,.1f} GiB more than the RAM budget"
            ),
        )
    hit = plan.n_slots / n_total if n_total else 1.0
    routed = layout.routed_bytes_per_token() if layout is not None else 0
    miss = (1 - hit) * routed
    hbm, pcie = hbm_gbps * 1e9, pcie_gbps * 1e9
    vram_time = (dense_per_token + hit * routed) / hbm
    bound = 1 / (vram_time + miss / pcie)
    n_l = len(layout.layers) if layout is not None else 1
    sp = choose(miss / n_l, pcie * ZERO_COPY_EFFICIENCY, cpu_gbps * 1e9, cpu_fixed_s,
                pcie_frac if cpu_gbps > 0 or pcie_frac is not None else 1.0)
    if sp.chosen != "auto" and cpu_gbps <= 0 and sp.pcie_frac < 1:
        raise ConfigError("--cpu-gbps", cpu_gbps, "a CPU share (--pcie-frac < 1) needs the CPU pool's rate")
    decode = 1 / (vram_time + n_l * sp.layer_s)
    why = sp.why(miss / n_l) if miss and cpu_gbps > 0 else ""
    missing_bytes = (1 - hit) * (layout.total_bytes if layout is not None else 0)
    prefill = chunk * pcie / missing_bytes if missing_bytes else float("inf")
    return Prediction(
        plan.budget,
        plan.dense,
        plan.n_slots,
        n_total,
        plan.slot_bytes,
        plan.n_slots * plan.slot_bytes,
        arena,
        ram_bytes,
        hit,
        dense_per_token,
        routed,
        miss,
        decode,
        bound,
        prefill,
        chunk,
        dict(plan.parts),
        sp.pcie_frac,
        cpu_gbps,
        why,
    )


def table(p: Prediction) -> str:
    """The placement table a person reads (seed 000's section 3), then the predictions."""
    rows = [("tier", "what", "size")]
    rows += [("VRAM", k, f"{v / MIB:,.0f} MiB") for k, v in p.parts.items()]
    if p.experts_total:
        rows.append(
            (
                "VRAM",
                f"expert cache: {p.expert_slots:,} of {p.experts_total:,} experts",
                f"{p.cache_bytes / MIB:,.0f} MiB",
            )
        )
        rows.append(
            (
                "pinned RAM",
                "every expert (misses read over PCIe)" if p.arena_bytes else "(all resident)",
                f"{p.arena_bytes / MIB:,.0f} MiB",
            )
        )
        rows.append(("disk", "the GGUF, memory-mapped (read once to fill the tiers)", ""))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    out = [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}" for a, b, c in rows]
    used = p.dense_bytes + p.cache_bytes
    out.append(f"VRAM: {used / GIB:,.2f} of {p.vram_budget_bytes / GIB:,.2f} GiB")
    if p.experts_total:
        out.append(
            f"expected hit rate (uniform routing): {p.hit_rate_uniform:.1%}; per token "
            f"{p.routed_bytes_per_token / 1e6:,.0f} MB of experts, {p.pcie_bytes_per_token / 1e6:,.0f} MB "
            "over PCIe"
        )
    if p.split_why:
        out.append(p.split_why)
    out.append(
        f"decode (one sequence): predicted {p.decode_tok_s:,.1f} tok/s; bandwidth bound "
        f"{p.decode_bound_tok_s:,.1f} tok/s"
    )
    if p.prefill_pcie_bound_tok_s != float("inf"):
        out.append(
            f"prefill ({p.prefill_chunk}-token chunks): at most {p.prefill_pcie_bound_tok_s:,.0f} tok/s "
            "from the staging copies over PCIe"
        )
    return "\n".join(out)

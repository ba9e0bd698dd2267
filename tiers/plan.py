"""The planner's arithmetic: from a VRAM plan, the experts' layout and bandwidths, the placement a user
would see and the speed it allows, before anything but the header is loaded (`strata plan`).

Decode reads, per token, the dense weights and the routed experts that hit from VRAM, and the misses
from pinned RAM over PCIe (zero-copy, inside the CUDA graph). Under uniform routing a slot cache of S of
the N experts hits S / N of lookups. A prompt pass of C rows (the chunk, or under tiers a
wide pass of WIDE_ROWS) copies each layer's missing experts once (borrowed slots), so PCIe bounds it at
C / (missing bytes / PCIe rate).

Three tiers (tiers/ram.py): when the RAM budget (`--ram-budget-mib`, or `--ram-gib`) cannot hold every expert,
the pinned arena holds the misses it can and the rest stay in the file's mapping. Each tier's bytes a token
and their time at its rate are shown: VRAM at --hbm-gbps, pinned RAM at the in-graph PCIe rate, the mapping
at --disk-gbps (default 3: an NVMe SSD; a warm page cache reads at RAM speed, so give ~20 for the best case).
Misses on mapped-only experts are the CPU's in decode (the share they force, tiers/share.py), and prefill
stages them through the bounce ring at the slower of PCIe and the mapping.

A decode token is serial: its all-resident step, then its misses. The step is launch-bound on the GPU, far
from the weights' bandwidth (the H200: 4.4 ms for the 80B shape, whose bytes would take 0.4): `LAYER_FLOOR_US`
a layer by the model file's Structure, measured there (`--layer-us` for another card), or the VRAM bytes at
--hbm-gbps if longer. Beside it the misses are read at `MISS_EFFICIENCY` of the probed zero-copy rate, less
what the lookahead (`--prefetch`) copies beside the mixers (`LOOKAHEAD_US`, measured per Structure). This
fits every measurement in perf/README.md: the 80B at 24 / 12 / 8 GB and the qwen4exp flagship at 24 GB, within
9%; the bandwidth-only model (misses at tiers/share.py's `ZERO_COPY_EFFICIENCY`, which absorbed the floor on
the 80B) put the flagship 39% high. The CPU share's split keeps that model: it was measured with it. With a
CPU rate (`--cpu-gbps`) the misses are split between PCIe and the CPU
pool as start-up splits them (tiers/share.py), and the table says why. The JSON keys are stable;
perf/README.md documents them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from strata.errors import ConfigError
from strata.models.base import Structure
from strata.tiers.budget import GIB, MIB, VramPlan
from strata.tiers.layout import ExpertLayout
from strata.tiers.ram import arena_rows, ring_bytes
from strata.tiers.share import BASE_S, ZERO_COPY_EFFICIENCY, choose, token_split

# The all-resident decode step a layer on the H200 (perf/README.md, one sequence over 48 layers): qwen3moe
# 30B 303.3 tok/s (2026-12-04, the run beside its tier runs; 345.9 on an earlier host), qwen3next 80B 227.3,
# qwen4exp seeds 122.9 (the fused mixer); a dense model: none measured, bandwidth alone
LAYER_FLOOR_US = {"dense": 0.0, "moe": 68.7, "hybrid": 91.7, "streams": 169.5}
# The lookahead's copies a decode layer (--prefetch, tiers/lookahead.py): they run beside the mixer, so their
# window is the mixer's time less the branch's router. Measured on the H200 at 24 GB, one sequence: 43 us a
# layer on the 80B, 97.5 on the flagship, at 42 of 51 and 44.7 of 50.2 GB/s probed (LOOKAHEAD_RATE); the
# matrix in flight when the real router stops the branch is lost, on average half of one of an expert's three.
# That predicts 75 and 186 MB a token used against 64 and 187 measured. A qwen3moe layer: not measured (none).
LOOKAHEAD_US = {"hybrid": 43.0, "streams": 97.5}
LOOKAHEAD_RATE = 0.85
# the misses' in-graph zero-copy share of the probed PCIe rate beside that floor (80B at 24 GB: 462 MB a token
# at 72.1 tok/s with a 4.40 ms step)
MISS_EFFICIENCY = 0.96


def lookahead_us(structure: Structure | None) -> float:
    """The lookahead's measured copy window a layer for a model file's Structure (0: none measured)."""
    if structure is None:
        return 0.0
    return LOOKAHEAD_US.get("streams" if structure.streams else "hybrid" if structure.hybrid else "", 0.0)


def ahead_per_layer(miss: float, slot_bytes: int, prefetch: int, window_us: float, pcie: float) -> float:
    """Miss bytes a decode layer's lookahead lands for its experts to use: the copies its window allows (at
    most `prefetch` experts), less the matrix in flight when the router stops them; at most the misses."""
    if prefetch <= 0 or window_us <= 0:
        return 0.0
    copied = min(prefetch * slot_bytes, window_us * 1e-6 * pcie * LOOKAHEAD_RATE)
    return max(0.0, min(miss, copied - slot_bytes / 6))


def layer_floor_us(structure: Structure | None) -> float:
    """The measured step a layer for a model file's Structure (0: none measured)."""
    if structure is None:
        return 0.0
    if structure.streams:
        return LAYER_FLOOR_US["streams"]
    if structure.hybrid:
        return LAYER_FLOOR_US["hybrid"]
    return LAYER_FLOOR_US["moe" if structure.moe else "dense"]


@dataclass(frozen=True, slots=True)
class Prediction:
    vram_budget_bytes: int
    dense_bytes: int
    expert_slots: int
    experts_total: int
    slot_bytes: int
    cache_bytes: int
    arena_bytes: int  # pinned RAM of the arena: every expert, or what the RAM budget allows (0: all resident)
    ram_budget_bytes: int
    hit_rate_uniform: float
    dense_bytes_per_token: int  # weights every decode token reads besides its experts
    routed_bytes_per_token: int  # expert bytes one token routes to
    pcie_bytes_per_token: float  # of those, read over PCIe (misses)
    decode_tok_s: float  # predicted, one sequence
    decode_bound_tok_s: float  # the bandwidth bound (PCIe at its probed rate)
    prefill_pcie_bound_tok_s: float  # a prompt pass's staging copies alone, at its rows
    prefill_rows: int  # the rows of a lone prompt's pass (the chunk, or a wide pass under tiers)
    parts: dict[str, int]
    pcie_frac: float = 1.0  # share of the misses read over PCIe; the rest on the CPU pool
    cpu_gbps: float = 0.0  # the CPU pool's expert rate the split assumed (0: no CPU share)
    split_why: str = ""  # the split's reasoning, as start-up prints it
    arena_experts: int = 0  # experts with a row in pinned RAM
    mmap_experts: int = 0  # experts in neither a slot nor the arena: read from the file's mapping
    mmap_bytes: int = 0  # their bytes (what the page cache must keep to serve them warm)
    ring_bytes: int = 0  # the bounce ring's pinned buffers (low-RAM mode only)
    mmap_bytes_per_token: float = 0.0  # routed bytes a decode token reads from the mapping (on the CPU)
    disk_gbps: float = 0.0  # the mapping's rate the prediction assumed
    # vram / pinned / mmap: experts, bytes, bytes a token, rate (GB/s), ms a token
    tiers: dict[str, dict[str, float]] | None = None
    layer_floor_us: float = 0.0  # the all-resident step a layer the prediction assumed
    ahead_bytes_per_token: float = 0.0  # misses the lookahead lands beside the mixers (off the critical path)

    def json(self) -> dict[str, object]:
        return asdict(self)


def predict(
    plan: VramPlan,
    layout: ExpertLayout | None,
    dense_per_token: int,
    hbm_gbps: float,
    pcie_gbps: float,
    ram_bytes: int,
    prompt_rows: int,
    cpu_gbps: float = 0.0,
    cpu_fixed_s: float = 30e-6,
    pcie_frac: float | None = None,
    disk_gbps: float = 3.0,
    ram_flag: str = "--ram-budget-mib",
    floor_us: float = 0.0,
    n_layer: int = 0,
    prefetch: int = 0,
    window_us: float = 0.0,
) -> Prediction:
    """What the plan allows under a RAM budget of ram_bytes for the arena (0: none), with an all-resident
    step of floor_us a layer over n_layer layers and a lookahead of `prefetch` experts copying window_us a
    layer; raises ConfigError naming ram_flag when the budget cannot hold even the bounce ring."""
    n_total = layout.n_total if layout is not None else 0
    tiered = layout is not None and plan.n_slots < n_total
    held, ring = n_total, 0  # arena rows
    if tiered and layout is not None:
        per_mib = 1.0 if ram_flag == "--ram-budget-mib" else 1 / 1024  # the message gives the flag's own unit
        try:
            rows = arena_rows(layout, ram_bytes / MIB, ram_flag)
        except ConfigError as err:
            reason = str(err).split(": ", 1)[1]
            raise ConfigError(ram_flag, round(ram_bytes / MIB * per_mib, 3), reason) from None
        if rows is not None:
            held = min(rows, n_total - plan.n_slots + borrowed_estimate(plan.n_slots, layout))
            ring = ring_bytes(layout)
    arena = held * layout.slot_bytes if tiered and layout is not None else 0
    n_mmap = max(0, n_total - plan.n_slots - held) if tiered else 0
    hit = plan.n_slots / n_total if n_total else 1.0
    routed = layout.routed_bytes_per_token() if layout is not None else 0
    miss = (1 - hit) * routed
    mapped = n_mmap / n_total * routed if n_total else 0.0  # of the misses, read from the mapping
    hbm, pcie, disk = hbm_gbps * 1e9, pcie_gbps * 1e9, disk_gbps * 1e9
    vram_time = (dense_per_token + hit * routed) / hbm
    bound = 1 / (vram_time + max((miss - mapped) / pcie, mapped / disk))  # the CPU reads the mapping
    n_l = len(layout.layers) if layout is not None else 1
    forced = mapped / miss if miss else 0.0
    sp = choose(
        miss / n_l,
        pcie * ZERO_COPY_EFFICIENCY,
        cpu_gbps * 1e9,
        cpu_fixed_s,
        pcie_frac if cpu_gbps > 0 or pcie_frac is not None else (None if forced else 1.0),
        forced,
        disk,
    )
    if sp.chosen != "auto" and cpu_gbps <= 0 and sp.pcie_frac < 1 - forced:
        raise ConfigError("--cpu-gbps", cpu_gbps, "a CPU share (--pcie-frac < 1) needs the CPU pool's rate")
    step = max(vram_time, n_layer * floor_us * 1e-6)  # the all-resident step: every layer's floor, or bytes
    ahead = 0.0
    why = sp.why(miss / n_l) if miss and cpu_gbps > 0 else ""
    frac = sp.pcie_frac
    token = None  # with nothing only the CPU can read, decode splits per layer and token (tiers/share.py)
    if not forced and miss and cpu_gbps > 0 and pcie_frac != 1.0 and layout is not None:
        a = layout.top_k
        token = token_split(1, a, 1 - hit, routed / (n_l * a), pcie, cpu_gbps * 1e9, cpu_fixed_s, pcie_frac)
        if token[0].any():  # (a given share is reported as given, as start-up does)
            frac, why = (token[1] if pcie_frac is None else pcie_frac), token[3]
        else:
            token = None
    if token is not None:  # the split's mean layer beyond the all-resident one (its experts: BASE_S)
        decode = 1 / (step + n_l * (token[2] - BASE_S))
    elif sp.pcie_frac >= 1 and not forced:  # every miss over PCIe, after the step, less what came ahead
        if tiered and layout is not None:
            ahead = n_l * ahead_per_layer(miss / n_l, layout.slot_bytes, prefetch, window_us, pcie)
        decode = 1 / (step + (miss - ahead) / (pcie * MISS_EFFICIENCY))
    else:  # the fixed split's own per-layer time (tiers/share.py's model)
        decode = 1 / (step + n_l * sp.layer_s)
    if forced:
        why += (
            f"{'; ' if why else ''}{forced:.0%} of the misses are only in the file's mapping: the "
            f"CPU's, read at {disk_gbps:g} GB/s (--disk-gbps)"
        )
    total = layout.total_bytes if layout is not None else 0
    missing_bytes = (1 - hit) * total
    mmap_bytes = n_mmap / n_total * total if n_total else 0.0
    stage_s = (missing_bytes - mmap_bytes) / pcie + mmap_bytes / min(pcie, disk)
    prefill = prompt_rows / stage_s if missing_bytes else float("inf")
    rates = {"vram": hbm, "pinned": pcie * MISS_EFFICIENCY, "mmap": disk}
    per_token = {"vram": dense_per_token + hit * routed, "pinned": miss - mapped, "mmap": mapped}
    counts = {"vram": plan.n_slots, "pinned": held if tiered else 0, "mmap": n_mmap}
    sizes = {"vram": plan.n_slots * plan.slot_bytes, "pinned": arena + ring, "mmap": int(mmap_bytes)}
    tiers = {
        k: {
            "experts": counts[k],
            "bytes": sizes[k],
            "bytes_per_token": per_token[k],
            "gbps": rates[k] / 1e9,
            "ms_per_token": per_token[k] / rates[k] * 1e3,
        }
        for k in rates
    }
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
        miss - mapped,
        decode,
        bound,
        prefill,
        prompt_rows,
        dict(plan.parts),
        frac,
        cpu_gbps,
        why,
        held if tiered else 0,
        n_mmap,
        int(mmap_bytes),
        ring,
        mapped,
        disk_gbps,
        tiers,
        floor_us,
        ahead,
    )


def pcie_decode_tok_s(
    dense_per_token: float,
    routed: float,
    hit: float,
    hbm_gbps: float,
    pcie_gbps: float,
    ahead: float = 0.0,
    floor_s: float = 0.0,
    swap: float = 0.0,
) -> float:
    """Decode tok/s of one sequence when every miss is read over PCIe (the planner at --pcie-frac 1): the
    all-resident step (floor_s, or the dense and hit bytes at the VRAM rate if longer), then the misses at the
    in-graph zero-copy rate; `ahead`: miss bytes a token the lookahead copies beside the mixers (off the
    critical path); `swap`: bytes a token a learning policy copies into slots, on a side stream beside the
    step but on the misses' link, so the token lasts at least its misses and swaps there."""
    step = max(floor_s, (dense_per_token + hit * routed) / (hbm_gbps * 1e9))
    misses = max(0.0, (1 - hit) * routed - ahead) / (pcie_gbps * 1e9 * MISS_EFFICIENCY)
    return 1 / max(step + misses, misses + swap / (pcie_gbps * 1e9))


def borrowed_estimate(n_slots: int, layout: ExpertLayout) -> int:
    """Slots a long prefill chunk borrows under the static fill (ExpertCache.staging's first plan), whose
    experts the low-RAM arena backs up after the misses."""
    n_l = len(layout.layers)
    cap0 = -(-(layout.n_total - n_slots) // n_l)
    cap = cap0 + -(-2 * cap0 // n_l) + 1
    return min(n_slots, 2 * cap if 2 * cap <= n_slots else cap)


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
        every = p.arena_experts + p.expert_slots >= p.experts_total and not p.ring_bytes
        rows.append(
            (
                "pinned RAM",
                (
                    "every expert (misses read over PCIe)"
                    if every
                    else f"{p.arena_experts:,} more experts (misses read over PCIe), bounce ring "
                    f"{p.ring_bytes / MIB:,.1f} MiB"
                )
                if p.arena_bytes
                else "(all resident)",
                f"{(p.arena_bytes + p.ring_bytes) / MIB:,.0f} MiB",
            )
        )
        if p.mmap_experts:
            what = (
                f"{p.mmap_experts:,} experts only in the file's mapping (page cache or disk; misses on "
                "the CPU, prefill stages them)"
            )
            rows.append(("mmap", what, f"{p.mmap_bytes / MIB:,.0f} MiB"))
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
            + (
                f", {p.mmap_bytes_per_token / 1e6:,.0f} MB from the file's mapping on the CPU"
                if p.mmap_bytes_per_token
                else ""
            )
        )
    if p.tiers is not None and p.experts_total:
        out.append(
            "per decode token: "
            + "; ".join(
                f"{k} {t['bytes_per_token'] / 1e6:,.1f} MB at {t['gbps']:,.1f} GB/s = "
                f"{t['ms_per_token']:,.2f} ms"
                for k, t in p.tiers.items()
                if t["bytes_per_token"] or k == "vram"
            )
        )
    if p.split_why:
        out.append(p.split_why)
    floor = f" after an all-resident step of {p.layer_floor_us:g} us a layer" if p.layer_floor_us else ""
    if p.ahead_bytes_per_token:
        floor += f", {p.ahead_bytes_per_token / 1e6:,.0f} MB of the misses copied ahead beside the mixers"
    out.append(
        f"decode (one sequence): predicted {p.decode_tok_s:,.1f} tok/s{floor}; bandwidth bound "
        f"{p.decode_bound_tok_s:,.1f} tok/s"
    )
    if p.prefill_pcie_bound_tok_s != float("inf"):
        out.append(
            f"prefill ({p.prefill_rows:,}-row passes): at most {p.prefill_pcie_bound_tok_s:,.0f} tok/s "
            "from the staging copies over PCIe"
        )
    return "\n".join(out)

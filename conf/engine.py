"""Engine options: what `Engine.load(path, **options)` and the CLI flags accept."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from strata.errors import ConfigError
from strata.runtime.kvcache import KV_TYPES, check_kv_type
from strata.tiers.budget import RESERVE_MIB, check_expert_cache
from strata.tiers.kvwindow import BLOCK, check_resident
from strata.tiers.lookahead import PREFETCH_DEFAULT, check_prefetch
from strata.tiers.policy import POLICIES, check_policy
from strata.tiers.profile import MODES as PROFILE_MODES
from strata.tiers.profile import check_mode as check_profile_mode
from strata.tiers.share import parse_pcie_frac
from strata.tiers.tables import MODES as TABLE_MODES
from strata.tiers.tables import check_mode as check_table_mode

# what --prefill 0 means (strata.gpu.plan.AUTO_CHUNKS chooses on the GPU)
AUTO_PREFILL = "4096 on the GPU, or 2048 where the budget cannot fit it, at most the context; 512 on the CPU"


@dataclass(frozen=True, slots=True)
class EngineOptions:
    n_ctx: int = 0  # 0 = the model's trained context length
    weight_cache_mib: int = 4096  # f32 cache of dequantized weights; beyond it, dequantize per use
    prefill_chunk: int = 0  # tokens per forward call while reading a prompt; 0 = AUTO_PREFILL
    verify: str | None = None  # expected SHA-256 of the GGUF, checked before use
    backend: str = "numpy"  # "jit": fused llvmlite kernels on quantized weights, MoE experts on the CPU pool
    pool_workers: int = 0  # CPU pool threads; 0 = affinity capped by the cgroup CPU quota
    aux_cpus: str = "auto"  # CPUs for helper threads, kept apart from the workers: "auto" or "0,2-3"
    jit_cache: str | None = field(default_factory=lambda: str(Path.home() / ".cache/strata/jit"))  # None: off
    device: str = (
        "auto"  # auto: the GPU (cupy) when one is visible and the architecture has a GPU path; cuda; cpu
    )
    vram_budget_mib: int = 0  # cap on what Strata allocates on the GPU; 0 = the device's free memory
    vram_reserve_mib: int = RESERVE_MIB  # left free for the driver when the budget is the free memory
    expert_cache: str = (
        "auto"  # auto | off | 6GiB | 4096MiB | 40%: VRAM slots for routed experts (CPU: a stand-in)
    )
    ram_budget_mib: float = 0  # RAM for the expert arena; what it cannot hold stays in the mmap; 0 = no limit
    n_seq: int = (
        1  # sequences at once (the server's --parallel): the GPU plan keeps KV and state room for them
    )
    override_kv: tuple[str, ...] = ()  # KEY=TYPE:VALUE metadata overrides, as llama.cpp's --override-kv
    pcie_frac: str = (
        "auto"  # share of decode misses read over PCIe, the rest on the CPU pool; auto: from the probe
    )
    probe: bool = (
        False  # measure the PCIe and CPU expert rates again instead of reading them from the cache dir
    )
    cache_policy: str = (
        "static"  # static | lru | adaptive: which experts the slots keep, swapped between windows
    )
    swap_budget_mib: int = 64  # what one pass may copy into the slots when the policy swaps experts
    prefetch: int = PREFETCH_DEFAULT  # experts a decode layer copies ahead of its router (0: off)
    routing_profile: str = (
        "auto"  # auto: fill the expert cache from the saved routing profile, count and save; off
    )
    record_routes: str | None = (
        None  # write every routed (token, layer, experts) here (.npz) when there are tiers
    )
    ple_io: str = "auto"  # Qwen4-Exp's n-gram table: auto | ram | mmap | direct (strata.tiers.tables)
    kv_type: str = (
        "auto"  # attention KV cells: auto (f32 on the CPU, f16 on the GPU) | f32 (CPU) | f16 | int8
    )
    kv_grow: bool = False  # the KV takes the expert cache's slots as contexts grow (strata.tiers.grow)
    kv_resident: int = 0  # cells a sequence keeps on the device per attention layer, the rest in RAM; 0: all

    @classmethod
    def from_kwargs(cls, **kw: Any) -> EngineOptions:
        """Build from keyword options, naming the offending option on any bad key or value."""
        known = {f.name for f in fields(cls)}
        for key in kw:
            if key not in known:
                raise ConfigError(key, kw[key], f"unknown engine option; known: {', '.join(sorted(known))}")
        opts = cls(**kw)
        opts.validate()
        return opts

    def validate(self) -> None:
        if self.n_ctx < 0:
            raise ConfigError("n_ctx", self.n_ctx, "must be >= 0 (0 = model default)")
        if self.weight_cache_mib < 0:
            raise ConfigError("weight_cache_mib", self.weight_cache_mib, "must be >= 0")
        if self.prefill_chunk < 0:
            raise ConfigError("prefill_chunk", self.prefill_chunk, f"must be >= 1 (0 = {AUTO_PREFILL})")
        if self.verify is not None and (len(self.verify) != 64 or not _is_hex(self.verify)):
            raise ConfigError("verify", self.verify, "must be a 64-character hex SHA-256")
        check_backend(self.backend, self.pool_workers, self.aux_cpus, ("backend", "pool_workers", "aux_cpus"))
        check_device(self.device, self.vram_budget_mib, ("device", "vram_budget_mib"))
        check_tiers(self.expert_cache, self.vram_reserve_mib, ("expert_cache", "vram_reserve_mib"))
        check_ram_budget(self.ram_budget_mib, "ram_budget_mib")
        parse_pcie_frac(self.pcie_frac, "pcie_frac")
        check_table_mode(self.ple_io, "ple_io")
        check_kv_type(self.kv_type, "kv_type")
        if not isinstance(self.kv_grow, bool):
            raise ConfigError("kv_grow", self.kv_grow, "must be true or false")
        check_resident(self.kv_resident, "kv_resident")
        check_policy(self.cache_policy, "cache_policy")
        check_profile_mode(self.routing_profile, "routing_profile")
        if self.swap_budget_mib < 0:
            raise ConfigError(
                "swap_budget_mib", self.swap_budget_mib, "must be >= 0 (0: the cache never swaps)"
            )
        check_prefetch(self.prefetch, "prefetch")
        if self.n_seq < 1:
            raise ConfigError("n_seq", self.n_seq, "must be >= 1")
        parse_overrides(self.override_kv, "override_kv")


BACKENDS = ("numpy", "jit")
_CPU_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
_FLAGS = ("--backend", "--pool-workers", "--aux-cpus")


def check_backend(
    backend: str, pool_workers: int, aux_cpus: str, names: tuple[str, str, str] = _FLAGS
) -> None:
    """The CPU backend settings, checked once for the options and the flags (`names` say which)."""
    if backend not in BACKENDS:
        raise ConfigError(names[0], backend, f"must be one of {', '.join(BACKENDS)}")
    if pool_workers < 0:
        raise ConfigError(names[1], pool_workers, "must be >= 0 (0 = affinity capped by the CPU quota)")
    if aux_cpus != "auto" and not _CPU_LIST.fullmatch(aux_cpus):
        raise ConfigError(names[2], aux_cpus, "must be 'auto' or a CPU list like 0,2-3")


DEVICES = ("auto", "cuda", "cpu")


def check_device(
    device: str, vram_budget_mib: int, names: tuple[str, str] = ("--device", "--vram-budget-mib")
) -> None:
    """The GPU settings, checked once for the options and the flags (`names` say which)."""
    if device not in DEVICES:
        raise ConfigError(names[0], device, f"must be one of {', '.join(DEVICES)}")
    if vram_budget_mib < 0:
        raise ConfigError(names[1], vram_budget_mib, "must be >= 0 (0 = the GPU's free memory)")


def check_tiers(
    expert_cache: str, reserve_mib: int, names: tuple[str, str] = ("--expert-cache", "--vram-reserve-mib")
) -> None:
    check_expert_cache(expert_cache, names[0])
    if reserve_mib < 0:
        raise ConfigError(names[1], reserve_mib, "must be >= 0")


def check_ram_budget(mib: float, flag: str = "--ram-budget-mib") -> None:
    """The RAM budget's form; whether it holds what the model needs is checked at load (tiers/ram.py)."""
    if not isinstance(mib, (int, float)) or isinstance(mib, bool) or not mib >= 0:
        raise ConfigError(flag, mib, "must be a number of MiB >= 0 (0 = no limit: every expert in RAM)")


_KV_TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "bool": lambda v: {"true": True, "false": False}[v.lower()],
}


def parse_overrides(items: tuple[str, ...] | list[str], flag: str = "--override-kv") -> dict[str, Any]:
    """KEY=TYPE:VALUE (TYPE: int, float, bool, str) -> {KEY: value}, llama-server's syntax. A scalar given for
    an array key sets every element (`qwen4exp.attention.compress_ratios=int:4`)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, rest = item.partition("=")
        kind, colon, raw = rest.partition(":")
        if not (sep and colon and key and kind in _KV_TYPES):
            raise ConfigError(flag, item, "must be KEY=TYPE:VALUE with TYPE int, float, bool or str")
        try:
            out[key] = _KV_TYPES[kind](raw)
        except (ValueError, KeyError):
            raise ConfigError(flag, item, f"{raw!r} is not a {kind}") from None
    return out


def add_override_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--override-kv",
        action="append",
        default=[],
        metavar="KEY=TYPE:VALUE",
        help="override a GGUF metadata key (repeatable; TYPE int, float, bool or str), e.g. "
        "qwen4exp.attention.compress_ratios=int:4 for files whose converter wrote zeros",
    )


def add_backend_flags(p: argparse.ArgumentParser) -> None:
    """--backend, --pool-workers, --aux-cpus: shared by `strata generate` and `strata serve`."""
    # The command line defaults to the fastest CPU path; the library default stays numpy, the reference.
    p.add_argument(
        "--backend",
        default="jit",
        choices=BACKENDS,
        help="jit (default): fused llvmlite kernels "
        "on the quantized weights and MoE experts on the CPU pool; numpy: the reference path",
    )
    p.add_argument(
        "--pool-workers",
        type=int,
        default=0,
        help="CPU pool threads (0 = the CPUs this process may use, capped by its cgroup quota)",
    )
    p.add_argument(
        "--aux-cpus",
        default="auto",
        help="CPUs for helper threads, kept apart from the pool workers: auto or a list like 0,2-3",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=DEVICES,
        help="auto: the GPU through cupy when one is visible (llama, qwen3moe, qwen3next), else the CPU",
    )
    p.add_argument(
        "--vram-budget-mib",
        type=int,
        default=0,
        help="cap on what Strata allocates on the GPU "
        "(0 = its free memory minus --vram-reserve-mib); start-up fails with the plan when the dense "
        "part does not fit",
    )
    p.add_argument(
        "--vram-reserve-mib",
        type=int,
        default=RESERVE_MIB,
        help=f"VRAM left to the driver when the budget is the free memory (default {RESERVE_MIB})",
    )
    p.add_argument(
        "--expert-cache",
        default="auto",
        help="VRAM slots for routed experts: auto (what the budget "
        "leaves; all of them when they fit), off, or a size such as 6GiB, 4096MiB, 40%% (of all experts); "
        "the rest are read from pinned RAM. On the CPU a numpy store stands in for the slots",
    )
    p.add_argument(
        "--ram-budget-mib",
        type=float,
        default=0,
        help="RAM for the expert arena (pinned on "
        "the GPU): when it cannot hold every expert, the arena keeps the likeliest misses and the "
        "rest stay in the file's mapping (page cache or disk), computed on the CPU in decode and "
        "staged through a small pinned bounce ring in prefill (0 = no limit; fractions allowed)",
    )
    p.add_argument(
        "--pcie-frac",
        default="auto",
        help="share of the decode misses the GPU reads over PCIe; the "
        "rest run on the CPU pool beside it (0: all on the CPU, 1: none). auto (default): from a start-up "
        "probe of both rates, kept in the cache dir",
    )
    p.add_argument(
        "--probe", action="store_true", help="measure the PCIe and CPU expert rates again at start-up"
    )
    p.add_argument(
        "--cache-policy",
        default="static",
        choices=POLICIES,
        help="which experts the cache keeps: static "
        "(the fill), lru, adaptive (the uses an expert can expect while it holds a slot, with hysteresis), "
        "swapped between passes beside the decode; the CPU share's per-token split follows the swaps",
    )
    p.add_argument(
        "--routing-profile",
        default="auto",
        choices=PROFILE_MODES,
        help="auto (default): fill the expert "
        "cache from this model's routing profile in the cache dir, count routing while running and save it "
        "at exit; off: the static fill, nothing saved",
    )
    p.add_argument(
        "--swap-budget-mib",
        type=int,
        default=64,
        help="what one pass may bring into the cache's slots "
        "when the policy swaps experts, by copy or riding a decode pass's read (default 64; 0: never swap)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=PREFETCH_DEFAULT,
        help="lookahead prefetch: experts each GPU "
        "decode layer copies from RAM ahead of its router, predicted by the router on the layer's input "
        f"while its attention or DeltaNet runs (default {PREFETCH_DEFAULT}; 0: off); the CPU "
        "stand-in (--device cpu --expert-cache SIZE) stages all K before the mixer",
    )
    p.add_argument(
        "--record-routes",
        default=None,
        metavar="FILE",
        help="write every routed (token, layer, "
        "experts) of the run to FILE (.npz) at exit, for `strata tiers simulate` (the expert tiers: a GPU "
        "whose experts do not all fit, or --device cpu --expert-cache SIZE)",
    )
    p.add_argument(
        "--ple-io",
        default="auto",
        choices=TABLE_MODES,
        help="Qwen4-Exp's n-gram (PLE) table: ram "
        "(locked in RAM; the page cache when locking is refused), mmap (the page cache), direct "
        "(O_DIRECT row reads, for RAM that cannot hold it); auto: ram when it fits in half the free RAM",
    )
    p.add_argument(
        "--kv-type",
        default="auto",
        choices=KV_TYPES,
        help="attention KV cells: f32 (CPU only), f16, "
        "or int8 (a scale per token, head and 32 channels: 28%% of f32's bytes, 56%% of f16's); auto "
        "(default): f32 on the CPU, f16 on the GPU",
    )
    p.add_argument(
        "--kv-grow",
        action="store_true",
        help="the plan keeps KV room for each sequence's first prefill chunk and gives the rest to the "
        "expert cache; a growing context takes slots back (the least used experts first) and a finished one "
        "returns them. The worst case (every sequence at the whole context) must still fit beside the dense "
        "part. Every expert then also lives in pinned RAM, where lent slots' experts are read from. A MoE "
        "model's flag (dense models plan their KV whole); on the CPU it lends the stand-in cache's slots "
        "(--expert-cache SIZE)",
    )
    p.add_argument(
        "--kv-resident",
        type=int,
        default=0,
        metavar="N",
        help="cells of each attention layer a sequence keeps on the device (its most recent, a multiple of "
        f"{BLOCK}); older cells move to (pinned) RAM and attention reads them there. 0 (default): every cell "
        "on the device",
    )
    add_override_flag(p)
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        help=f"tokens per prefill chunk (0 = {AUTO_PREFILL}); under a VRAM budget a long chunk stages the "
        "missing experts through borrowed cache slots, once a pass whatever its length",
    )


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """Engine.load keywords from those flags, checked with errors that name the flag."""
    check_backend(args.backend, args.pool_workers, args.aux_cpus)
    check_device(args.device, args.vram_budget_mib)
    check_tiers(args.expert_cache, args.vram_reserve_mib)
    check_ram_budget(args.ram_budget_mib)
    if args.prefill < 0:
        raise ConfigError("--prefill", args.prefill, f"must be >= 1 (0 = {AUTO_PREFILL})")
    parse_overrides(args.override_kv)
    parse_pcie_frac(args.pcie_frac)
    if args.swap_budget_mib < 0:
        raise ConfigError(
            "--swap-budget-mib", args.swap_budget_mib, "must be >= 0 (0: the cache never swaps)"
        )
    check_prefetch(args.prefetch)
    check_resident(args.kv_resident)
    return {
        "prefetch": args.prefetch,
        "pcie_frac": args.pcie_frac,
        "probe": args.probe,
        "ple_io": args.ple_io,
        "kv_type": args.kv_type,
        "kv_grow": args.kv_grow,
        "kv_resident": args.kv_resident,
        "record_routes": args.record_routes,
        "cache_policy": args.cache_policy,
        "swap_budget_mib": args.swap_budget_mib,
        "routing_profile": args.routing_profile,
        "override_kv": tuple(args.override_kv),
        "backend": args.backend,
        "pool_workers": args.pool_workers,
        "aux_cpus": args.aux_cpus,
        "device": args.device,
        "vram_budget_mib": args.vram_budget_mib,
        "vram_reserve_mib": args.vram_reserve_mib,
        "expert_cache": args.expert_cache,
        "ram_budget_mib": args.ram_budget_mib,
        "prefill_chunk": args.prefill,
    }


def _is_hex(s: str) -> bool:
    try:
        int(s, 16)
    except ValueError:
        return False
    return True

"""How many pool workers, and on which CPUs: the process's real CPU budget, not the host's.

A container limited by a CFS quota still sees every host core in os.cpu_count() and often in its
affinity mask; running more busy threads than the quota allows gets the whole process throttled
(one seed lost 2,242 s to 76 workers on a 16-core quota). So the default is
min(affinity, ceil(cgroup quota)). The inputs are plain values so tests can inject them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from strata.errors import ConfigError


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 `cpu.max` ("max 100000" or "150000 100000") -> CPUs (1.5), None when unlimited."""
    parts = text.split()
    if len(parts) < 1 or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100000
    return int(parts[0]) / period if period > 0 else None


def parse_cfs(quota_us: str, period_us: str) -> float | None:
    """cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us -> CPUs, None when unlimited (-1)."""
    q, p = int(quota_us), int(period_us)
    return q / p if q > 0 and p > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def cgroup_quota(root: Path = Path("/")) -> float | None:
    """The tightest CPU quota on this process's cgroup path (v2, else v1), in CPUs; None if none.

    `root` is the filesystem root, so a test can build a fake /proc and /sys under a tmp dir.
    """
    quotas: list[float] = []
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        hier, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        rel = Path(path.lstrip("/"))
        if hier == "0" and ctrls == "":  # v2 unified: the quota applies at every level up to the root
            for d in [rel, *rel.parents]:
                q = parse_cpu_max(_read(root / "sys/fs/cgroup" / d / "cpu.max") or "max")
                if q is not None:
                    quotas.append(q)
        elif "cpu" in ctrls.split(","):
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                base = root / "sys/fs/cgroup" / mount
                for d in [rel, Path()]:  # the nested path, and the namespace root a container sees
                    q_us, p_us = _read(base / d / "cpu.cfs_quota_us"), _read(base / d / "cpu.cfs_period_us")
                    if q_us and p_us and (q := parse_cfs(q_us, p_us)) is not None:
                        quotas.append(q)
    return min(quotas) if quotas else None


def default_workers(affinity: int, quota: float | None) -> int:
    """Worker threads for a process allowed `affinity` CPUs under a CFS quota of `quota` CPUs."""
    n = affinity if quota is None else min(affinity, math.ceil(quota - 1e-9))
    return max(1, n)


def parse_cpu_list(text: str) -> list[int]:
    """ "0,2-3" -> [0, 2, 3] (the kernel's cpu-list format); ValueError on anything else."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        a, b = int(lo), int(hi or lo)
        if a < 0 or b < a:
            raise ValueError(part)
        out.extend(range(a, b + 1))
    return sorted(set(out))


@dataclass(frozen=True, slots=True)
class CpuPlan:
    workers: int
    worker_cpus: tuple[int, ...]  # the set every pool worker is pinned to
    aux_cpus: tuple[int, ...]  # where helper threads go; == worker_cpus when nothing can be kept apart


def plan(allowed: list[int], quota: float | None, workers: int, aux: str) -> CpuPlan:
    """Workers (0 = default) and `--aux-cpus` (`auto` or a cpu list) -> who runs where.

    auto: workers take the first CPUs of the affinity mask and helpers the rest, when any are left
    over; with none left (or under a quota, where pinning does not add CPU time) nobody is pinned.
    """
    allowed = sorted(allowed)
    if aux == "auto":
        n = workers or default_workers(len(allowed), quota)
        if quota is None and n < len(allowed):
            return CpuPlan(n, tuple(allowed[:n]), tuple(allowed[n:]))
        return CpuPlan(n, tuple(allowed), tuple(allowed))
    try:
        aux_set = parse_cpu_list(aux)
    except ValueError:
        raise ConfigError("--aux-cpus", aux, "must be 'auto' or a CPU list like 0,2-3") from None
    if not set(aux_set) <= set(allowed):
        raise ConfigError("--aux-cpus", aux, f"names CPUs outside this process's affinity {allowed}")
    rest = [c for c in allowed if c not in aux_set]
    if not rest:
        raise ConfigError("--aux-cpus", aux, "leaves no CPU for the pool workers")
    n = workers or default_workers(len(rest), quota)
    return CpuPlan(n, tuple(rest), tuple(aux_set))


def host_plan(workers: int, aux: str) -> CpuPlan:
    """`plan` for this process, reading its affinity and cgroup quota (once, at start-up)."""
    return plan(sorted(os.sched_getaffinity(0)), cgroup_quota(), workers, aux)

"""The sampler: a thread that reads, at a fixed rate, the server process's RSS, CPU and IO (psutil) and every
GPU's busy share, power and memory (nvidia-ml-py). Busy and power side by side catch a GPU that "looks busy
but is not": utilisation counts time with any kernel resident, power shows whether the SMs work.

Without nvidia-ml-py or a driver the GPU series are left out, with the reason in `gpu_note`; without a
server process to watch (a remote --url), the process series are."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil


@dataclass(slots=True)
class Series:
    t: list[float] = field(default_factory=list)  # perf_counter, the client's clock
    # the server process, % of one core; these run from the first sample and stop early if the process goes
    cpu_pct: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    read_bytes: list[int] = field(default_factory=list)  # cumulative
    write_bytes: list[int] = field(default_factory=list)
    sys_cpu_pct: list[float] = field(default_factory=list)  # the whole machine, % of all cores
    gpu_util_pct: list[list[float]] = field(default_factory=list)  # [sample][gpu]
    gpu_power_w: list[list[float]] = field(default_factory=list)
    gpu_mem_bytes: list[list[int]] = field(default_factory=list)


def _open_gpus() -> tuple[Any, list[Any], str | None]:
    """(pynvml, device handles, why there are none)."""
    try:
        import pynvml
    except ImportError:
        return None, [], "nvidia-ml-py is not installed (pip install 'strata[bench]')"
    try:
        pynvml.nvmlInit()
        return (
            pynvml,
            [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())],
            None,
        )
    except pynvml.NVMLError as e:
        return None, [], f"NVML: {e}"


class Sampler:
    """start() / stop() around the run; `series` holds the samples, `cost_s` each sample's own time."""

    def __init__(self, pid: int | None, hz: float) -> None:
        self.period = 1.0 / hz
        self.series = Series()
        self.cost_s: list[float] = []  # wall time of each sample, the sampler's overhead
        self.cpu_s = 0.0  # the sampler thread's CPU time, to subtract from the client's
        self.proc: psutil.Process | None = None
        self.proc_note: str | None = "no server process to watch (pass --pid)" if pid is None else None
        if pid is not None:
            try:
                self.proc = psutil.Process(pid)
                self.proc.cpu_percent(None)  # the first call only sets the baseline
            except psutil.Error as e:
                self.proc, self.proc_note = None, f"process {pid}: {e}"
        self.nvml, self.gpus, self.gpu_note = _open_gpus()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="strata-bench-sampler", daemon=True)

    def start(self) -> None:
        psutil.cpu_percent(None)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.nvml is not None:
            self.nvml.nvmlShutdown()

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        next_t = time.perf_counter()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self._sample(t0)
            self.cost_s.append(time.perf_counter() - t0)
            next_t += self.period
            self._stop.wait(max(0.0, next_t - time.perf_counter()))
        self.cpu_s = time.thread_time() - cpu0

    def _sample(self, t: float) -> None:
        s = self.series
        s.t.append(t)
        s.sys_cpu_pct.append(psutil.cpu_percent(None))
        if self.proc is not None:
            try:
                with self.proc.oneshot():
                    cpu, rss, io = (
                        self.proc.cpu_percent(None),
                        self.proc.memory_info().rss,
                        self.proc.io_counters(),
                    )
            except psutil.Error as e:  # the server exited, or its IO is not ours to read: the series end here
                self.proc, self.proc_note = None, f"process series stopped: {e}"
            else:
                s.cpu_pct.append(cpu)
                s.rss_bytes.append(rss)
                s.read_bytes.append(io.read_bytes)
                s.write_bytes.append(io.write_bytes)
        if self.gpus:
            nv = self.nvml
            s.gpu_util_pct.append([float(nv.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.gpus])
            s.gpu_power_w.append([nv.nvmlDeviceGetPowerUsage(h) / 1e3 for h in self.gpus])  # mW
            s.gpu_mem_bytes.append([int(nv.nvmlDeviceGetMemoryInfo(h).used) for h in self.gpus])

    def power_w(self, t0: float, t1: float) -> float | None:
        """Mean power of all GPUs over [t0, t1] (the nearest sample when none fell inside); None unknown."""
        s = self.series
        if not s.gpu_power_w:
            return None
        inside = [sum(p) for t, p in zip(s.t, s.gpu_power_w) if t0 <= t <= t1]
        if not inside:
            mid = (t0 + t1) / 2
            inside = [sum(min(zip(s.t, s.gpu_power_w), key=lambda tp: abs(tp[0] - mid))[1])]
        return sum(inside) / len(inside)

    def notes(self) -> dict[str, str | None]:
        return {"process": self.proc_note, "gpu": self.gpu_note}

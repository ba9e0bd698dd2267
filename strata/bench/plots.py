"""PNG plots of a bench result: tok/s and TTFT against concurrency, and a timeline of the sampler's series
with each scenario's span shaded. matplotlib (the bench / dev extras) draws them, on Agg: no display."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plots(result: dict[str, Any], out: Path) -> list[Path]:
    """The PNGs written; raises ImportError when matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    sweep = result["scenarios"].get("concurrency", {}).get("rows")
    if sweep:
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        xs = [r["concurrency"] for r in sweep]
        ax[0].plot(xs, [r["decode_tok_s"] for r in sweep], "o-", label="per request (decode)")
        ax[0].plot(xs, [r["aggregate_tok_s"] for r in sweep], "s-", label="aggregate")
        ax[0].set(xscale="log", xlabel="concurrency", ylabel="tok/s", title="throughput")
        ax[1].plot(xs, [r["ttft_p50_s"] for r in sweep], "o-", label="p50")
        ax[1].plot(xs, [r["ttft_p99_s"] for r in sweep], "s-", label="p99")
        ax[1].set(xscale="log", xlabel="concurrency", ylabel="seconds", title="time to first token")
        for a in ax:
            a.set_xticks(xs, [str(x) for x in xs])
            a.legend()
        written.append(_save(fig, out / "concurrency.png"))
    written.append(_save(_timeline(plt, result), out / "timeline.png"))
    return written


def _timeline(plt: Any, result: dict[str, Any]) -> Any:
    s = result["samples"]
    gpu = bool(s["gpu_util_pct"])
    fig, axes = plt.subplots(3 if gpu else 2, 1, figsize=(11, 8 if gpu else 5.5), sharex=True)
    cpu_ax, mem_ax = axes[0], axes[1]
    n = len(s["cpu_pct"])  # the process series may have stopped early
    t = s["t"]
    cpu_ax.plot(t, s["sys_cpu_pct"], label="machine (% of all cores)", color="0.6")
    if n:
        cpu_ax.plot(t[:n], s["cpu_pct"], label="server (% of one core)")
        mem_ax.plot(t[:n], [b / 2**20 for b in s["rss_bytes"]], label="server RSS (MiB)")
        io = mem_ax.twinx()
        io.plot(t[:n], _rate(t[:n], s["read_bytes"]), "--", color="tab:green", label="read MB/s")
        io.plot(t[:n], _rate(t[:n], s["write_bytes"]), ":", color="tab:red", label="write MB/s")
        io.set_ylabel("MB/s")
        io.legend(loc="upper right")
    cpu_ax.set(ylabel="CPU %", title=f"sampler at {result['meta']['config']['sample_hz']:g} Hz")
    mem_ax.set(ylabel="MiB")
    if gpu:
        g = axes[2]
        pw = g.twinx()
        for i in range(len(s["gpu_util_pct"][0])):
            g.plot(t, [u[i] for u in s["gpu_util_pct"]], label=f"GPU{i} busy %")
            pw.plot(t, [p[i] for p in s["gpu_power_w"]], "--", label=f"GPU{i} W")
        g.set(ylabel="busy %", ylim=(0, 105))
        pw.set_ylabel("watts")
        pw.legend(loc="upper right")
    for a in axes:
        for name, res in result["scenarios"].items():
            a0, a1 = res["span"]
            a.axvspan(a0, a1, alpha=0.08, color="tab:blue")
            if a is axes[0]:
                a.text(a0, 1.0, name, transform=a.get_xaxis_transform(), fontsize=7, va="bottom", rotation=30)
        a.legend(loc="upper left", fontsize=7)
    axes[-1].set_xlabel("seconds since the bench began")
    return fig


def _rate(t: list[float], cumulative: list[int]) -> list[float]:
    """MB/s between samples (the first sample's rate is 0)."""
    return [0.0] + [
        (b - a) / 1e6 / max(t1 - t0, 1e-9) for a, b, t0, t1 in zip(cumulative, cumulative[1:], t, t[1:])
    ]


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""The bench's result as text tables (one per scenario) and as a JSON file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

HIDDEN = ("t0", "t1", "requests")  # in the JSON, not the tables


def _cell(v: Any) -> str:
    if v is None or isinstance(v, float) and math.isnan(v):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"
    return str(v)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    cols = [k for k in rows[0] if k not in HIDDEN and any(r.get(k) is not None for r in rows)]
    cells = [[_cell(r.get(k)) for k in cols] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in cells]
    return lines


def tables(result: dict[str, Any]) -> str:
    m, o = result["meta"], result["overhead"]
    lines = [
        f"strata bench: {m['model']} at {m['url']}, n_ctx {m['n_ctx']}",
        f"first request after ready: {result['warmup']['first_s']:.2f} s",
    ]
    for name, res in result["scenarios"].items():
        lines += ["", f"== {name}"]
        lines += [f"skipped: {res['skipped']}"] if "skipped" in res else _table(res["rows"])
    notes = [f"{k}: {v}" for k, v in result["notes"].items() if v]
    lines += [
        "",
        "sampler: " + ("; ".join(notes) if notes else "process and GPU series recorded"),
        (
            f"bench overhead: client {o['client_cpu_s']:.2f} s CPU for {o['chunks']} chunks "
            f"({o['client_cpu_us_per_chunk']:.0f} us a chunk), sampler {o['samples']} samples at "
            f"{o['sample_ms_mean']:.2f} ms each (max {o['sample_ms_max']:.2f}), "
            f"{o['sampler_cpu_s']:.2f} s CPU"
        ),
    ]
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: Path) -> None:
    # orjson writes NaN (a TTFT with no token) as null, which json readers accept
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))

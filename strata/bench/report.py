"""The bench's result as text tables (one per scenario) and as a JSON file.

The engine benches (perf/bench_cpu.py, bench_gpu.py, bench_tiers.py) share the shape: `meta` (run_meta) and
`scenarios` of rows, their own raw fields beside them (engine_result), printed by engine_tables.
"""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

HIDDEN = ("t0", "t1", "requests")  # in the JSON, not the tables


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
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


def scenario_lines(scenarios: dict[str, Any]) -> list[str]:
    """`== name` and the scenario's table (or why it was skipped), for each scenario."""
    lines = []
    for name, res in scenarios.items():
        lines += ["", f"== {name}"]
        if "skipped" in res:
            lines.append(f"skipped: {res['skipped']}")
        else:
            lines += _table(res["rows"]) if res["rows"] else ["(no rows)"]
    return lines


def args_config(a: Any) -> dict[str, Any]:
    """A bench's parsed arguments (an argparse.Namespace) as JSON values: paths as strings."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}


def run_meta(**fields: Any) -> dict[str, Any]:
    """A result's `meta`: when the run started (UTC), the CPUs it saw, and what it ran (`fields`)."""
    return {"started": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(), **fields}


def engine_result(
    meta: dict[str, Any], scenarios: dict[str, list[dict[str, Any]]], **raw: Any
) -> dict[str, Any]:
    """An engine bench's result in `strata bench --json`'s shape: meta, then scenarios of rows; `raw`, the
    bench's own fields beside them (what its other scripts read)."""
    return {"meta": meta, "scenarios": {name: {"rows": rows} for name, rows in scenarios.items()}, **raw}


def engine_tables(title: str, result: dict[str, Any]) -> str:
    return "\n".join([title, *scenario_lines(result["scenarios"])])


def tables(result: dict[str, Any]) -> str:
    m, o = result["meta"], result["overhead"]
    lines = [
        f"strata bench: {m['model']} at {m['url']}, n_ctx {m['n_ctx']}",
        f"first request after ready: {result['warmup']['first_s']:.2f} s",
        *scenario_lines(result["scenarios"]),
    ]
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
    # orjson writes NaN (a TTFT with no token) as null, which json readers accept; the engine benches' numbers
    # may be numpy scalars, and keys ints
    path.parent.mkdir(parents=True, exist_ok=True)
    options = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    path.write_bytes(orjson.dumps(result, option=options))

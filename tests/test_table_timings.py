"""PLE lookup-table traffic shows up in a generation's timings (qwen4exp)."""

from __future__ import annotations

from oracle import flagship

from strata.engine import Engine
from strata.sampling.params import SamplingParams


def test_generation_reports_table_rows_and_bytes() -> None:
    paths = flagship.tiny_qwen4exp()
    eng = Engine.load(paths["f32"])
    r = eng.generate(
        [1, 2, 3, 4, 5, 6], max_tokens=4, params=SamplingParams(temperature=0.0), ignore_eos=True
    ).run()
    t = r.timings.to_dict()
    fed = len(r.prompt_ids) + len(r.tokens) - 1  # the last sampled token is never fed
    assert t["table_rows"] > 0 and t["table_rows"] % fed == 0  # the same number of rows per token
    assert t["table_bytes"] > 0 and t["table_bytes"] % t["table_rows"] == 0


def test_direct_reads_show_their_disk_bytes_and_wait() -> None:
    paths = flagship.tiny_qwen4exp()
    eng = Engine.load(paths["f32"], ple_io="direct")
    r = eng.generate(
        [1, 2, 3, 4, 5, 6], max_tokens=3, params=SamplingParams(temperature=0.0), ignore_eos=True
    ).run()
    t = r.timings.to_dict()
    assert t["table_disk_bytes"] >= t["table_bytes"] > 0  # whole 4 KiB blocks around the rows
    assert t["table_wait_ms"] >= 0.0

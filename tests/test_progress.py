"""strata.console.progress: a tqdm bar on a terminal (amount, rate, ETA); elsewhere no bar, one log line
at the end."""

from __future__ import annotations

import logging

import pytest

from strata.console.progress import ProgressBar


def test_without_a_terminal_no_bar_is_drawn_and_one_line_is_logged(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "strata.progress")
    bar = ProgressBar("expert arena", 3 << 20)  # capsys's stderr is no terminal
    for done in (1 << 20, 2 << 20, 3 << 20, 3 << 20):  # a call after the end changes nothing
        bar(done)
    err = capsys.readouterr().err  # no bar; the log line itself only where a handler (a server's) prints it
    assert not err or (err.count("\n") == 1 and err.startswith("strata: expert arena: 3.0 MiB in ")), err
    lines = [r.getMessage() for r in caplog.records if r.name == "strata.progress"]
    assert len(lines) == 1 and lines[0].startswith("expert arena: 3.0 MiB in ") and "MB/s" in lines[0]


def test_on_a_terminal_the_bar_shows_bytes_rate_and_the_total_learned_late(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "strata.progress")
    bar = ProgressBar("synth tiny", 1, force=True)  # the total comes with the first call, as synth's does
    bar(1 << 20, 4 << 20)
    bar(4 << 20, 4 << 20)
    err = capsys.readouterr().err
    assert "synth tiny" in err and "100%" in err and "4.00M" in err and "B/s" in err
    assert not [r for r in caplog.records if r.name == "strata.progress"]  # the bar itself is the record


def test_items_count_without_byte_scaling(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "strata.progress")
    bar = ProgressBar("profile m.gguf", 2, unit="prompt")
    bar(1)
    bar(2)
    assert [r.getMessage() for r in caplog.records][-1].startswith("profile m.gguf: 2 prompt in ")

"""--log-format: text lines as the CLI's others, or one JSON object a line (ts, level, logger, msg, extra
fields), the same flag on serve and generate, and a function for the Python API."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_fixture import running_server

from strata.conf.server import ServerConfig
from strata.console.logs import JsonFormatter, TextFormatter, configure_logging
from strata.errors import ConfigError


def _record(level: int, msg: str, *args: object, **extra: object) -> logging.LogRecord:
    return logging.getLogger("strata.test").makeRecord(
        "strata.test", level, __file__, 1, msg, args, None, extra=extra
    )


def test_json_lines_carry_the_fields_and_the_extras() -> None:
    rec = _record(logging.INFO, "served %d tokens", 7, request_id="r-1", tokens=7)
    obj = json.loads(JsonFormatter().format(rec))
    assert obj["msg"] == "served 7 tokens" and obj["level"] == "info" and obj["logger"] == "strata.test"
    assert obj["request_id"] == "r-1" and obj["tokens"] == 7
    assert obj["ts"].endswith("Z") and obj["ts"][:4].isdigit() and "T" in obj["ts"]
    assert not {"args", "levelno", "pathname", "exc_info"} & set(obj)  # the record's own attributes stay out
    try:
        raise ValueError("bad")
    except ValueError:
        rec = logging.getLogger("strata.test").makeRecord(
            "strata.test", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    obj = json.loads(JsonFormatter().format(rec))
    assert obj["level"] == "error" and "ValueError: bad" in obj["exc"]
    assert "\n" not in JsonFormatter().format(rec)  # the traceback is escaped: still one line


def test_text_lines_read_like_the_cli_s_others() -> None:
    assert TextFormatter().format(_record(logging.INFO, "loading")) == "strata: loading"
    assert TextFormatter().format(_record(logging.WARNING, "open")) == "strata: warning: open"


@pytest.fixture
def strata_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("strata")
    before, level = list(logger.handlers), logger.level
    yield logger
    logger.handlers[:] = before
    logger.setLevel(level)


def test_configure_logging_replaces_its_handler_and_names_a_bad_format(strata_logger: logging.Logger) -> None:
    first = configure_logging("text")
    second = configure_logging("json", logging.DEBUG)
    ours = [h for h in strata_logger.handlers if h.get_name() == "strata"]
    assert ours == [second] and first not in strata_logger.handlers
    assert isinstance(second.formatter, JsonFormatter) and strata_logger.level == logging.DEBUG
    with pytest.raises(ConfigError, match="log_format"):
        configure_logging("xml")
    with pytest.raises(ConfigError, match="--log-format"):
        ServerConfig(log_format="xml").validate()


def test_tier_notes_are_log_records(
    strata_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiers' start-up lines (strata.tiers.telemetry.note) read as before in text and are JSON objects in
    json, a "warning: " line at warning level."""
    from strata.tiers.telemetry import note

    lines = ["PLE table: 1.00 GiB locked in RAM in 0.2 s", "warning: pinning refused. Falling back"]
    configure_logging("text")
    for line in lines:
        note(line)
    assert capsys.readouterr().err.splitlines() == [f"strata: {line}" for line in lines]
    configure_logging("json")
    for line in lines:
        note(line)
    objs = [json.loads(ln) for ln in capsys.readouterr().err.splitlines()]
    assert [(o["logger"], o["level"], o["msg"]) for o in objs] == [
        ("strata.tiers", "info", lines[0]),
        ("strata.tiers", "warning", "pinning refused. Falling back"),
    ]


def test_serve_json_logs_one_object_a_line(smollm2_path: Path) -> None:
    with running_server(smollm2_path, "--log-format", "json", "--verbose", key=None) as srv:
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=120)
        assert r.status_code == 200
        lines = [ln for ln in srv.output().splitlines() if ln.strip()]
    objs = [json.loads(ln) for ln in lines]  # every line, uvicorn's too
    assert all({"ts", "level", "logger", "msg"} <= set(o) for o in objs)
    warn = [o for o in objs if o["level"] == "warning"]
    assert warn and "no API key set" in warn[0]["msg"]
    ready = [o for o in objs if o["msg"].startswith("serving ")]
    assert len(ready) == 1 and ready[0]["url"] == srv.url and ready[0]["ready_s"] > 0
    assert any(o["logger"] == "uvicorn.access" and "/v1/completions" in o["msg"] for o in objs)
    assert any(o["logger"] == "strata.scheduler" and o["level"] == "debug" for o in objs)  # --verbose


def test_generate_takes_the_flag(smollm2_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "strata",
            "generate",
            "--model",
            str(smollm2_path),
            "--prompt",
            "Hi",
            "--max-tokens",
            "2",
            "--temperature",
            "0",
            "--json",
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["tokens"]) == 2
    assert all(json.loads(ln)["msg"] for ln in out.stderr.splitlines() if ln.strip())


def test_the_handler_follows_sys_stderr(monkeypatch) -> None:
    """A handler made while one stderr was in place writes to the stderr of the moment (a closed one was hit
    when test order put a server's configure_logging before pytest swapped stderr again)."""
    import io
    import logging

    from strata.console.logs import configure_logging

    handler = configure_logging("text", loggers=("strata.test_follow",))
    try:
        now = io.StringIO()
        monkeypatch.setattr("sys.stderr", now)
        logging.getLogger("strata.test_follow").info("hello")
        assert now.getvalue() == "strata: hello\n"
    finally:
        logging.getLogger("strata.test_follow").removeHandler(handler)

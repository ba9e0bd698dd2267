"""Where Strata's log records go: one stderr handler on the `strata` logger (and uvicorn's, for the server in
json), as `strata: message` lines or one JSON object a line. The command line sets it from --log-format; a
program using the Python API calls `configure_logging` itself (a library leaves logging alone until asked)."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from collections.abc import Sequence

from strata.conf.logs import check_log_format

# what every LogRecord carries; anything else on a record came from `extra=` and goes into the JSON object
# (but uvicorn's color_message: the message again, with terminal colour codes)
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


class TextFormatter(logging.Formatter):
    """`strata: message`, and `strata: warning: message` from warnings up, as the CLI's other lines."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING:
            msg = f"{record.levelname.lower()}: {msg}"
        if record.exc_info:
            msg += "\n" + self.formatException(record.exc_info)
        return f"strata: {msg}"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts (UTC, ISO 8601), level, logger, msg, the record's extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds")
        out: dict[str, object] = {
            "ts": ts.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update((k, v) for k, v in vars(record).items() if k not in _STANDARD and k not in out)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on whatever sys.stderr is when a record comes, not when it was made: a program (or a
    test runner) that swaps stderr later must not leave the handler writing into a closed stream."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # type: ignore[no-untyped-def]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # type: ignore[no-untyped-def]
        pass


def configure_logging(
    log_format: str = "text", level: int = logging.INFO, loggers: Sequence[str] = ("strata",)
) -> logging.Handler:
    """Send these loggers' records at `level` and above to stderr in `log_format` ("text" or "json"). Called
    again, it replaces the handler it installed before rather than adding a second one."""
    check_log_format(log_format, "log_format")
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.set_name("strata")
    for name in loggers:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == "strata"]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(level)
    return handler

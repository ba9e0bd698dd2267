"""The log format flag, the same on `serve`, `generate` and `profile`; the Python API passes it to
`strata.console.logs.configure_logging`."""

from __future__ import annotations

import argparse

from strata.errors import ConfigError

LOG_FORMATS = ("text", "json")


def check_log_format(value: str, name: str = "--log-format") -> None:
    if value not in LOG_FORMATS:
        raise ConfigError(name, value, f"must be one of {', '.join(LOG_FORMATS)}")


def add_log_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text (default): `strata: message` lines on stderr; json: one object a line (ts, "
        "level, logger, msg and the record's extra fields), for a service's log collector",
    )

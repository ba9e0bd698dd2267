"""What the subcommands print for a program to read: one JSON object a line on stdout."""

from __future__ import annotations

import json
import sys


def dump_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")

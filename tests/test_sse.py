"""SSE payloads through orjson: the same JSON text as json.dumps with compact separators (so the same values
for every client), on chunks with the text a model can stream."""

from __future__ import annotations

import json

import pytest

from strata.api.sse import event_json

TEXTS = [
    " world",
    "héllo — 世界 🙂",
    'line\nbreak\ttab "quoted" back\\slash',
    "\x00\x1f\x7f",
    "\u2028\u2029",
    "</script>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_event_json_is_compact_json_dumps(text: str) -> None:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1764745200,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}],
        "timings": {"prompt_n": 12, "prompt_ms": 31.25, "predicted_per_second": 78.8},
    }
    out = event_json(chunk)
    assert out == json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
    assert "\n" not in out and json.loads(out) == chunk  # one SSE data line, the same values

"""The feature scenarios: a tool-call loop, thinking at each reasoning effort, and images (when the server
takes them). Rows as in scenarios.py."""

from __future__ import annotations

import base64
import io
import json

from PIL import Image

from strata.bench.scenarios import Bench, Row, Skipped, ask, row

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


async def tools(b: Bench) -> list[Row]:
    """Round trips of a forced tool call and its result: the prompt grows each round, and the prefix cache
    should keep TTFT from growing with it. A call streams whole (the server holds it until it closes), so
    a round's TTFT is the time to its complete call, with no gaps to time."""
    messages: list[dict[str, object]] = [
        {
            "role": "user",
            "content": "What is the weather in Paris, Berlin and Rome? Ask get_weather, one city at a time.",
        }
    ]
    rows = []
    for r in range(1, b.cfg.tool_rounds + 1):
        body = {
            "messages": messages,
            "max_tokens": b.cfg.tokens * 2,
            "temperature": 0.7,
            "seed": r,
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
        }
        s = await b.chat(body)
        rows.append(row(s, round=r, calls=len(s.tool_calls)))
        if s.error is not None or not s.tool_calls:
            break
        messages.append({"role": "assistant", "content": None, "tool_calls": s.tool_calls})
        messages += [
            {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": 14 + r})}
            for call in s.tool_calls
        ]
    return rows


async def thinking(b: Bench) -> list[Row]:
    """One request per reasoning_effort: how much it thinks and how fast (eos ends it, not max_tokens)."""
    rows = []
    for effort in b.cfg.efforts:
        body = ask(
            "A bat and a ball cost 1.10 in total; the bat costs 1.00 more than the ball. What does the "
            "ball cost?",
            b.cfg.tokens * 4,
            reasoning_effort=effort,
            ignore_eos=False,
        )
        s = await b.chat(body)
        rows.append(
            row(
                s,
                effort=effort,
                reasoning_chars=s.reasoning_chars,
                content_chars=s.content_chars,
                finish=s.finish_reason,
            )
        )
    return rows


def png_data_url(side: int = 448) -> str:
    """A gradient PNG as a data URL: pixels a vision encoder has to read, not a blank."""
    img = Image.linear_gradient("L").resize((side, side)).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def images(b: Bench) -> list[Row]:
    """TTFT and prompt tokens with 0, 1 and 2 images; skipped when the server refuses images."""
    url = png_data_url()
    rows = []
    for n in range(3):
        parts = [{"type": "text", "text": "Describe what you see."}]
        parts += [{"type": "image_url", "image_url": {"url": url}} for _ in range(n)]
        s = await b.chat(ask(parts, b.cfg.tokens))
        if n == 1 and s.error is not None and s.error.startswith("HTTP 4"):
            raise Skipped(f"the server refuses images: {s.error}")
        rows.append(row(s, images=n))
    return rows

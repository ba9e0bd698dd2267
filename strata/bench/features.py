"""The feature scenarios: a tool-call loop, thinking at each reasoning effort, and images (when the server
takes them). Rows as in scenarios.py."""

from __future__ import annotations

import base64
import io
import secrets

from PIL import Image

from strata.bench.scenarios import Bench, Row, Skipped, ask, fits, row, text_of

READ_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "The contents of a file in the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


async def tools(b: Bench) -> list[Row]:
    """An IDE assistant's tool loop: a system prompt of --long-prompt tokens (the instructions and the open
    files), a task, then rounds of a forced read_file call answered by a file of --tool-result tokens. Each
    request resends the whole conversation; the prefix cache should compute only what is new (the call's
    tokens as the template renders them and the file), so TTFT stays flat as the prompt grows.
    `computed_share` is the prompt tokens computed (not cached) over those sent, over the rounds so far. A
    call streams whole (the server holds it until it closes), so a round's TTFT is the time to its complete
    call, with no gaps to time."""
    tag = secrets.token_hex(4)  # no earlier run's prefix answers for this one
    repo = await text_of(b.c, "def handler(request): return respond(request.body) ", b.cfg.long_prompt)
    messages: list[dict[str, object]] = [
        {"role": "system", "content": f"[{tag}] You are a coding assistant. The open files:\n{repo}"},
        {"role": "user", "content": "Find where requests are parsed: read the files one by one."},
    ]
    rows: list[Row] = []
    sent = computed = 0
    for r in range(1, b.cfg.tool_rounds + 1):
        body = {
            "messages": messages,
            "max_tokens": b.cfg.tokens * 2,
            "temperature": 0.7,
            "seed": r,
            "tools": [READ_FILE_TOOL],
            "tool_choice": "required",
        }
        s = await b.chat(body)
        sent += s.prompt_tokens
        computed += s.prompt_tokens - s.cached_tokens
        rows.append(
            row(
                s,
                round=r,
                calls=len(s.tool_calls),
                computed_tokens=s.prompt_tokens - s.cached_tokens,
                computed_share=computed / sent if sent else None,
            )
        )
        if s.error is not None or not s.tool_calls:
            break
        if not fits(b, s.prompt_tokens + len(s.tool_calls) * (b.cfg.tool_result + 64), b.cfg.tokens * 2):
            break  # the next round would not fit the server's context
        messages.append({"role": "assistant", "content": None, "tool_calls": s.tool_calls})
        for i, call in enumerate(s.tool_calls):
            code = f"class Parser{r}_{i}: def parse(self, raw): return split(raw) "
            file = await text_of(b.c, code, b.cfg.tool_result)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": file})
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

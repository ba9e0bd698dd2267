"""The thinking switch reaches a real thinking template (Qwen3's, on the tiny qwen3moe model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from server_fixture import Server, running_server

ASK = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def server(tiny_qwen3moe: dict) -> Iterator[Server]:
    # the tiny model was trained for 1024 positions; a larger --ctx-size is refused
    with running_server(Path(tiny_qwen3moe["f32"]), "--ctx-size", "1024") as s:
        yield s


def test_openai_reasoning_effort_toggles_the_template(server: Server) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0) as c:
        off = c.chat.completions.create(
            model="m", messages=ASK, max_tokens=1, temperature=0, reasoning_effort="none"
        )
        on = c.chat.completions.create(
            model="m", messages=ASK, max_tokens=1, temperature=0, reasoning_effort="high"
        )
    # Qwen3's template pre-writes an empty "<think>\n\n</think>\n\n" when thinking is off
    assert off.usage.prompt_tokens == on.usage.prompt_tokens + 4


def test_anthropic_thinking_toggles_the_template(server: Server) -> None:
    with anthropic.Anthropic(base_url=server.url, api_key=server.key, max_retries=0) as c:
        on = c.messages.count_tokens(
            model="c", messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}
        )
        off = c.messages.count_tokens(model="c", messages=ASK, thinking={"type": "disabled"})
    assert off.input_tokens == on.input_tokens + 4

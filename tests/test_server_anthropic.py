"""The real server driven by the official anthropic SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from server_fixture import Server, running_server


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[Server]:
    with running_server(smollm2_path) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key=server.key, max_retries=0) as c:
        yield c


ASK = [{"role": "user", "content": "What is the capital of France?"}]


def test_message(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model="claude-ide-model", max_tokens=24, messages=ASK, extra_body={"temperature": 0}
    )
    assert m.model == "claude-ide-model"
    assert m.content[0].type == "text" and "Paris" in m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 5 and m.usage.output_tokens > 0


def test_stream_matches_message(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model="c", max_tokens=20, messages=ASK, extra_body={"temperature": 0})
    with client.messages.stream(model="c", max_tokens=20, messages=ASK, extra_body={"temperature": 0}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model="c", max_tokens=40, messages=ASK, extra_body={"temperature": 0}, stop_sequences=["Paris"]
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "Paris"
    assert "Paris" not in m.content[0].text


TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    m = client.messages.create(
        model="c",
        max_tokens=48,
        messages=msgs,
        tools=[TOOL],
        extra_body={"temperature": 0},
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert m.stop_reason == "tool_use"
    use = next(b for b in m.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict)
    msgs += [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21C, sunny"}],
        },
    ]
    final = client.messages.create(
        model="c", max_tokens=32, messages=msgs, tools=[TOOL], extra_body={"temperature": 0}
    )
    assert any(b.type == "text" and b.text for b in final.content)


def test_tool_use_streams_input_json(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="c",
        max_tokens=48,
        messages=[{"role": "user", "content": "Rome weather"}],
        tools=[TOOL],
        extra_body={"temperature": 0},
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as s:
        final = s.get_final_message()
    use = next(b for b in final.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict)


def test_thinking_enabled_and_disabled(client: anthropic.Anthropic) -> None:
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        m = client.messages.create(
            model="c", max_tokens=16, messages=ASK, extra_body={"temperature": 0}, thinking=thinking
        )
        assert m.content and m.stop_reason in ("end_turn", "max_tokens")


def test_count_tokens(client: anthropic.Anthropic) -> None:
    n = client.messages.count_tokens(model="c", messages=ASK)
    m = client.messages.create(model="c", max_tokens=1, messages=ASK, extra_body={"temperature": 0})
    # Anthropic counts prefix-cache reads apart from input_tokens
    assert n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_wrong_key_is_401_in_anthropic_shape(server: Server) -> None:
    with (
        anthropic.Anthropic(base_url=server.url, api_key="nope", max_retries=0) as bad,
        pytest.raises(anthropic.AuthenticationError) as e,
    ):
        bad.messages.create(model="c", max_tokens=2, messages=ASK)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"

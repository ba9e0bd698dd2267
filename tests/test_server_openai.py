"""The real server driven by the official openai SDK: chat, streaming, tools, reasoning, invariants."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from server_fixture import Server, running_server


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[Server]:
    with running_server(smollm2_path) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0) as c:
        yield c


ASK = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="gpt-4o", messages=ASK, temperature=0, max_tokens=24)
    assert r.model == "gpt-4o"  # the name the client sent
    assert "Paris" in r.choices[0].message.content
    assert r.usage.prompt_tokens > 5 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    timings = r.model_extra["timings"]
    assert timings["predicted_n"] == r.usage.completion_tokens and timings["prompt_ms"] > 0


def test_stream_equals_non_stream_at_temperature_zero(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=20)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=ASK,
            temperature=0,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_same_seed_same_text(client: openai.OpenAI) -> None:
    kw = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell me a short story."}],
        "temperature": 1.0,
        "max_tokens": 16,
        "seed": 7,
    }
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_tool_call_round_trip(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    r = client.chat.completions.create(
        model="m",
        messages=msgs,
        tools=[WEATHER],
        temperature=0,
        max_tokens=48,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict)
    msgs += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "sunny"})},
    ]
    final = client.chat.completions.create(
        model="m", messages=msgs, tools=[WEATHER], temperature=0, max_tokens=32
    )
    assert final.choices[0].message.content
    assert final.choices[0].finish_reason in ("stop", "length")


def test_tool_call_streams_as_tool_call_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER],
        temperature=0,
        max_tokens=48,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    calls, finish = [], None
    for c in stream:
        d = c.choices[0].delta
        calls += d.tool_calls or []
        finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls and calls[0].function.name == "get_weather"
    json.loads("".join(c.function.arguments or "" for c in calls))


def test_reasoning_effort_none_and_high_are_accepted(client: openai.OpenAI) -> None:
    for effort in ("none", "high"):
        r = client.chat.completions.create(
            model="m", messages=ASK, temperature=0, max_tokens=8, reasoning_effort=effort
        )
        assert r.choices[0].message.content is not None


def test_text_completion(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="m", prompt="The three primary colors are", max_tokens=8, temperature=0
    )
    assert r.choices[0].text and r.usage.completion_tokens == 8
    s = list(
        client.completions.create(
            model="m", prompt="The three primary colors are", max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text


def test_models_lists_alias(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1"]


def test_wrong_key_is_401(server: Server) -> None:
    with (
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError),
    ):
        bad.chat.completions.create(model="m", messages=ASK, max_tokens=2)


def test_response_format_json_object_is_valid_json(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        temperature=0,
        max_tokens=64,
        response_format={"type": "json_object"},
    )
    obj = json.loads(r.choices[0].message.content)
    assert isinstance(obj, dict)


def test_response_format_json_schema_is_followed(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Give the capital of France and its population."}],
        temperature=0,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"city", "population"} and isinstance(obj["population"], int)

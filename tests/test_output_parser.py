"""OutputParser: any chunking of an output gives the same content, reasoning and tool calls as
the whole text at once; expected splits for Qwen3/Hermes shapes; content is held back only while
it could still be the start of a tag."""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from typing import Any

import pytest

from strata.api.output_parser import (
    ContentDelta,
    Delta,
    OutputParser,
    ReasoningDelta,
    ToolCallDelta,
    new_call_id,
)

# name -> (parser kwargs, output text, expected content, expected reasoning, [(name, args)], errors)
CASES: dict[str, tuple[dict[str, Any], str, str, str, list[tuple[str, str]], int]] = {
    "plain": (
        {},
        "Hello, world! a < b, <b>x</b>, <thinking>, <tool_cal> and </to are text. é😀",
        "Hello, world! a < b, <b>x</b>, <thinking>, <tool_cal> and </to are text. é😀",
        "",
        [],
        0,
    ),
    "think then content": (
        {},
        "<think>\nLet me add 2 and 2.\n\n</think>\n\nThe answer is 4.",
        "The answer is 4.",
        "Let me add 2 and 2.",
        [],
        0,
    ),
    "think opened by the prompt": (
        {"start_in_reasoning": True},
        "The user wants X.\n</think>\n\nHere is X.",
        "Here is X.",
        "The user wants X.",
        [],
        0,
    ),
    "think then tool call": (
        {},
        (
            '<think>\nNeed weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Zürich", "days": 2}}\n</tool_call>'
        ),
        "",
        "Need weather.",
        [("get_weather", '{"city":"Zürich","days":2}')],
        0,
    ),
    "two tool calls after content": (
        {},
        (
            'Checking both.\n\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {"y": [1, 2.5], "s": "</tool <think>"}}\n</tool_call>'
        ),
        "Checking both.\n\n",
        "",
        [("a", '{"x":1}'), ("b", '{"y":[1,2.5],"s":"</tool <think>"}')],
        0,
    ),
    "empty think with reasoning off": (
        {"reasoning": False},
        "<think>\n\n</think>\n\nJust the answer.",
        "Just the answer.",
        "",
        [],
        0,
    ),
    "think text dropped with reasoning off": (
        {"reasoning": False},
        "<think>secret</think>visible",
        "visible",
        "",
        [],
        0,
    ),
    "reasoning off, opened by the prompt": (
        {"reasoning": False, "start_in_reasoning": True},
        "hmm\n</think>\n\nOK",
        "OK",
        "",
        [],
        0,
    ),
    "malformed tool JSON": (
        {},
        'Before <tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call> after',
        'Before <tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call> after',
        "",
        [],
        1,
    ),
    "bad call then good call": (
        {},
        '<tool_call>\n{"arguments": {}}\n</tool_call><tool_call>\n{"name": "g"}\n</tool_call>',
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        "",
        [("g", "{}")],
        1,
    ),
    "unclosed tool call": (
        {},
        'Sure.\n<tool_call>\n{"name": "f", "arguments": {"q": "a<b"}}\n',
        "Sure.\n",
        "",
        [("f", '{"q":"a<b"}')],
        0,
    ),
    "unclosed malformed tool call": (
        {},
        '<tool_call>\n{"name": "f", "argu',
        '<tool_call>\n{"name": "f", "argu',
        "",
        [],
        1,
    ),
    "forced tool_call prefix": (
        {"prefix": "<tool_call>\n"},
        '{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
        "",
        "",
        [("f", '{"x":1}')],
        0,
    ),
    "forced prefix with the name": (
        {"prefix": '<tool_call>\n{"name": "f", "arguments": '},
        '{"q": "ü"}}\n</tool_call>',
        "",
        "",
        [("f", '{"q":"ü"}')],
        0,
    ),
    "forced prefix, model writes junk": (
        {"prefix": "<tool_call>\n"},
        "oops</tool_call> ok",
        "oops</tool_call> ok",
        "",
        [],
        1,
    ),
    "forced prefix, unclosed": (
        {"prefix": "<tool_call>\n"},
        '{"name": "f", "arguments": {}}',
        "",
        "",
        [("f", "{}")],
        0,
    ),
    "stray close tag": ({}, "</think>\n\nAnswer", "Answer", "", [], 0),
    "tags back to back": (
        {},
        'a<think>b</think>c<tool_call>{"name":"n"}</tool_call>d<<think> >e',
        "acd<",
        "b>e",
        [("n", "{}")],
        0,
    ),
    "unclosed think": ({}, "<think>\nstill going  \n", "", "still going", [], 0),
    "arguments as a string": (
        {},
        '<tool_call>{"name": "s", "arguments": "{\\"k\\": [true]}"}</tool_call>',
        "",
        "",
        [("s", '{"k":[true]}')],
        0,
    ),
}


def _run(kwargs: dict[str, Any], chunks: list[str]) -> tuple[OutputParser, list[Delta]]:
    counter = itertools.count()
    p = OutputParser(make_id=lambda: f"call_{next(counter)}", **kwargs)
    deltas: list[Delta] = []
    for c in chunks:
        deltas += p.push(c)
    deltas += p.finish()
    return p, deltas


def _summary(p: OutputParser, deltas: list[Delta]) -> tuple[str, str, list[tuple[int, str, str, str]], int]:
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    calls = [(d.index, d.id, d.name, d.arguments_json) for d in deltas if isinstance(d, ToolCallDelta)]
    # The accumulated views agree with the deltas, and no delta is empty.
    assert (content, reasoning) == (p.content, p.reasoning)
    assert calls == [(c.index, c.id, c.name, c.arguments_json) for c in p.tool_calls]
    assert all(d.text for d in deltas if not isinstance(d, ToolCallDelta))
    return content, reasoning, calls, len(p.errors)


def _chunkings(text: str, rng: random.Random) -> list[list[str]]:
    out = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    out.append(list(text))
    for _ in range(40):
        cuts = (
            sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
            if len(text) > 1
            else []
        )
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_expected_split(name: str) -> None:
    kwargs, text, content, reasoning, calls, errors = CASES[name]
    got = _summary(*_run(kwargs, [text]))
    assert got[:2] == (content, reasoning)
    assert [(c[2], c[3]) for c in got[2]] == calls
    assert [c[0] for c in got[2]] == list(range(len(calls)))
    assert got[3] == errors


@pytest.mark.parametrize("name", list(CASES))
def test_any_chunking_matches_whole_text(name: str) -> None:
    kwargs, text = CASES[name][:2]
    whole = _summary(*_run(kwargs, [text]))
    rng = random.Random(name)
    for chunks in _chunkings(text, rng):
        assert _summary(*_run(kwargs, chunks)) == whole, chunks


def _held(text: str) -> int:
    """Brute force: the longest suffix of text that is a proper prefix of a content tag."""
    tags = ("<think>", "</think>", "<tool_call>")
    return max(
        (n for n in range(1, len(text) + 1) for t in tags if n < len(t) and t.startswith(text[-n:])),
        default=0,
    )


def test_content_is_held_only_while_it_could_be_a_tag() -> None:
    rng = random.Random(3)
    pieces = ["<", "</", "<t", "<th", "thin", "k", "<too", "l_c", "all", ">", "x", " ", "\n", "é"]
    checked = 0
    while checked < 300:
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        if any(t in text for t in ("<think>", "</think>", "<tool_call>")):
            continue
        checked += 1
        p = OutputParser()
        for i in range(1, len(text) + 1):
            p.push(text[i - 1])
            assert p.content == text[: i - _held(text[:i])], (text, i)
        p.finish()
        assert p.content == text


def test_eager_emission_examples() -> None:
    p = OutputParser()
    assert p.push("Hello <") == [ContentDelta("Hello ")]
    assert p.push("to") == []
    assert p.push("x") == [ContentDelta("<tox")]
    assert p.push("a</") == [ContentDelta("a")]
    assert p.push("t") == []
    assert p.push("o") == [ContentDelta("</to")]  # "</to" cannot become </think>
    assert p.push("<too") == []
    assert p.push('l_call>{"name": "f"') == []
    assert p.push("}</tool_call>\n") == [ToolCallDelta(0, p.tool_calls[0].id, "f", "{}")]
    assert p.push("\n Done") == [ContentDelta("Done")]
    assert p.finish() == []


def test_reasoning_streams_but_holds_trailing_whitespace() -> None:
    p = OutputParser()
    assert p.push("<think>\n") == []
    assert p.push("step one") == [ReasoningDelta("step one")]
    assert p.push(" \n") == []
    assert p.push("two</th") == [ReasoningDelta(" \ntwo")]
    assert p.push("ink>\n\n") == []
    assert p.push("Hi") == [ContentDelta("Hi")]


def test_call_ids_and_delta_types() -> None:
    ids = {new_call_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)
    p = OutputParser()
    (call,) = p.push('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert isinstance(call, ToolCallDelta) and re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.name = "g"  # type: ignore[misc]
    assert not hasattr(ContentDelta("x"), "__dict__")


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "f", "arguments": [1]}',
        '{"name": "", "arguments": {}}',
        '["f", {}]',
        '{"name": 3}',
        '{"name": "f", "arguments": "not json"}',
        '{"name": "f"} trailing',
        "",
    ],
)
def test_unusable_tool_calls_become_content_and_errors(body: str) -> None:
    text = f"<tool_call>{body}</tool_call>"
    p, _ = _run({}, [text])
    assert p.tool_calls == [] and p.content == text
    assert len(p.errors) == 1 and p.errors[0].startswith("tool call 0: ")


def test_push_after_finish_is_an_error_and_finish_is_idempotent() -> None:
    p = OutputParser()
    p.push("a <tool")
    assert p.finish() == [ContentDelta("<tool")]
    assert p.finish() == []
    with pytest.raises(RuntimeError):
        p.push("x")

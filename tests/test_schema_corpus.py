"""Constrained decoding over a corpus of real-world JSON Schemas (tests/data/json_schemas: OpenAI and
Anthropic function-calling examples, IDE tools, JSON-Schema-test-suite style keyword cases), each
decoded through GrammarConstraint on the Qwen3 vocabulary and by SmolLM2; every output, finished
or cut short and closed, must validate with `jsonschema`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jsonschema.validators import validator_for

from strata.constraints.closing import closing_suffix
from strata.constraints.constraint import GrammarConstraint
from strata.constraints.schema import compile_schema, tool_call_schema
from strata.engine import Engine
from strata.runtime.finish import FinishReason
from strata.sampling.params import SamplingParams
from strata.text.tokenizer import Tokenizer

CORPUS = {
    p.stem: json.loads(p.read_text(encoding="utf-8"))
    for p in sorted((Path(__file__).parent / "data" / "json_schemas").glob("*.json"))
}
IDE_TOOLS = {name.removeprefix("ide_"): s for name, s in CORPUS.items() if name.startswith("ide_")}


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3moe: dict[str, Path]) -> Tokenizer:
    """The Qwen3 tokenizer (151,669 tokens) of the tiny Qwen3-MoE fixture."""
    return Tokenizer.from_gguf(tiny_qwen3moe["f32"])


@pytest.fixture(scope="module")
def noise(qwen3: Tokenizer) -> np.ndarray:
    """[vocab] random logits, tokens holding a closing quote or bracket lifted so that some decodes
    end by themselves (the rest are cut short and closed). Rolled by a random shift per step."""
    closers = np.array([any(c in qwen3.token_bytes(i) for c in b'"}]') for i in range(qwen3.vocab_size)])
    return np.random.default_rng(0).standard_normal(qwen3.vocab_size).astype(np.float32) + 3.0 * closers


def _validate(schema: Any, text: str) -> None:
    validator_for(schema)(schema).validate(json.loads(text))


def _decode(
    tok: Tokenizer, schema: Any, noise: np.ndarray, seed: int, seed_text: str = "", steps: int = 200
) -> tuple[str, bool]:
    """(the text, whether the grammar ended it) of a greedy decode over rolled noise."""
    grammar = compile_schema(schema, tok, seed_text)
    c = GrammarConstraint(grammar)
    rng, out = np.random.default_rng(seed), []
    for _ in range(steps):
        tid = int(np.argmax(c.mask(np.roll(noise, int(rng.integers(noise.size))))))
        if tid in tok.eot_ids:
            return seed_text + tok.decode(out), True
        c.advance(tid)
        out.append(tid)
        if c.done:
            return seed_text + tok.decode(out), True
    text = seed_text + tok.decode(out)
    return text + closing_suffix(grammar.text, text), False


def test_the_corpus_is_large_and_every_schema_is_a_valid_json_schema() -> None:
    assert len(CORPUS) >= 30
    for name, schema in CORPUS.items():
        validator_for(schema).check_schema(schema)
        assert "$comment" in schema, f"{name}: say where the schema comes from"


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_random_logit_decodes_are_valid_instances(qwen3: Tokenizer, noise: np.ndarray, name: str) -> None:
    for seed in range(2):
        text, _ = _decode(qwen3, CORPUS[name], noise, seed)
        _validate(CORPUS[name], text)


def test_some_decodes_end_by_themselves_and_some_are_closed(qwen3: Tokenizer, noise: np.ndarray) -> None:
    ended = [_decode(qwen3, s, noise, 0)[1] for s in CORPUS.values()]
    assert 5 < sum(ended) < len(ended) - 5, "both paths (the grammar's end, closing_suffix) must be exercised"


@pytest.mark.parametrize(
    "name",
    [
        "suite_nested_arrays",
        "openai_ui_recursive",
        "suite_string_lengths",
        "openai_send_email",
        "ide_multi_edit",
        "suite_enum_mixed",
    ],
)
def test_prefixes_of_an_output_close_into_valid_instances(
    qwen3: Tokenizer, noise: np.ndarray, name: str
) -> None:
    text, _ = _decode(qwen3, CORPUS[name], noise, 1)
    grammar = compile_schema(CORPUS[name], qwen3).text
    for cut in sorted(set(np.linspace(0, len(text) - 1, 40).astype(int).tolist())):
        _validate(CORPUS[name], text[:cut] + closing_suffix(grammar, text[:cut]))


@pytest.mark.parametrize("name", sorted(IDE_TOOLS))
def test_forced_tool_calls_continue_the_seed_into_valid_arguments(
    qwen3: Tokenizer, noise: np.ndarray, name: str
) -> None:
    calls = tool_call_schema(IDE_TOOLS)
    named = f'{{"name": {json.dumps(name)}, "arguments": '
    for seed_text in ('{"name": "', named):
        text, _ = _decode(qwen3, calls, noise, 3, seed_text)
        call = json.loads(text)
        if seed_text == named:
            assert call["name"] == name
        _validate(IDE_TOOLS[call["name"]], json.dumps(call["arguments"]))


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Iterator[Engine]:
    yield Engine.load(smollm2_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "ask"),
    [
        ("openai_get_weather", "What's the weather in Paris in celsius?"),
        ("ide_bash", "List the files in the current directory."),
        ("suite_oneof_discriminated", "Describe a circle of radius 2."),
    ],
)
def test_smollm2_writes_valid_instances(smollm2: Engine, name: str, ask: str) -> None:
    """A real model under the mask: temperature 0, 40 tokens, closed if cut short."""
    tok = smollm2.tokenizer
    grammar = compile_schema(CORPUS[name], tok)
    messages = [{"role": "user", "content": f"{ask} Answer with JSON only."}]
    gen = smollm2.generate(
        messages=messages,
        max_tokens=40,
        params=SamplingParams(temperature=0.0),
        constraints=[GrammarConstraint(grammar)],
    )
    text = "".join(c.text for c in gen)
    if gen.result.finish_reason is FinishReason.LENGTH:
        text += closing_suffix(grammar.text, text)
    _validate(CORPUS[name], text)

"""strata/constraints on llguidance: the vocabulary's special and end tokens, the mask on the logits,
the mask thread == no thread, our schema rules (closed objects, oneOf, formats, whitespace), errors
that name the rejected part, forced-call seeds, closing_suffix, and the mask time at Qwen3's
vocabulary."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jsonschema.validators import validator_for
from llguidance import LLMatcher

from strata.constraints.closing import closing_suffix
from strata.constraints.constraint import ConstraintError, GrammarConstraint
from strata.constraints.schema import SchemaError, compile_schema, grammar_text, tool_call_schema
from strata.constraints.vocab import byte_vocab
from strata.text.tokenizer import Tokenizer

WEATHER = {
    "type": "object",
    "required": ["city"],
    "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
}


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3moe: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_gguf(tiny_qwen3moe["f32"])


def accepts(schema: Any, text: str) -> bool:
    """Is text a whole instance under our grammar for schema? (walked byte by byte)"""
    m = LLMatcher(byte_vocab(), grammar_text(schema), log_level=0)
    return m.consume_tokens(list(text.encode())) and m.is_accepting()


def _feed(c: GrammarConstraint, tok: Tokenizer, text: str) -> None:
    for tid in tok.encode(text, add_special=False):
        c.advance(tid)


def test_special_tokens_never_match_and_end_tokens_only_end(qwen3: Tokenizer) -> None:
    c = GrammarConstraint(compile_schema(WEATHER, qwen3, '{"city": "'))
    allowed = np.isfinite(c.mask(np.zeros(qwen3.vocab_size, np.float32)))
    special = [i for i in range(qwen3.vocab_size) if qwen3.is_special(i)]
    assert allowed.sum() > 100_000 and not allowed[special].any()  # inside a string: any text, no <|im_end|>
    _feed(c, qwen3, 'Paris"}')
    assert c.done
    ends = np.flatnonzero(np.isfinite(c.mask(np.zeros(qwen3.vocab_size, np.float32))))
    assert ends.size and set(ends.tolist()) <= qwen3.eot_ids


def test_the_mask_keeps_allowed_logits_and_drops_padding(qwen3: Tokenizer) -> None:
    c = GrammarConstraint(compile_schema(WEATHER, qwen3))
    logits = np.random.default_rng(0).standard_normal(151_936).astype(np.float32)  # Qwen3's padded rows
    out = c.mask(logits)
    kept = np.isfinite(out)
    assert np.array_equal(out[kept], logits[kept]) and not kept[qwen3.vocab_size :].any()
    assert all(qwen3.decode([int(t)]).lstrip().startswith("{") for t in np.flatnonzero(kept))


def test_masks_from_the_mask_thread_equal_masks_computed_inline(qwen3: Tokenizer) -> None:
    noise = np.random.default_rng(1).standard_normal(qwen3.vocab_size).astype(np.float32)

    def decode(pool: ThreadPoolExecutor | None) -> list[int]:
        c, out = GrammarConstraint(compile_schema(WEATHER, qwen3), pool), []
        for step in range(60):
            tid = int(np.argmax(c.mask(np.roll(noise, 7919 * step))))
            if tid in qwen3.eot_ids or c.done:
                break
            c.advance(tid)
            out.append(tid)
        return out

    with ThreadPoolExecutor(1) as pool:
        assert decode(pool) == decode(None)


def test_a_refused_token_is_a_constraint_error(qwen3: Tokenizer) -> None:
    c = GrammarConstraint(compile_schema(WEATHER, qwen3))
    with pytest.raises(ConstraintError, match="refused token"):
        c.advance(qwen3.encode("hello", add_special=False)[0])


@pytest.mark.parametrize(
    ("schema", "where", "why"),
    [
        (
            {"properties": {"tags": {"type": "array", "uniqueItems": True}}},
            "properties.tags.uniqueItems",
            "uniqueItems",
        ),
        ({"properties": {"a": {"not": {"type": "null"}}}}, "properties.a.not", "not"),
        (
            {"properties": {"code": {"type": "string", "pattern": "(?<=a)b"}}},
            "properties.code.pattern",
            "look-around",
        ),
        ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "properties.a.$ref", "does not exist"),
        ({"properties": {"n": {"type": "quux"}}}, "properties.n.type", "quux"),
        # the keyword "if", not the property named "not"
        ({"properties": {"not": {"type": "integer"}}, "if": {"required": ["not"]}}, "if", "if"),
        ({"enum": []}, "", "Unsatisfiable"),
        (False, "", "object schema"),
    ],
)
def test_a_schema_llguidance_cannot_take_names_the_part(
    qwen3: Tokenizer, schema: Any, where: str, why: str
) -> None:
    with pytest.raises(SchemaError) as e:
        compile_schema(schema, qwen3)
    assert e.value.where == where and why in e.value.reason


@pytest.mark.parametrize("depth", [150, 5000])
def test_deep_schemas_are_refused_not_crashed(qwen3: Tokenizer, depth: int) -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    with pytest.raises(SchemaError):
        compile_schema(schema, qwen3)


def test_declared_properties_close_the_object_unless_it_says_otherwise() -> None:
    assert accepts({"type": "object", "properties": {}}, "{}")
    assert not accepts({"type": "object", "properties": {}}, '{"x": 1}')
    assert not accepts(WEATHER, '{"city": "a", "x": 1}')
    assert accepts({**WEATHER, "additionalProperties": True}, '{"city": "a", "x": [1, {}]}')
    assert accepts({"type": "object"}, '{"anything": [1, {"x": null}]}')
    merged = {
        "$defs": {"base": {"properties": {"id": {"type": "integer"}}, "required": ["id"]}},
        "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"tag": {"type": "string"}}, "required": ["tag"]}],
    }
    assert accepts(merged, '{"id": 1, "tag": "x"}')  # allOf's objects stay open: each declares part of it


def test_one_of_is_decoded_as_any_of_and_unknown_formats_are_annotations() -> None:
    assert accepts({"oneOf": [{"type": "integer"}, {"type": "string"}]}, '"x"')
    assert accepts({"type": "string", "format": "int64"}, '"anything"')
    assert accepts({"type": "string", "format": "email"}, '"a@b.com"')
    assert not accepts({"type": "string", "format": "email"}, '"not an email"')
    assert not accepts({"type": "string", "pattern": "^[A-Z]{3}$"}, '"ABCD"')


def test_whitespace_is_enough_to_pretty_print_and_bounded() -> None:
    assert accepts(WEATHER, json.dumps({"city": "a", "days": 2}, indent=2))
    assert accepts(WEATHER, '{"city":"a"}')
    assert not accepts(WEATHER, '{\n\n\n"city": "a"}')
    assert not accepts(WEATHER, '{"city": "a"' + " " * 30 + "}")


def test_forced_call_seeds_and_tool_refs(qwen3: Tokenizer) -> None:
    point = {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
    }
    plot = {
        "$defs": {"point": point},
        "type": "object",
        "properties": {"origin": {"$ref": "#/$defs/point"}},
        "required": ["origin"],
    }
    calls = tool_call_schema({"get_weather": WEATHER, "plot": plot})
    assert accepts(calls, '{"name": "plot", "arguments": {"origin": {"x": 1, "y": 2}}}')
    assert not accepts(calls, '{"name": "plot", "arguments": {"origin": {"x": 1}}}')
    assert not accepts(calls, '{"name": "delete", "arguments": {}}')
    c = GrammarConstraint(compile_schema(calls, qwen3, '{"name": "plot", "arguments": '))
    _feed(c, qwen3, '{"origin": {"x": 1, "y": 2}}}')
    assert c.done
    with pytest.raises(ValueError, match="does not start an instance"):
        compile_schema(calls, qwen3, '{"name": "delete"')
    with pytest.raises(ValueError):
        tool_call_schema({})


@pytest.mark.parametrize(
    ("prefix", "suffix"),
    [
        ("", '{"city":""}'),
        ("{", '"city":""}'),
        ('{"ci', 'ty":""}'),
        ('{"city": "Par', '"}'),
        ('{"city": "Paris", "u', 'nit":"fahrenheit"}'),
        ('{"city": "a", "days": -', "0}"),
        ('{"city": "a", "unit": "fahr', 'enheit"}'),
        ('{"city": "a\\', '""}'),
        ('{"city": "\\u00', '00"}'),
        ('{"city": "a",', '"unit":"fahrenheit"}'),
        ('{"city": "a"}', ""),
    ],
)
def test_closing_suffix_examples(prefix: str, suffix: str) -> None:
    assert closing_suffix(grammar_text(WEATHER), prefix) == suffix


def test_closing_suffix_spells_missing_required_keys_and_fills_formats() -> None:
    schema = {
        "type": "object",
        "required": ["to", "n", "tags"],
        "properties": {
            "to": {"type": "string", "format": "email"},
            "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        },
    }
    check = validator_for(schema)(schema)
    for prefix in (
        "",
        '{"to": "someone',
        '{"to": "a@b.com", "n": 1',
        '{"to": "a@b.com", "n": 1, "tags": ["x',
    ):
        check.validate(json.loads(prefix + closing_suffix(grammar_text(schema), prefix)))


def test_mask_time_per_token_at_the_qwen3_vocabulary(qwen3: Tokenizer) -> None:
    """The per-token work the mask thread does (advance: consume the token, compute the next mask)
    and the draw's share (apply it), along a 1,000-token document; printed, with a generous bound."""
    row = {
        "type": "object",
        "required": ["id", "name"],
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "score": {"type": ["number", "null"]},
            "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}},
            "email": {"type": "string", "format": "email"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        },
    }
    schema = {"type": "object", "properties": {"rows": {"type": "array", "items": row}}, "required": ["rows"]}
    rows = [
        {
            "id": i,
            "name": f'row é \\ " {i}',
            "score": 0.5 if i % 2 else None,
            "tags": ["a"],
            "email": "a.b@example.com",
            "code": "ABC-1234",
        }
        for i in range(20)
    ]
    doc = json.dumps({"rows": rows}, ensure_ascii=False)
    c = GrammarConstraint(compile_schema(schema, qwen3))
    logits = np.random.default_rng(0).standard_normal(151_936).astype(np.float32)
    advance, apply = [], []
    for tid in qwen3.encode(doc, add_special=False):
        t0 = time.perf_counter()
        c.mask(logits)
        t1 = time.perf_counter()
        c.advance(tid)
        apply.append(t1 - t0)
        advance.append(time.perf_counter() - t1)
    assert c.done
    for label, ts in (("advance + next mask", advance), ("apply to the logits", apply)):
        ms = np.array(ts) * 1e3
        median, p99 = np.median(ms), np.percentile(ms, 99)
        print(f"\n{label}: {ms.size} tokens, median {median:.3f} ms, p99 {p99:.3f} ms")
        assert p99 < 25.0

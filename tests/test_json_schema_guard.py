"""SchemaPrefix against jsonschema: every prefix of generated instances passes, closing_suffix turns
each prefix into a valid instance, off-schema continuations fail without touching the state, and a
greedy decode over a fake vocabulary with random logits always ends in a valid instance."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import numpy as np
import pytest

from strata.constrain import JsonConstraint, SchemaConstraint
from strata.json_guard import JsonPrefix
from strata.json_schema_guard import (
    MAX_WS,
    SchemaPrefix,
    allowed_token_mask,
    closing_suffix,
    tool_call_schema,
)

WEATHER = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}}}
POINT = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
         "required": ["x", "y"], "additionalProperties": False}
PLOT = {"$defs": {"point": POINT, "shape": {"type": "object", "required": ["kind"], "properties": {
            "kind": {"enum": ["poly", "dot"]},
            "points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 3}}}},
        "type": "object", "required": ["origin"], "properties": {
            "shapes": {"type": "array", "items": {"$ref": "#/$defs/shape"}, "maxItems": 3},
            "origin": {"$ref": "#/$defs/point"}}}
SCHEMAS: dict[str, Any] = {
    "weather": WEATHER,
    "nested": {"type": "object", "required": ["address", "tags"], "properties": {
        "address": {"type": "object", "required": ["street"], "properties": {
            "street": {"type": "string", "maxLength": 12}, "zip": {"type": ["string", "null"]}}},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "score": {"type": "number"}, "active": {"type": "boolean"}}},
    "anyof": {"type": "object", "required": ["value", "mode"], "properties": {
        "value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}, {"type": "null"},
                            {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]},
        "mode": {"oneOf": [{"const": "fast"}, {"const": 1}, {"enum": [True, 2.5, "slow", 12]}]}}},
    "refs": PLOT,
    "tree": {"definitions": {"node": {"type": "object", "required": ["label"], "properties": {
        "label": {"type": "string", "maxLength": 4},
        "children": {"type": "array", "items": {"$ref": "#/definitions/node"}, "maxItems": 2}}}},
        "$ref": "#/definitions/node"},
    "free": {"type": "object", "required": ["meta"], "properties": {
        "meta": {}, "extra": True, "kv": {"type": "object", "additionalProperties": {"type": "integer"}}}},
    "open": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
             "additionalProperties": {"type": "string"}},
    "escapes": {"type": "object", "required": ['a"b', "é/ü", "tab\tkey"], "properties": {
        'a"b': {"type": "string"}, "é/ü": {"type": "integer"}, "tab\tkey": {"type": "boolean"}}},
    "tools": tool_call_schema({"get_weather": WEATHER, "plot": PLOT, "search": {
        "type": "object", "required": ["query"],
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}),
}
_CHARS = 'ab é€😀"\\/\n\t\x01'


def _ws(rng: random.Random) -> str:
    return rng.choice(["", "", "", " ", "\n", "  ", " \n", "\t"])


def _resolve(schema: Any, base: Any) -> tuple[Any, Any]:
    """Follow $ref pointers (relative to the nearest $id, as JSON Schema does)."""
    while isinstance(schema, dict):
        if "$id" in schema:
            base = schema
        if "$ref" not in schema:
            break
        target = base
        for part in schema["$ref"].split("#", 1)[1].split("/")[1:]:
            target = target[part]
        schema = target
    return schema, base


def _any(rng: random.Random, depth: int) -> tuple[Any, str]:
    kind = rng.choice(["null", "boolean", "integer", "number", "string"] + ["object", "array"] * (depth < 3))
    schema = {"type": kind, "items": True, "maxItems": 3} if kind == "array" else {"type": kind}
    return _gen(schema, rng, schema, depth + 1)


def _gen(schema: Any, rng: random.Random, base: Any, depth: int = 0) -> tuple[Any, str]:
    """A random instance of schema and one way to write it (canonical literals, <= 2 ws per gap)."""
    schema, base = _resolve(schema, base)
    if schema is True or schema == {}:
        return _any(rng, depth)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _gen(rng.choice(schema[key]), rng, base, depth)
    if "const" in schema or "enum" in schema:
        value = schema["const"] if "const" in schema else rng.choice(schema["enum"])
        return value, json.dumps(value, ensure_ascii=False)
    kind = schema.get("type", "object")
    kind = rng.choice(kind) if isinstance(kind, list) else kind
    if kind == "object":
        return _gen_object(schema, rng, base, depth)
    if kind == "array":
        lo = schema.get("minItems", 0)
        pairs = [_gen(schema.get("items", True), rng, base, depth + 1)
                 for _ in range(rng.randint(lo, min(schema.get("maxItems", 4), lo + 3)))]
        items = ",".join(_ws(rng) + t + _ws(rng) for _, t in pairs) if pairs else _ws(rng)
        return [v for v, _ in pairs], "[" + items + "]"
    if kind == "string":
        s = "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, schema.get("maxLength", 8))))
        # An escaped astral character is two \u escapes: the guard counts it as 2 toward maxLength.
        text = json.dumps(s, ensure_ascii="maxLength" not in schema and rng.random() < 0.5)
        return s, text.replace("/", "\\/") if rng.random() < 0.3 else text
    if kind == "integer":
        v = rng.choice([0, rng.randint(-10**6, 10**6)])
        return v, str(v)
    if kind == "number":
        text = rng.choice(["0", "-0.5", "12", "3.25e2", "1E-3", str(rng.random())])
        return json.loads(text), text
    value = rng.choice([True, False]) if kind == "boolean" else None
    return value, json.dumps(value)


def _gen_object(schema: dict[str, Any], rng: random.Random, base: Any, depth: int) -> tuple[Any, str]:
    props = schema.get("properties", {})
    keys = list(schema.get("required", [])) + [k for k in props if k not in schema.get("required", [])
                                               and rng.random() < 0.6]
    extra = schema.get("additionalProperties", "properties" not in schema)  # the guard's stricter default
    if extra is not False:
        keys += [k for k in (f"x{rng.randint(0, 9)}" for _ in range(rng.randint(0, 2))) if k not in props]
    rng.shuffle(keys)
    value, members = {}, []
    for key in dict.fromkeys(keys):
        value[key], text = _gen(props.get(key, extra), rng, base, depth + 1)
        key_text = json.dumps(key, ensure_ascii=False)
        members.append(_ws(rng) + key_text + _ws(rng) + ":" + _ws(rng) + text + _ws(rng))
    return value, "{" + (",".join(members) if members else _ws(rng)) + "}"


def _cases() -> list[tuple[str, Any, str]]:
    rng = random.Random(2024)
    return [(name, *_gen(schema, rng, schema)) for name, schema in SCHEMAS.items() for _ in range(40)]


CASES = _cases()


def _validators() -> dict[str, Any]:
    """jsonschema is not a dependency: without it, checks fall back to "is JSON" (plus the guard's own)."""
    try:
        from jsonschema.validators import validator_for  # type: ignore[import-untyped]
    except ImportError:
        return {}
    return {name: validator_for(s)(s) for name, s in SCHEMAS.items()}


_VALIDATORS = _validators()


def _check(name: str, text: str) -> None:
    value = json.loads(text)
    if _VALIDATORS:
        _VALIDATORS[name].validate(value)


def test_generated_instances_are_valid() -> None:
    for name, value, text in CASES:
        assert json.loads(text) == value, text
        _check(name, text)


def test_every_prefix_is_accepted_and_completes_only_at_the_end() -> None:
    for name, _, text in CASES:
        g = SchemaPrefix(SCHEMAS[name])
        for i, ch in enumerate(text):
            assert g.feed(ch), f"{name}: rejected {ch!r} at {i} of {text!r}"
            assert g.complete == (i + 1 == len(text)), f"{name}: complete={g.complete} at {i} of {text!r}"


def test_chunked_feeding_reaches_the_same_state() -> None:
    rng = random.Random(7)
    for name, _, text in CASES:
        whole, chunked = SchemaPrefix(SCHEMAS[name]), SchemaPrefix(SCHEMAS[name])
        assert whole.feed(text)
        i = 0
        while i < len(text):
            n = rng.randint(1, 12)
            assert chunked.accepts(text[i : i + n]) and chunked.feed(text[i : i + n])
            i += n
        assert chunked.state == whole.state


def test_closing_suffix_completes_every_prefix_into_a_valid_instance() -> None:
    for name, _, text in CASES[::2]:
        g = SchemaPrefix(SCHEMAS[name])
        for i in range(len(text) + 1):
            suffix = closing_suffix(g)
            closed = g.copy()
            assert closed.feed(suffix) and closed.complete, (name, text[:i], suffix)
            _check(name, text[:i] + suffix)
            if i < len(text):
                assert g.feed(text[i])
        assert closing_suffix(g) == ""


@pytest.mark.parametrize(("prefix", "suffix"), [
    ("", '{"city": ""}'), ("{", '"city": ""}'), ('{"ci', 'ty": ""}'), ('{"city": "Par', '"}'),
    ('{"city": "Paris", "u', 'nit": "celsius"}'), ('{"days": -', '0, "city": ""}'),
    ('{"unit": "fahr', 'enheit", "city": ""}'), ('{"city": "a\\', '\\"}'), ('{"city": "\\u00', '00"}'),
    ('{"days": 1', ', "city": ""}'), ('{"city": "x",', '"unit": "celsius"}'),
])
def test_closing_suffix_examples(prefix: str, suffix: str) -> None:
    g = SchemaPrefix(WEATHER)
    assert g.feed(prefix)
    assert closing_suffix(g) == suffix


@pytest.mark.parametrize(("name", "prefix", "bad"), [
    ("weather", "{", '"town'), ("weather", "{", '"cityx"'), ("weather", '{"city": "a", ', '"city"'),
    ("weather", "{", "}"), ("weather", '{"days": 1', "}"), ("weather", '{"city": ', "1"),
    ("weather", '{"city": ', "null"), ("weather", '{"unit": ', '"kelvin"'), ("weather", '{"unit": "c', "x"),
    ("weather", '{"days": ', "1.5"), ("weather", '{"days": ', "1e3"), ("weather", '{"days": ', '"1"'),
    ("weather", '{"city": "a", "unit": "celsius", "days": 1', ","), ("weather", '{"city": "a"}', "x"),
    ("weather", "", "["), ("weather", '{"city": "a"', " ,}"), ("weather", '{"city"', ": :"),
    ("nested", '{"tags": [', "]"), ("nested", '{"tags": ["a", "b", "c"', ', "d"'),
    ("nested", '{"tags": ["a"', ", 1"), ("nested", '{"address": {"street": "', "x" * 13),
    ("nested", '{"address": {"street": "abcdefghijkl', '\\n"'), ("nested", '{"address": {"zip": ', "5"),
    ("nested", '{"active": ', "tru "), ("nested", '{"score": ', "+1"),
    ("anyof", '{"value": ', "1.5"), ("anyof", '{"value": ', '"abcdef"'),
    ("anyof", '{"value": [true, false', ", true"), ("anyof", '{"mode": ', '"medium"'),
    ("anyof", '{"mode": ', "2}"), ("anyof", '{"mode": 1', "3"),
    ("refs", '{"origin": {"x": 1, "y": 2', ', "'), ("refs", '{"origin": {"x": 1', "}"),
    ("refs", '{"origin": {"x": 1, ', '"x"'), ("tree", '{"label": "ab", "children": [{"label": "', "abcde"),
    ("tree", '{"children": [{"label": "a"}, ', "1"), ("open", '{"id": 1, "x": ', "1"),
    ("open", '{"id": 1, "x": "a", ', '"x"'), ("free", '{"kv": {"a": ', '"s"'),
    ("escapes", "{", '"a\\"c'), ("escapes", "{", '"\\u00e9/\\u00fc"'),
    ("tools", '{"name": "get_weather", "arguments": {"', "query"), ("tools", '{"name": "', "delete"),
    ("tools", '{"name": "search", "arguments": {"query": "q"}', ', "x'),
])
def test_invalid_continuations_are_rejected_and_leave_the_state(name: str, prefix: str, bad: str) -> None:
    g = SchemaPrefix(SCHEMAS[name])
    assert g.feed(prefix), prefix
    before = g.state
    assert not g.accepts(bad)
    assert not g.feed(bad)
    assert g.state == before
    _check(name, prefix + closing_suffix(g))


def test_random_edits_are_sound() -> None:
    """Whatever is accepted completes into a valid instance; "complete" means jsonschema agrees."""
    rng = random.Random(99)
    for _ in range(3000):
        name, _, text = rng.choice(CASES)
        i, op = rng.randint(0, len(text)), rng.randint(0, 2)
        piece = rng.choice('{}[]:,"\\ -+.0123eEtrufalsn\nxé') if op < 2 else ""
        text = text[:i] + piece + text[i + (op > 0):]
        g = SchemaPrefix(SCHEMAS[name])
        if not g.feed(text):
            continue
        _check(name, text if g.complete else text + closing_suffix(g))


def test_accepts_and_copy_do_not_share_mutations() -> None:
    g = SchemaPrefix(WEATHER)
    assert g.feed('{"city": "a", "days": ')
    snapshot = g.copy()
    assert g.accepts("1}") and g.state == snapshot.state
    assert g.feed("1")
    assert snapshot.accepts('"x"') is False and snapshot.feed("2}") and snapshot.complete and not g.complete


def test_declared_properties_close_the_object() -> None:
    assert SchemaPrefix({"type": "object", "properties": {}}).accepts("{ }")
    assert not SchemaPrefix({"type": "object", "properties": {}}).accepts('{"')
    assert SchemaPrefix({"type": "object"}).accepts('{"anything": [1, {"x": null}]}')


def test_whitespace_is_bounded_per_gap() -> None:
    g = SchemaPrefix(WEATHER)
    for gap in (" " * MAX_WS, "\n" * MAX_WS):
        assert g.accepts(gap + "{" + gap + '"city"' + gap + ":" + gap + '"a"' + gap + "}" + gap)
        for where in ("", "{", '{"city"', '{"city":', '{"city": "a"', '{"city": "a"}'):
            assert not g.accepts(where + gap + " ")


def test_unsupported_keywords_are_ignored() -> None:
    schema = {"type": "object", "required": ["age"], "properties": {
        "email": {"type": "string", "format": "email", "pattern": "^.+@.+$", "minLength": 3},
        "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150, "multipleOf": 7},
        "nick": {"type": ["string", "null"], "title": "Nickname", "default": None}, "odd": {"type": "quux"},
        "both": {"allOf": [{"$ref": "#/$defs/a"}, {"properties": {"b": {"type": "integer"}}}]}},
        "$defs": {"a": {"type": "object", "properties": {"a": {"type": "boolean"}}}}}
    g = SchemaPrefix(schema)
    assert g.feed('{"email": "nope", "age": -3, "nick": null, "odd": [1, {}], "both": {"b": 2, "a": true}}')
    assert g.complete
    assert not SchemaPrefix(schema).accepts('{"both": {"c"')
    for weird in ({"$ref": "#/nowhere"}, {"$ref": "other.json#/x"}, {"$ref": "#"}, 5, True):
        assert SchemaPrefix(weird).feed('{"k": [1]}')
    SchemaPrefix({"anyOf": [{"$ref": "#"}]})  # meaningless, but must not recurse forever


def test_tool_call_schema() -> None:
    one = tool_call_schema({"get_weather": WEATHER})
    assert one["properties"]["name"] == {"const": "get_weather"} and one["required"] == ["name", "arguments"]
    assert one["additionalProperties"] is False and list(one["properties"]) == ["name", "arguments"]
    g = SchemaPrefix(SCHEMAS["tools"])
    assert g.feed('{"name": "plot", "arguments": {"origin": {"$ref": 1') is False
    assert g.feed('{"name": "plot", "arguments": {"origin": {"x": 1, "y": 2}, "shapes": [{"kind": "dot"}]}}')
    assert g.complete
    with pytest.raises(ValueError):
        tool_call_schema({})


def test_alternatives_share_a_prefix_until_a_character_decides() -> None:
    g = SchemaPrefix(SCHEMAS["tools"])
    assert g.feed('{"name": "')
    assert len(g.state) == 3
    assert g.feed("s") and len(g.state) == 1
    assert closing_suffix(g) == 'earch", "arguments": {"query": ""}}'


# A fake vocabulary: structural pieces, words, key names, every printable ASCII character.
_VOCAB = sorted(set(
    ['{"', "{", "}", '"}', '"}}', '":', '": ', ' "', '"', '",', '", "', ",", ', "', "[", "]", '["', '"]',
     "[{", "}]", ' {"', "\n", " ", "  ", "\n ", '{"type', '{"name', ": {", "},", "}}", "]}", "-", ".", "e",
     "true", "false", "null", "tr", "ue", "fa", "nu", "ll", "\\", "\\n", "\\u00e9", "12", "ü", "3.5", "0",
     "Paris", " is", " a", " city", " known", " for", " its", "weather", "function", "description", "é", "😀"]
    + [k for s in ("city", "unit", "days", "celsius", "fahrenheit", "address", "street", "zip", "tags",
                   "score", "active", "value", "mode", "fast", "slow", "shapes", "origin", "kind", "poly",
                   "dot", "points", "label", "children", "meta", "extra", "kv", "name", "arguments",
                   "get_weather", "plot", "search", "query", "limit", "id")
       for k in (s, f'"{s}', f'{s}"', f'"{s}":', f'"{s}"')]
    + [chr(c) for c in range(32, 127)]))
_EOS = len(_VOCAB)


def _greedy(schema: Any, rng: np.random.Generator, max_steps: int) -> tuple[str, int]:
    g, out = SchemaPrefix(schema), list[str]()
    for step in range(max_steps):
        order = np.argsort(-rng.standard_normal(len(_VOCAB) + 1), kind="stable").tolist()
        allowed = allowed_token_mask(g, order, _VOCAB, {_EOS})
        assert allowed, f"dead end after {''.join(out)!r}"
        if allowed[0] == _EOS:
            break
        assert g.feed(_VOCAB[allowed[0]])
        out.append(_VOCAB[allowed[0]])
        if g.complete:
            return "".join(out), step + 1
    raise AssertionError(f"no instance in {max_steps} steps: {''.join(out)[:300]!r}")


def test_greedy_decode_with_random_logits_ends_in_a_valid_instance() -> None:
    # Not "tree" (recursive) or "open"/"free" (any number of keys): their instances are unbounded
    # by design, and random logits make a branching process that need not die out.
    worst = 0
    for name in ("weather", "nested", "anyof", "refs", "escapes", "tools"):
        for seed in range(12):
            text, steps = _greedy(SCHEMAS[name], np.random.default_rng(seed), 1500)
            _check(name, text)
            worst = max(worst, steps)
    print(f"\nrandom-logit greedy decodes: longest took {worst} tokens")


class _FakeTokenizer:
    eot_ids = frozenset({_EOS})
    vocab_size = len(_VOCAB) + 1

    def is_special(self, tid: int) -> bool:
        return tid == _EOS

    def decode(self, ids: list[int]) -> str:
        return "".join(_VOCAB[i] for i in ids)


def test_schema_constraint_masks_and_follows_the_seed() -> None:
    tok = _FakeTokenizer()
    seed = '{"name": "get_weather", "arguments": '
    c = SchemaConstraint(tok, tool_call_schema({"get_weather": WEATHER}), seed)  # type: ignore[arg-type]
    # Each step the model prefers an off-schema piece (a tiny model's rambling) over the right one.
    steps = [('{"', '{"type'), ("city", "name"), ('":', '",'), (' "', "12"), ("Paris", "\n"), ('"}', '"]'),
             ("}", ",")]
    for piece, distractor in steps:
        logits = np.zeros(tok.vocab_size, dtype=np.float32)
        logits[_VOCAB.index(distractor)], logits[_VOCAB.index(piece)] = 9.0, 5.0
        masked = c.mask(logits)
        assert masked[_VOCAB.index(distractor)] == -np.inf and int(np.argmax(masked)) == _VOCAB.index(piece)
        assert not c.done
        c.advance(_VOCAB.index(piece))
    logits = np.zeros(tok.vocab_size, dtype=np.float32)
    logits[_EOS] = 1.0
    assert c.done and int(np.argmax(c.mask(logits))) == _EOS
    with pytest.raises(ValueError):
        SchemaConstraint(tok, WEATHER, '{"town"')  # type: ignore[arg-type]
    plain = JsonConstraint(tok, seed)  # type: ignore[arg-type]
    logits[_VOCAB.index('{"type')] = 9.0
    assert int(np.argmax(plain.mask(logits))) == _VOCAB.index('{"type')  # json_object mode allows it


def test_accepts_speed_for_a_sampler_step() -> None:
    """64 candidate texts x 200 steps, against json_guard on the same text; printed, not asserted."""
    rng = random.Random(5)
    row = {"type": "object", "required": ["id", "name"], "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "score": {"type": ["number", "null"]},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}}}}
    schema = {"type": "object", "properties": {"rows": {"type": "array", "items": row}}, "required": ["rows"]}
    doc = json.dumps({"rows": [{"id": i, "name": f"row é \\ \" {i}", "score": rng.random() if i % 2 else None,
                                "tags": ["a", "ccc"]} for i in range(30)]}, ensure_ascii=False)
    vocab = [doc[i : i + rng.randint(1, 8)] for i in range(0, len(doc), 3)] + ["{", "}", "]", '"', " "]
    guards: list[tuple[str, SchemaPrefix | JsonPrefix]] = [("json_schema_guard", SchemaPrefix(schema)),
                                                          ("json_guard", JsonPrefix())]
    for label, guard in guards:
        t0, checked = time.perf_counter(), 0
        for step in range(200):
            for text in rng.sample(vocab, 63) + [doc[step]]:
                guard.accepts(text)
                checked += 1
            assert guard.feed(doc[step])
        dt = time.perf_counter() - t0
        print(f"\n{label}: {checked} accepts() in {dt * 1000:.1f} ms ({dt / checked * 1e6:.2f} us each)")

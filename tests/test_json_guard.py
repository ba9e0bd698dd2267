"""JsonPrefix against json.loads: every prefix of valid objects passes, closing_suffix completes
each one, known-bad continuations fail without touching the state, and random edits agree with
json.loads on whole documents."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from strata.json_guard import JsonPrefix, allowed_token_mask, closing_suffix

_ALPHABET = 'ab é€😀"\\/\n\t\x01\x1f\u2028'


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constants)


def _number(rng: random.Random) -> str:
    """A random literal from the JSON number grammar, e.g. -0.5e+10, 0, 12E-3."""
    text = rng.choice(["", "-"]) + rng.choice(["0", str(rng.randint(1, 10**rng.randint(1, 12)))])
    if rng.random() < 0.5:
        text += "." + str(rng.randint(0, 10**6)).zfill(rng.randint(1, 4))
    if rng.random() < 0.4:
        text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 300))
    return text


def _string(rng: random.Random) -> str:
    s = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 8)))
    text = json.dumps(s, ensure_ascii=rng.random() < 0.5)  # \uXXXX (surrogate pairs too) or raw
    return text.replace("/", "\\/") if rng.random() < 0.3 else text


def _ws(rng: random.Random) -> str:
    return "".join(rng.choice(" \t\n\r") for _ in range(rng.choice([0, 0, 0, 1, 2])))


def _value(rng: random.Random, depth: int) -> str:
    kind = rng.randint(0, 6 if depth < 4 else 4)
    if kind == 0:
        return _number(rng)
    if kind == 1:
        return _string(rng)
    if kind in (2, 3):
        return rng.choice(["true", "false", "null"]) if kind == 2 else _number(rng)
    if kind == 4 or kind == 6:
        return _object(rng, depth + 1)
    items = [_ws(rng) + _value(rng, depth + 1) + _ws(rng) for _ in range(rng.randint(0, 4))]
    return "[" + (",".join(items) if items else _ws(rng)) + "]"


def _object(rng: random.Random, depth: int) -> str:
    members = [_ws(rng) + _string(rng) + _ws(rng) + ":" + _ws(rng) + _value(rng, depth) + _ws(rng)
               for _ in range(rng.randint(0 if depth else 1, 4))]
    return "{" + (",".join(members) if members else _ws(rng)) + "}"


def _docs() -> list[str]:
    rng = random.Random(1234)
    docs = [_ws(rng) + _object(rng, 0) for _ in range(150)]
    for i in range(30):  # json.dumps of nested Python data in several layouts
        data = _loads(_object(random.Random(i), 0))
        docs.append(json.dumps(data, ensure_ascii=bool(i % 2), indent=[None, 2, "\t"][i % 3]))
    docs += ['{"a":-0.5e+10,"b":[0,-0,1E5,2.50,3e-0],"c":"\\u00e9\\ud83d\\ude00\\"\\\\\\/\\b\\f\\n\\r\\t"}',
             '{}', ' \n\t{ }', '{"":{"":[[],{},[[{}]]]}}', '{"k":true,"l":false,"m":null}']
    return docs


DOCS = _docs()


def test_generated_documents_are_valid_json_objects() -> None:
    for doc in DOCS:
        assert isinstance(_loads(doc), dict), doc


def test_every_prefix_is_accepted_and_completes_only_at_the_end() -> None:
    for doc in DOCS:
        g = JsonPrefix()
        end = len(doc.rstrip())
        for i, ch in enumerate(doc):
            assert g.feed(ch), f"rejected {ch!r} at {i} of {doc!r}"
            assert g.complete == (i + 1 >= end), f"complete={g.complete} at {i} of {doc!r}"


def test_chunked_feeding_reaches_the_same_state() -> None:
    rng = random.Random(7)
    for doc in DOCS:
        whole, chunked = JsonPrefix(), JsonPrefix()
        assert whole.feed(doc)
        i = 0
        while i < len(doc):
            n = rng.randint(1, 12)
            assert chunked.accepts(doc[i : i + n])
            assert chunked.feed(doc[i : i + n])
            i += n
        assert chunked.state == whole.state


def test_closing_suffix_completes_every_prefix() -> None:
    for doc in DOCS:
        g = JsonPrefix()
        for i in range(len(doc) + 1):
            suffix = closing_suffix(g)
            text = doc[:i] + suffix
            assert isinstance(_loads(text), dict), f"{text!r} from prefix {doc[:i]!r}"
            closed = g.copy()
            assert closed.feed(suffix) and closed.complete, text
            if i < len(doc):
                g.feed(doc[i])
        assert closing_suffix(g) == ""


@pytest.mark.parametrize(("prefix", "suffix"), [
    ("", "{}"), ("  ", "{}"), ("{", "}"), ('{"a', '":null}'), ('{"a"', ":null}"), ('{"a":', "null}"),
    ('{"a": [1, {"b": "x', '"}]}'), ('{"a":[', "]}"), ('{"a":[1,', "null]}"), ('{"a":1,', '"":null}'),
    ('{"a":-', "0}"), ('{"a":1.', "0}"), ('{"a":1e', "0}"), ('{"a":1E+', "0}"), ('{"a":12', "}"),
    ('{"a":tr', "ue}"), ('{"a":n', "ull}"), ('{"a":"\\', '\\"}'), ('{"a":"\\u0', '000"}'),
    ('{"a":[[[', "]]]}"), ('{"a":{"b":{}', "}}"), ("{}", ""), ("{} \n", ""),
])
def test_closing_suffix_examples(prefix: str, suffix: str) -> None:
    g = JsonPrefix()
    assert g.feed(prefix)
    assert closing_suffix(g) == suffix


@pytest.mark.parametrize(("prefix", "bad"), [
    ("", "["), ("", "[1]"), ("", '"a"'), ("", "1"), ("", "x"), ("", "\ufeff{}"),
    ('{"a"', " 1"), ("{", ","), ("{", "1"), ("{", "'a'"), ('{"a":1', ",}"), ('{"a":[1', ",]"),
    ('{"a":', "01"), ('{"a":', "-01"), ('{"a":-', "a"), ('{"a":1.', "e"), ('{"a":1e', "}"), ('{"a":', "."),
    ('{"a":', "+1"), ('{"a":', "NaN"), ('{"a":', "Infinity"), ('{"a":', "tru "), ('{"a":', "nul}"),
    ('{"a":', "True"), ('{"a":true', "x"), ('{"a":[', "}"), ('{"a":{', "]"), ('{"a":1', "]"),
    ("{}", "x"), ("{}", "{}"), ("{} ", ","), ('{"a":"', "\\x"), ('{"a":"', "\\U0041"),
    ('{"a":"', "\\u12g4"), ('{"a":"', "\n"), ('{"a":"', "\t"), ('{"a":"', "\x00"), ('{"', "\x1f"),
    ('{"a":1', " 2"), ('{"a":1 ', "."), ('{"a" :', ":"), ('{"a":[1', " 2"),
])
def test_invalid_continuations_are_rejected_and_leave_the_state(prefix: str, bad: str) -> None:
    g = JsonPrefix()
    assert g.feed(prefix)
    before = g.state
    assert not g.accepts(bad)
    assert not g.feed(bad)
    assert g.state == before
    assert isinstance(_loads(prefix + closing_suffix(g)), dict)


def test_agrees_with_json_loads_on_random_edits() -> None:
    rng = random.Random(99)
    for _ in range(4000):
        doc = rng.choice(DOCS)
        i = rng.randint(0, len(doc))
        op = rng.randint(0, 2)
        piece = rng.choice('{}[]:,"\\ -+.0123eEtrufalsn\nx\x05é')
        text = doc[:i] + piece + doc[i + (op == 1):] if op < 2 else doc[:i] + doc[i + 1:]
        g = JsonPrefix()
        ok = g.feed(text)
        try:
            parsed = _loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            assert ok and g.complete, f"json.loads accepts {text!r}"
        if ok:
            # Sound: whatever we accept can still be completed, and "complete" means json.loads agrees.
            assert isinstance(_loads(text + closing_suffix(g)), dict), text
            if g.complete:
                assert isinstance(parsed, dict), text


def test_accepts_and_copy_do_not_share_mutations() -> None:
    g = JsonPrefix()
    assert g.feed('{"a":')
    snapshot = g.copy()
    assert g.accepts("1}") and g.state == snapshot.state
    assert g.feed("[")
    assert snapshot.accepts("1}") and not g.accepts("1}")
    assert snapshot.feed("1}") and snapshot.complete and not g.complete


def test_only_whitespace_after_completion() -> None:
    g = JsonPrefix()
    assert g.feed(' {"a":[]}')
    assert g.complete
    for ok in (" ", "\n\n", "\t\r"):
        assert g.accepts(ok)
    for bad in ("x", "{", "}", ",", '"', "0"):
        assert not g.accepts(bad)


def test_allowed_token_mask() -> None:
    texts = ['{"', "a", '":', " 1", "}", "]", "", "<eos>", " ", "\n}", '{"a', "x"]
    eos = {7}
    g = JsonPrefix()
    assert allowed_token_mask(g, range(len(texts)), texts, eos) == [0, 8, 10]
    assert g.feed('{"a":')
    assert allowed_token_mask(g, [11, 3, 4, 6, 7, 0, 8], texts, eos) == [3, 0, 8]  # order kept, "" and eos refused
    assert g.feed("1")
    assert allowed_token_mask(g, range(len(texts)), texts, eos) == [4, 8, 9]
    assert g.feed("}")
    assert allowed_token_mask(g, range(len(texts)), texts, eos) == [7, 8]  # eos once complete


def test_accepts_speed_for_a_sampler_step() -> None:
    """64 candidate texts x 200 steps; printed, not asserted (machines differ)."""
    rng = random.Random(5)
    doc = json.dumps({f"key{i}": [rng.random(), "text é \\ \" more", {"n": None, "t": True}]
                      for i in range(60)}, ensure_ascii=False)
    vocab = [doc[i : i + rng.randint(1, 8)] for i in range(0, len(doc), 3)] + ["{", "}", "]", '"', " "]
    g = JsonPrefix()
    t0 = time.perf_counter()
    checked = 0
    for step in range(200):
        candidates = rng.sample(vocab, 63) + [doc[step]]
        for text in candidates:
            g.accepts(text)
        checked += len(candidates)
        assert g.feed(doc[step])
    dt = time.perf_counter() - t0
    print(f"\njson_guard: {checked} accepts() in {dt * 1000:.1f} ms ({dt / checked * 1e6:.2f} us each)")

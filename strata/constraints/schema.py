"""A client's JSON Schema -> an llguidance grammar and a matcher over the model's vocabulary.

llguidance takes draft 2020-12 and older schemas: type, properties, required, additionalProperties,
patternProperties, items/prefixItems, min/maxItems, enum, const, anyOf, allOf, $ref/$defs, patterns,
known formats, numeric and length bounds. Two rules of ours come on top:
- declared properties close an object unless it says otherwise (additionalProperties absent means
  false, not JSON Schema's true): a tool's arguments hold its parameters and nothing else;
- oneOf is decoded as anyOf (llguidance's coerce_one_of), and a format llguidance does not know is
  an annotation, as JSON Schema 2020-12 makes every format by default.
Anything else it cannot take (not, if/then/else, uniqueItems, ...) is a SchemaError naming the
keyword and where it sits, which the API turns into a 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from strata.constraints.vocab import model_vocab
from strata.errors import StrataError
from strata.text.tokenizer import Tokenizer

JSON_OBJECT: dict[str, Any] = {"type": "object"}  # response_format json_object: any object
# Whitespace between tokens, as llama.cpp's grammars allow it: enough to pretty-print, too little
# for a model to stall in.
WHITESPACE = r"(?:\x20|\n{1,2}[\x20\t]{0,20})?"
OPTIONS = {"whitespace_pattern": WHITESPACE, "coerce_one_of": True}

# Keywords whose value is a subschema, a list of them, or a name -> subschema map.
_ONE = (
    "items",
    "additionalProperties",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (\S+)")
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[.*?\])")
_QUOTED = ("type", "format", "pattern", "$ref")  # keywords whose rejected value an error message quotes
_OPEN_KEYS = {"additionalProperties", "patternProperties", "unevaluatedProperties"}  # say what else may come


class SchemaError(StrataError):
    """llguidance cannot take the schema; `where` is the dotted path of the part it rejects ("" for
    the whole schema)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where or 'the schema'}: {reason}")
        self.where, self.reason = where, reason


@dataclass(frozen=True, slots=True)
class Grammar:
    """A compiled schema: llguidance's grammar text and a matcher at the start of the output (after
    any seed). The matcher is one request's: it follows that request's tokens."""

    text: str
    matcher: LLMatcher
    n_vocab: int


def compile_schema(schema: Any, tokenizer: Tokenizer, seed: str = "") -> Grammar:
    """The grammar of `schema` for `tokenizer`'s vocabulary; its matcher has consumed `seed`, JSON the
    prompt already holds (a forced tool call's opening), which must be a prefix of an instance."""
    vocab = model_vocab(tokenizer)
    text = grammar_text(schema)
    matcher = LLMatcher(vocab, text, log_level=0)
    if matcher.is_error():  # a limit only the vocabulary reaches (the lexer's size)
        raise SchemaError("", " ".join(matcher.get_error().split())[:300])
    if seed and not matcher.consume_tokens(tokenizer.encode(seed, add_special=False, parse_special=False)):
        raise ValueError(f"JSON seed {seed!r} does not start an instance: {matcher.get_error()}")
    return Grammar(text, matcher, vocab.vocab_size)


def grammar_text(schema: Any) -> str:
    """llguidance's grammar for the schema under our two rules (see the module docstring); a
    SchemaError names the part llguidance rejects."""
    merged, unknown = _merged_refs(schema), set[str]()
    while True:
        try:
            body = json.dumps(_normalised(schema, unknown, merged))
            text = LLMatcher.grammar_from_json_schema(body, overrides=OPTIONS)  # type: ignore[arg-type]
        except RecursionError:
            raise SchemaError("", "the schema is nested too deeply") from None
        except ValueError as e:  # not a schema at all (false), or too deep for llguidance's parser
            error = str(e)
        else:
            failed, messages = LLMatcher.validate_grammar_with_warnings(text)
            if not failed:
                return text
            error = messages[0]
        fmt = _UNKNOWN_FORMAT.match(error)
        if fmt is None or fmt.group(1) in unknown:
            raise SchemaError(_locate(schema, error), " ".join(error.split())[:300] or "rejected")
        unknown.add(fmt.group(1))


def _normalised(schema: Any, drop: set[str], merged: set[str], pointer: str = "#") -> Any:
    """A copy with undeclared properties closed and the `drop` formats removed. Objects that allOf
    merges (its branches, and what they $ref) stay open: closing one would forbid the properties
    the others declare. `pointer`: where the schema sits, as a $ref would name it."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        here = f"{pointer}/{_escaped(key)}"
        if key == "format" and isinstance(value, str) and value in drop:
            continue
        if key in _MAP and isinstance(value, Mapping):
            value = {k: _normalised(v, drop, merged, f"{here}/{_escaped(k)}") for k, v in value.items()}
        elif key in _LIST and isinstance(value, list):
            value = [_normalised(v, drop, merged, f"{here}/{i}") for i, v in enumerate(value)]
        elif key in _ONE:
            value = _normalised(value, drop, merged, here)
        out[key] = value
    if "properties" in out and pointer not in merged and not _OPEN_KEYS & out.keys():
        out["additionalProperties"] = False
    return out


def _merged_refs(schema: Any) -> set[str]:
    """The pointers of every allOf branch and of what a branch's $ref names."""
    out: set[str] = set()
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        node, pointer = stack.pop()
        if isinstance(node, list):
            stack.extend((v, f"{pointer}/{i}") for i, v in enumerate(node))
        elif isinstance(node, Mapping):
            branches = node.get("allOf")
            for i, branch in enumerate(branches if isinstance(branches, list) else []):
                out.add(f"{pointer}/allOf/{i}")
                if isinstance(branch, Mapping) and isinstance(branch.get("$ref"), str):
                    out.add(branch["$ref"])
            stack.extend((v, f"{pointer}/{_escaped(k)}") for k, v in node.items())
    return out


def _escaped(key: str) -> str:
    """key as one JSON pointer step (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _locate(schema: Any, error: str) -> str:
    """The dotted path of the keyword an llguidance error is about: an unimplemented key, or a
    type, format, pattern or $ref value the message quotes; "" when it names none. Breadth first,
    so the outermost such keyword wins."""
    found = _UNIMPLEMENTED.search(error)
    keys = set(json.loads(found.group(1))) if found else set()
    queue: list[tuple[Any, str, bool]] = [(schema, "", True)]  # (node, path, is a schema, not a name map)
    while queue:
        node, path, is_schema = queue.pop(0)
        if isinstance(node, list):
            queue.extend((v, f"{path}.{i}".lstrip("."), True) for i, v in enumerate(node))
            continue
        if not isinstance(node, Mapping):
            continue
        for key, value in node.items():
            here = f"{path}.{key}".lstrip(".")
            if is_schema and _rejected(key, value, keys, error):
                return here
            if isinstance(value, (Mapping, list)):
                queue.append((value, here, not (is_schema and key in _MAP)))
    return ""


def _rejected(key: str, value: Any, keys: set[str], error: str) -> bool:
    if keys:
        return key in keys
    quoted = value.lstrip("#") if isinstance(value, str) and key in _QUOTED else ""
    return bool(quoted) and quoted in error


def tool_call_schema(name_to_parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The schema of a forced tool call {"name": ..., "arguments": ...}, in the order written.

    Each parameters schema gets an `$id` so its own `#/$defs/...` refs still resolve inside it.
    """
    if not name_to_parameters:
        raise ValueError("tool_call_schema needs at least one tool")
    calls = []
    for i, (name, params) in enumerate(name_to_parameters.items()):
        if isinstance(params, Mapping) and "$id" not in params:
            params = {**params, "$id": f"urn:strata:tool:{i}"}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return calls[0] if len(calls) == 1 else {"anyOf": calls}

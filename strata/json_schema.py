"""JSON Schema -> a small graph of value alternatives, for schema-guided decoding.

A schema compiles to a `Node`: the flat tuple of alternatives (object, array, string, number,
literal set) a value may take. anyOf/oneOf, type lists and `$ref` are flattened here, once, so the
per-character prefix machine (json_schema_guard) only ever looks at `Node.by_char`.

Supported: type (also lists), properties, required, additionalProperties, items, minItems,
maxItems, maxLength, enum, const, anyOf, oneOf, allOf (merged), nullable, `$ref` to `#...`
pointers (relative to the nearest `$id`) and `true`/`{}` meaning any value. Anything else
(pattern, format, minimum, ...) is ignored: the decoder accepts more, never crashes. oneOf is
treated as anyOf. Literals (enum/const) must be written in their canonical `json.dumps` form.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

_NO_LIMIT = sys.maxsize
_DIGITS = frozenset("0123456789")

@dataclass(eq=False, slots=True)
class Node:
    """A value schema: its alternatives, and which of them a first character can start."""

    alts: tuple[Alt, ...] = ()  # empty until compiled: a $ref cycle can reach a node before that
    by_char: dict[str, tuple[Alt, ...]] = field(default_factory=dict)

    def set_alts(self, alts: tuple[Alt, ...]) -> None:
        self.alts = alts
        by_char: dict[str, list[Alt]] = {}
        for alt in alts:
            for ch in alt.first_chars():
                by_char.setdefault(ch, []).append(alt)
        self.by_char = {ch: tuple(v) for ch, v in by_char.items()}


@dataclass(eq=False, slots=True)
class ObjectAlt:
    props: dict[str, Node]  # key as written between the quotes (json.dumps form) -> value schema
    order: tuple[str, ...]  # declared keys, required ones first, for closing and defaults
    required: frozenset[str]
    additional: Node | None  # schema of undeclared keys; None: no undeclared key is allowed
    prefixes: dict[str, frozenset[str]]  # each prefix of a declared key -> the keys it can become

    def first_chars(self) -> str:
        return "{"


@dataclass(eq=False, slots=True)
class ArrayAlt:
    items: Node
    min_items: int = 0
    max_items: int = _NO_LIMIT

    def first_chars(self) -> str:
        return "["


@dataclass(eq=False, slots=True)
class StringAlt:
    max_length: int = _NO_LIMIT

    def first_chars(self) -> str:
        return '"'


@dataclass(eq=False, slots=True)
class NumberAlt:
    integer: bool

    def first_chars(self) -> str:
        return "-0123456789"


@dataclass(eq=False, slots=True)
class LiteralAlt:
    """A closed set of JSON texts (enum, const, boolean, null)."""

    texts: tuple[str, ...]
    text_set: frozenset[str] = frozenset()
    prefixes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.text_set = frozenset(self.texts)
        self.prefixes = frozenset(t[:i] for t in self.texts for i in range(1, len(t) + 1))

    def first_chars(self) -> str:
        return "".join(sorted({t[0] for t in self.texts}))


Alt = ObjectAlt | ArrayAlt | StringAlt | NumberAlt | LiteralAlt


def literal_text(value: Any) -> str:
    """The one spelling of a constant the decoder accepts."""
    return json.dumps(value, ensure_ascii=False)


def is_self_delimiting(text: str) -> bool:
    """Does this complete literal end by itself? Only a number can still grow (1 -> 12)."""
    return text[-1] not in _DIGITS


def _key_text(key: str) -> str:
    return literal_text(key)[1:-1]


def _any_node() -> Node:
    node = Node()
    node.set_alts((
        LiteralAlt(("null", "true", "false")), StringAlt(), NumberAlt(False),
        ObjectAlt({}, (), frozenset(), node, {}), ArrayAlt(node),
    ))
    return node


ANY = _any_node()  # {} / true: any JSON value, its containers holding any values

_TYPE_OF_VALUE = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                  (type(None), "null"), (list, "array"), (dict, "object"))


def _matches_type(value: Any, types: list[str]) -> bool:
    kind = next((name for cls, name in _TYPE_OF_VALUE if isinstance(value, cls)), "")
    return kind in types or (kind == "integer" and "number" in types)


def _int_or(schema: Mapping[str, Any], key: str, default: int) -> int:
    value = schema.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


class _Compiler:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.memo: dict[int, Node] = {}
        self.keep: list[Any] = []  # merged allOf dicts: kept alive so their id() stays unique
        self.ids: dict[str, Any] = {}
        self.resolving: set[int] = set()
        self._collect_ids(root)

    def _collect_ids(self, schema: Any) -> None:
        if isinstance(schema, Mapping):
            if isinstance(schema.get("$id"), str):
                self.ids[schema["$id"].rstrip("#")] = schema
            for v in schema.values():
                self._collect_ids(v)
        elif isinstance(schema, list):
            for v in schema:
                self._collect_ids(v)

    def node(self, schema: Any, base: Any) -> Node:
        hit = self.memo.get(id(schema))
        if hit is not None:
            return hit
        if isinstance(schema, Mapping) and isinstance(schema.get("$id"), str):
            base = schema  # `#...` pointers inside an embedded resource resolve against it
        if isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            if id(schema) in self.resolving:
                return ANY  # refs that only lead to each other constrain nothing
            self.resolving.add(id(schema))
            target, target_base = self._resolve(schema["$ref"], base)
            node = self.memo[id(schema)] = self.node(target, target_base)
            return node
        node = self.memo[id(schema)] = Node()
        node.set_alts(self._alts(schema, base))
        return node

    def _resolve(self, ref: str, base: Any) -> tuple[Any, Any]:
        doc, _, pointer = ref.partition("#")
        if doc:
            base = self.ids.get(doc)
            if base is None:
                return True, self.root  # an outside document: accept any value
        target = base
        for part in pointer.split("/")[1:]:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return True, self.root  # a dangling pointer: be lenient
        return target, base

    def _alts(self, schema: Any, base: Any) -> tuple[Alt, ...]:
        if schema is False:
            return ()
        if not isinstance(schema, Mapping):
            return ANY.alts
        if isinstance(schema.get("allOf"), list):
            merged = self._merge(schema, base)
            self.keep.append(merged)
            return self.node(merged, base).alts
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                alts: list[Alt] = []
                for sub in schema[key]:
                    child = self.node(sub, base)
                    # A child not compiled yet (no alts) is an ancestor reached with no text in
                    # between: it adds no alternative beyond the ones listed here.
                    alts.extend(a for a in child.alts if a not in alts)
                return tuple(alts)
        types = schema.get("type")
        types = [types] if isinstance(types, str) else list(types) if isinstance(types, list) else None
        if types is not None and schema.get("nullable") is True and "null" not in types:
            types.append("null")
        if "const" in schema or isinstance(schema.get("enum"), list):
            values = [schema["const"]] if "const" in schema else schema["enum"]
            texts = [literal_text(v) for v in values if types is None or _matches_type(v, types)]
            return (LiteralAlt(tuple(dict.fromkeys(texts))),) if texts else ()
        if types is None:
            types = self._implied_types(schema)
            if types is None:
                return ANY.alts
        out: list[Alt] = []
        for t in types:
            out.extend(self._typed(t, schema, base))
        return tuple(out)

    @staticmethod
    def _implied_types(schema: Mapping[str, Any]) -> list[str] | None:
        if any(k in schema for k in ("properties", "required", "additionalProperties")):
            return ["object"]
        if "items" in schema:
            return ["array"]
        return None

    def _typed(self, t: Any, schema: Mapping[str, Any], base: Any) -> tuple[Alt, ...]:
        if t == "object":
            return (self._object(schema, base),)
        if t == "array":
            items = schema.get("items", True)
            node = self.node(items, base) if isinstance(items, (Mapping, bool)) else ANY
            return (ArrayAlt(node, _int_or(schema, "minItems", 0), _int_or(schema, "maxItems", _NO_LIMIT)),)
        if t == "string":
            return (StringAlt(_int_or(schema, "maxLength", _NO_LIMIT)),)
        if t in ("number", "integer"):
            return (NumberAlt(t == "integer"),)
        if t == "boolean":
            return (LiteralAlt(("true", "false")),)
        if t == "null":
            return (LiteralAlt(("null",)),)
        return ANY.alts  # an unknown type name: lenient

    def _object(self, schema: Mapping[str, Any], base: Any) -> ObjectAlt:
        raw_props = schema.get("properties")
        raw_props = raw_props if isinstance(raw_props, Mapping) else {}
        props = {_key_text(k): self.node(v, base) for k, v in raw_props.items() if v is not False}
        # Unlike JSON Schema's default, declared properties (even none) close the object: a tool's
        # arguments hold its parameters and nothing else.
        extra = schema.get("additionalProperties", "properties" not in schema)
        additional = None if extra is False else self.node(extra, base)
        req = schema.get("required")
        required = [_key_text(k) for k in req if isinstance(k, str)] if isinstance(req, list) else []
        for key in required:  # a required key nobody declared would make the object unwritable
            if key not in props:
                props[key] = additional or ANY
        order = tuple(dict.fromkeys([*required, *props]))
        prefixes: dict[str, set[str]] = {}
        for key in props:
            for i in range(len(key) + 1):
                prefixes.setdefault(key[:i], set()).add(key)
        return ObjectAlt(props, order, frozenset(required), additional,
                         {p: frozenset(keys) for p, keys in prefixes.items()})

    def _merge(self, schema: Mapping[str, Any], base: Any) -> dict[str, Any]:
        """allOf as one schema: properties and required unite, other keywords: the last wins."""
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for sub in schema["allOf"]:
            sub_base = base
            while isinstance(sub, Mapping) and isinstance(sub.get("$ref"), str):
                sub, sub_base = self._resolve(sub["$ref"], sub_base)
            if not isinstance(sub, Mapping):
                continue
            for k, v in sub.items():
                if k == "properties" and isinstance(v, Mapping):
                    merged["properties"] = {**merged.get("properties", {}), **v}
                elif k == "required" and isinstance(v, list):
                    merged["required"] = [*merged.get("required", []), *v]
                else:
                    merged[k] = v
        return merged


_SIMPLEST_FIRST: dict[type, int] = {LiteralAlt: 0, NumberAlt: 1, StringAlt: 2, ArrayAlt: 3, ObjectAlt: 4}


def default_text(node: Node | None, depth: int = 0) -> str:
    """The simplest instance of node as JSON text: a literal, 0, "", or the minimal container.

    An unsatisfiable (or endlessly self-requiring) schema gets null: at least valid JSON.
    """
    if node is None or not node.alts or depth > 32:
        return "null"
    alt = min(node.alts, key=lambda a: _SIMPLEST_FIRST[type(a)])
    if isinstance(alt, LiteralAlt):
        return alt.texts[0]
    if isinstance(alt, NumberAlt):
        return "0"
    if isinstance(alt, StringAlt):
        return '""'
    if isinstance(alt, ArrayAlt):
        return "[" + ", ".join([default_text(alt.items, depth + 1)] * alt.min_items) + "]"
    members = (f'"{k}": {default_text(alt.props[k], depth + 1)}' for k in alt.order if k in alt.required)
    return "{" + ", ".join(members) + "}"


def compile_schema(schema: Any) -> Node:
    """The root Node of a JSON Schema (a dict, or a bool)."""
    return _Compiler(schema).node(schema, schema)


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
        calls.append({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    return calls[0] if len(calls) == 1 else {"anyOf": calls}

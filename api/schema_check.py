"""A client's JSON Schema (response_format, output_config, a forced tool's parameters) checked and
compiled at the edge, in a worker thread with a time limit, so a schema llguidance cannot take, or
a hostile one, is a 400 for its request instead of an error inside the scheduler or a stall of the
event loop."""

from __future__ import annotations

import asyncio
from typing import Any

from strata.api.errors import APIError, bad_request
from strata.constraints.schema import Grammar, SchemaError, compile_schema
from strata.constraints.vocab import model_vocab
from strata.text.tokenizer import Tokenizer

COMPILE_SECONDS = 5.0
# keyword pairs where lower > upper leaves no value (JSON Schema: the instance must satisfy both)
_BOUNDS = (
    ("minimum", "maximum"),
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
)


async def compiled(
    schema: dict[str, Any] | None, param: str, tokenizer: Tokenizer, seed: str = ""
) -> Grammar | None:
    """The schema's grammar for the model's vocabulary (its matcher past `seed`), or a 400 naming
    the part of `param` that is contradictory, that llguidance cannot take, or too slow to compile."""
    if schema is None:
        return None
    check_satisfiable(schema, param)
    await asyncio.to_thread(model_vocab, tokenizer)  # built once per model (seconds), outside the limit
    try:
        work = asyncio.to_thread(compile_schema, schema, tokenizer, seed)
        return await asyncio.wait_for(work, COMPILE_SECONDS)
    except SchemaError as e:
        where = f"{param}.{e.where}" if e.where else param
        raise bad_request(f"{where}: {e.reason}", param=where, code="invalid_schema") from None
    except TimeoutError:
        raise bad_request(
            f"{param}: the schema took longer than {COMPILE_SECONDS:g} s to compile",
            param=param,
            code="invalid_schema",
        ) from None


def check_satisfiable(schema: Any, param: str) -> None:
    """Contradictions anywhere in the schema: an empty enum, a lower bound above its upper bound."""
    stack: list[tuple[Any, str]] = [(schema, param)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((v, f"{where}.{i}") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        if node.get("enum") == [] or node.get("type") == []:
            raise _unsatisfiable(where, "an empty enum or type list admits no value")
        for lo, hi in _BOUNDS:
            a, b = node.get(lo), node.get(hi)
            if _number(a) and _number(b) and a > b:
                raise _unsatisfiable(where, f"{lo} {a} is above {hi} {b}")
        stack.extend((v, f"{where}.{k}") for k, v in node.items() if isinstance(v, (dict, list)))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _unsatisfiable(where: str, why: str) -> APIError:
    return bad_request(
        f"{where}: the schema can never be satisfied ({why})", param=where, code="invalid_schema"
    )

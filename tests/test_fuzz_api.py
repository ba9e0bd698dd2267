"""Issue 13: schemathesis fuzzes every route of the live server from its own /openapi.json, with
and without an API key. No response may be a 5xx, and every error must be in the protocol's shape
(OpenAI `error` object, Anthropic `error` type). A tally of what was tried is printed at the end
(`pytest -s tests/test_fuzz_api.py`)."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from server_fixture import Server, running_server

TALLY: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module")
def fuzz_server(smollm2_path: Path) -> Iterator[Server]:
    # a small context and --n-predict keep every request short: the fuzzer is after errors, not text (without
    # the cap, chat requests that name no max_tokens generated up to the context, 7.5-10 minutes a run)
    with running_server(smollm2_path, "--ctx-size", "128", "--parallel", "2", "--n-predict", "4") as s:
        yield s
    print("\nfuzz tally:", json.dumps(dict(sorted(TALLY.items()))))


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_server: Server):  # type: ignore[no-untyped-def]
    spec = httpx.get(f"{fuzz_server.url}/openapi.json", headers={"x-api-key": fuzz_server.key}).json()
    return schemathesis.openapi.from_dict(spec)


schema = schemathesis.pytest.from_fixture("fuzz_schema")


def check(case, response: httpx.Response, keyed: bool) -> None:  # type: ignore[no-untyped-def]
    path = case.operation.path
    TALLY["requests"] += 1
    TALLY[f"status {response.status_code}"] += 1
    assert response.status_code < 500, (
        case.method,
        path,
        case.body,
        response.status_code,
        response.text[:500],
    )
    if not keyed and path != "/health":
        assert response.status_code == 401, (path, response.status_code)
    if response.status_code < 400:
        return
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz_with_a_key(case, fuzz_server: Server) -> None:  # type: ignore[no-untyped-def]
    response = case.call(
        base_url=fuzz_server.url, headers={"Authorization": f"Bearer {fuzz_server.key}"}, timeout=60
    )
    check(case, response, keyed=True)


@schema.parametrize()
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz_without_a_key(case, fuzz_server: Server) -> None:  # type: ignore[no-untyped-def]
    response = case.call(base_url=fuzz_server.url, timeout=60)
    check(case, response, keyed=False)

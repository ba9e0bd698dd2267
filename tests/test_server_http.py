"""HTTP-level behaviour: auth on every route, bad input on every route, ops endpoints, SSE framing
with curl, and client disconnects."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fixture import Server, running_server

POST_ROUTES = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/tokenize",
    "/detokenize",
]
GET_ROUTES = ["/v1/models", "/v1/status", "/props", "/metrics"]


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[Server]:
    with running_server(smollm2_path) as s:
        yield s


def test_health_needs_no_key(server: Server) -> None:
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "loaded": True}


@pytest.mark.parametrize("route", POST_ROUTES + GET_ROUTES)
def test_every_other_route_needs_the_key(server: Server, route: str) -> None:
    method = "POST" if route in POST_ROUTES else "GET"
    r = httpx.request(method, f"{server.url}{route}", json={})
    assert r.status_code == 401
    body = r.json()
    if route.startswith("/v1/messages"):
        assert body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "missing API key"},
        }
    else:
        assert body["error"]["type"] == "authentication_error"
    r = httpx.request(method, f"{server.url}{route}", json={}, headers={"x-api-key": "wrong"})
    assert r.status_code == 401


def test_x_api_key_header_works(server: Server) -> None:
    r = httpx.get(f"{server.url}/v1/models", headers={"x-api-key": server.key})
    assert r.status_code == 200


BAD_BODIES = [
    b"{not json",
    b"[1, 2]",
    b'{"messages": "hi"}',
    b'{"messages": [{"role": "wizard"}]}',
    b'{"prompt": 5}',
    b'{"tokens": "abc"}',
    b'{"content": 3}',
    b"{}",
]


@pytest.mark.parametrize("route", POST_ROUTES)
@pytest.mark.parametrize("raw", BAD_BODIES)
def test_bad_input_is_4xx_in_protocol_shape(server: Server, route: str, raw: bytes) -> None:
    with server.client() as c:
        r = c.post(route, content=raw, headers={"content-type": "application/json"})
    if route == "/tokenize" and raw == b'{"content": 3}':
        assert r.status_code == 400
    assert 400 <= r.status_code < 500, (route, raw, r.status_code, r.text)
    body = r.json()
    if route.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    "payload,param",
    [
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
                ]
            },
            "messages.0.content.0",
        ),
        ({"messages": [{"role": "user", "content": "x " * 3000}]}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, "tool_choice"),
    ],
)
def test_openai_semantic_errors(server: Server, payload: dict, param: str) -> None:
    with server.client() as c:
        r = c.post("/v1/chat/completions", json=payload)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_overlong_prompt_reports_both_counts(server: Server) -> None:
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x " * 3000}]})
    msg = r.json()["error"]["message"]
    assert "2048" in msg and "tokens" in msg


def test_anthropic_image_and_missing_max_tokens(server: Server) -> None:
    with server.client() as c:
        r = c.post("/v1/messages", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
        img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        r = c.post("/v1/messages", json={"max_tokens": 4, "messages": [{"role": "user", "content": [img]}]})
        assert r.status_code == 400 and "vision" in r.json()["error"]["message"]


def test_unknown_route_is_404_json(server: Server) -> None:
    with server.client() as c:
        r = c.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_wrong_method_is_a_client_error_that_names_the_allowed_ones(server: Server) -> None:
    with server.client() as c:
        r = c.put("/v1/chat/completions", json={})
        assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
        assert "POST" in r.headers["allow"]
        r = c.put("/v1/messages", json={})
        assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


def test_ops_endpoints(server: Server) -> None:
    with server.client() as c:
        c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "temperature": 0})
        status = c.get("/v1/status").json()
        props = c.get("/props").json()
        metrics = c.get("/metrics").text
        toks = c.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
        text = c.post("/detokenize", json={"tokens": toks}).json()["content"]
    assert status["slots"] == 4 and status["queue_depth"] == 0 and status["model"]
    assert props["n_ctx"] == 2048 and "im_start" in props["chat_template"] and props["version"]
    for name in (
        "strata_generated_tokens_total",
        "strata_prompt_seconds_total",
        "strata_decode_seconds_total",
        "strata_slots_busy",
        "strata_queue_depth",
    ):
        assert f"\n{name} " in "\n" + metrics
    assert "# TYPE strata_requests_total counter" in metrics
    assert 'strata_requests_total{outcome="length"}' in metrics
    assert text == "Hello world"


def _scrape(c: httpx.Client) -> dict[tuple[str, str], float]:
    """/metrics through prometheus-client's own parser: (name, outcome label) -> value."""
    r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, s.labels.get("outcome", "")): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def test_metrics_parse_and_count_the_request(server: Server) -> None:
    """Histograms gain an observation per request (TTFT, queue wait) and per token gap; the counters move by
    the request's own usage and timings."""
    with server.client() as c:
        before = _scrape(c)
        body = c.post(
            "/v1/completions",
            json={"prompt": "Count to ten:", "max_tokens": 6, "temperature": 0, "ignore_eos": True},
        ).json()
        after = _scrape(c)

    def moved(name: str, outcome: str = "") -> float:
        return after[(name, outcome)] - before.get((name, outcome), 0.0)

    t = body["timings"]
    assert t["predicted_n"] == 6 == body["usage"]["completion_tokens"]
    assert moved("strata_generated_tokens_total") == t["predicted_n"]
    assert moved("strata_prompt_tokens_total") == t["prompt_n"]
    assert moved("strata_prompt_tokens_cached_total") == body["usage"]["prompt_tokens"] - t["prompt_n"]
    assert moved("strata_requests_total", "length") == 1 and moved("strata_requests_total", "error") == 0
    assert moved("strata_time_to_first_token_seconds_count") == 1
    assert moved("strata_queue_wait_seconds_count") == 1
    assert moved("strata_inter_token_latency_seconds_count") == t["predicted_n"] - 1
    assert moved("strata_window_seconds_count") >= t["predicted_n"]
    assert moved("strata_prefill_chunk_seconds_count") >= 1
    # a stream's token gaps are its decode time, less what came after its last token
    assert 0 < moved("strata_inter_token_latency_seconds_sum") <= t["predicted_ms"] / 1000 + 1e-3
    assert after[("strata_slots_total", "")] == 4 and after[("strata_slots_busy", "")] == 0


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_sse_framing(server: Server) -> None:
    body = json.dumps(
        {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 5, "temperature": 0}
    )
    out = subprocess.run(
        [
            "curl",
            "-sN",
            f"{server.url}/v1/chat/completions",
            "-H",
            "Content-Type: application/json",
            "-H",
            f"Authorization: Bearer {server.key}",
            "-d",
            body,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    events = [e for e in out.replace("\r\n", "\n").split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), events[:3]
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        assert json.loads(e[len("data: ") :])["object"] == "chat.completion.chunk"


def test_disconnect_stops_generation(server: Server) -> None:
    payload = {
        "messages": [{"role": "user", "content": "Count to one thousand."}],
        "stream": True,
        "max_tokens": 1500,
        "temperature": 0,
        "ignore_eos": True,
    }
    with server.client() as c:
        with c.stream("POST", "/v1/chat/completions", json=payload) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i > 4:
                    break
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and c.get("/v1/status").json()["busy_slots"]:
            time.sleep(0.1)
        assert c.get("/v1/status").json()["busy_slots"] == 0
        done = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).json()
        assert done["usage"]["completion_tokens"] == 2

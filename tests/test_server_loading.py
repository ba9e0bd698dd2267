"""Ready means ready: while the model loads and warms up, the socket answers, /health says loading (503),
every API route answers 503 in its protocol's shape with Retry-After, a wrong key is still a 401; then the
server announces itself and serves, and the engine's warm-up leaves no trace in the counters."""

from __future__ import annotations

import numpy as np
from starlette.testclient import TestClient

from strata.api.app import build_app
from strata.api.loading import Loading
from strata.conf.server import ServerConfig

KEY = "sk-load"


def test_routes_while_loading():
    loading = Loading(phase="loading the model")
    app = build_app(ServerConfig(api_keys=(KEY,)), loading)
    with TestClient(app) as c:
        h = c.get("/health")
        assert (
            h.status_code == 503
            and h.json()["status"] == "loading"
            and h.json()["phase"] == "loading the model"
        )
        auth = {"Authorization": f"Bearer {KEY}"}
        assert c.get("/openapi.json", headers=auth).status_code == 200
        r = c.post(
            "/v1/chat/completions", headers=auth, json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        assert r.json()["error"]["code"] == "loading"
        a = c.post("/v1/messages", headers={"x-api-key": KEY}, json={"max_tokens": 4, "messages": []})
        assert a.status_code == 503 and a.json()["type"] == "error"  # Anthropic's shape
        assert c.get("/v1/status", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_warm_up_runs_every_batch_size_and_leaves_no_counts(tiny_qwen3moe):
    from strata.engine import Engine

    eng = Engine.load(tiny_qwen3moe["q8_0"], device="cpu", backend="numpy", expert_cache="50%")
    sizes = []
    real = eng.model.forward_batch
    eng.model.forward_batch = lambda t, s: sizes.append(len(t)) or real(t, s)  # type: ignore[method-assign]
    eng.warm_up(3)
    assert sizes == [1, 2, 3]
    assert eng.expert_cache.use.decode.lookups == 0 and eng.expert_cache.use.prefill.lookups == 0
    ref = Engine.load(tiny_qwen3moe["q8_0"], device="cpu", backend="numpy")
    np.testing.assert_array_equal(eng.logits([5, 6, 7]), ref.logits([5, 6, 7]))  # the model is unchanged


def test_prefill_costs_time_each_size_and_leave_no_counts(tiny_qwen3moe):
    """The pacer's calibration passes (Scheduler.calibrate): one timing per size, fresh states, and the
    tiers' counters as the warm-up leaves them; only long chunks (the GPU's) are calibrated."""
    from strata.engine import Engine
    from strata.sched.pacer import BIG, SHORT_SIZES, calibration_sizes

    eng = Engine.load(tiny_qwen3moe["q8_0"], device="cpu", backend="numpy", expert_cache="50%")
    fed = []
    real = eng.model.forward
    eng.model.forward = lambda ids, st, **kw: fed.append((len(ids), st.n_past)) or real(ids, st, **kw)  # type: ignore[method-assign]
    costs = eng.prefill_costs((4, 9))
    assert [n for n, _ in costs] == [4, 9] and all(t > 0 for _, t in costs)
    assert fed == [(4, 0), (4, 0), (9, 0), (9, 0)]  # the fastest of two, each on a fresh state
    assert eng.expert_cache.use.prefill.lookups == 0
    assert calibration_sizes(512, 16384) is None  # the CPU's chunks
    assert calibration_sizes(2048, 16384) == (*SHORT_SIZES, BIG, 4 * BIG)
    assert calibration_sizes(2048, 600) == (*SHORT_SIZES, BIG, 599) and calibration_sizes(2048, 400) is None


def test_what_loading_leaves_is_kept_out_of_later_collections():
    """A full collection walked the tokenizer's and the GGUF metadata's objects each time, with the event loop
    and the engine thread stopped: once loaded they are frozen (gc.freeze)."""
    import gc

    from strata.api.server import settle_heap

    vocab = [[i] for i in range(10_000)]  # long-lived containers, as a tokenizer's
    try:
        settle_heap()
        assert gc.get_freeze_count() >= len(vocab)
    finally:
        gc.unfreeze()

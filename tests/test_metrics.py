"""/metrics as Prometheus reads it, on the scheduler's fabricated model (tests/sched_fakes.py): the output
parses with prometheus-client's own parser, the histograms count what the requests did, the counters are the
requests' own numbers, and two schedulers in one process keep apart registries."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families
from sched_fakes import PROMPTS, FakeEngine, drain, make, run, solo

from strata.sched.request import DoneEvent, ErrorEvent
from strata.sched.scheduler import Scheduler


def samples(sch: Scheduler) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by (name, sorted labels)."""
    out = {}
    for fam in text_string_to_metric_families(sch.metrics.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(got: dict, name: str, **labels: str) -> float:
    return got[(name, tuple(sorted(labels.items())))]


def test_histograms_and_counters_follow_the_requests() -> None:
    n = 5
    prompts = PROMPTS[:3]

    async def go() -> tuple[Scheduler, list[list[int]], list[DoneEvent | ErrorEvent]]:
        sch = Scheduler(FakeEngine(), parallel=2)  # type: ignore[arg-type]  # the third request queues
        sch.start()
        reqs = [make(p, n) for p in prompts]
        for r in reqs:
            sch.submit(r)
        results = await asyncio.gather(*(drain(r) for r in reqs))
        sch.stop()
        return sch, [t for t, _ in results], [e for _, e in results]

    sch, tokens, dones = run(go())
    got = samples(sch)
    assert [len(t) for t in tokens] == [len(solo(p, n)) for p in prompts] and all(len(t) for t in tokens)
    generated = sum(len(t) for t in tokens)
    assert value(got, "strata_time_to_first_token_seconds_count") == len(prompts)
    assert value(got, "strata_inter_token_latency_seconds_count") == generated - len(prompts)
    assert value(got, "strata_queue_wait_seconds_count") == len(prompts)
    windows = value(got, "strata_window_seconds_count")
    assert windows >= max(len(t) for t in tokens) and value(got, "strata_window_seconds_sum") > 0
    assert 1 <= value(got, "strata_prefill_chunk_seconds_count") <= windows
    # the histograms' buckets are cumulative and end at the count
    assert value(got, "strata_window_seconds_bucket", le="+Inf") == windows
    assert value(got, "strata_window_seconds_bucket", le="0.001") <= windows
    assert value(got, "strata_generated_tokens_total") == generated
    assert value(got, "strata_prompt_tokens_total") == sum(len(p) for p in prompts)
    ended = {e.reason.value for e in dones if isinstance(e, DoneEvent)}
    assert sum(value(got, "strata_requests_total", outcome=o) for o in ended) == len(prompts)
    assert value(got, "strata_requests_total", outcome="error") == 0
    assert value(got, "strata_slots_busy") == 0 and value(got, "strata_slots_total") == 2
    assert value(got, "strata_queue_depth") == 0


def test_each_scheduler_has_its_own_registry_and_failures_count_as_errors() -> None:
    async def go() -> tuple[Scheduler, Scheduler]:
        busy, idle = Scheduler(FakeEngine()), Scheduler(FakeEngine())  # type: ignore[arg-type]
        busy.start()
        busy.faults.arm()  # the first window raises: its request ends with an error
        bad, good = make(PROMPTS[0], 3), make(PROMPTS[2], 3)
        busy.submit(bad)
        _, ev = await drain(bad)
        assert isinstance(ev, ErrorEvent)
        busy.submit(good)
        await drain(good)
        busy.stop()
        return busy, idle

    busy, idle = run(go())
    b, i = samples(busy), samples(idle)
    assert value(b, "strata_requests_total", outcome="error") == 1 and busy.counters.requests_failed == 1
    assert value(b, "strata_time_to_first_token_seconds_count") == 1
    assert value(i, "strata_time_to_first_token_seconds_count") == 0
    assert all(value(i, "strata_requests_total", outcome=o) == 0 for o in ("eos", "length", "error"))
    assert busy.counters.requests == 1

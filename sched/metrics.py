"""The server's Prometheus metrics (`GET /metrics`), in a registry of the scheduler's own: several servers, or
the tests' schedulers, share one process, and the library's global registry would mix them.

Latencies are histograms the scheduler observes as it goes: time to first token (from submit, so the queue
wait is in it, as a client sees it), the gaps between a stream's tokens, the queue wait (submit to a slot),
every window's time, and the time of the windows that read a prompt chunk (streams beside it included).
Totals and levels are read at scrape time from the counters the engine already keeps (the scheduler's
`Counters`, the expert tiers' `TierUse`, the prefix cache, the GPU's VRAM ledger), so nothing is counted twice
and /metrics agrees with /v1/status and with each response's `timings`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from strata.runtime.finish import FinishReason
from strata.sched.request import Request

if TYPE_CHECKING:
    from strata.sched.scheduler import Scheduler
    from strata.sched.slots import Slot

# seconds: a step of a small model on the H200 (~1 ms) up to a long prompt chunk on the CPU
STEP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# seconds a client waits: for a slot, for its first token, for a prompt chunk
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# a tool call ends by EOS as far as the scheduler knows; the HTTP adapters name it, so it has no count here
OUTCOMES = tuple(r for r in FinishReason if r is not FinishReason.TOOL_CALLS)


class Metrics:
    """The histograms the scheduler feeds, and the collector of everything else, in one registry."""

    media_type = CONTENT_TYPE_LATEST

    def __init__(self, scheduler: Scheduler) -> None:
        self.registry = r = CollectorRegistry()

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, buckets=buckets, registry=r)

        self.ttft = histogram(
            "strata_time_to_first_token_seconds",
            "Submit to a request's first token (queue wait included)",
            WAIT_BUCKETS,
        )
        self.inter_token = histogram(
            "strata_inter_token_latency_seconds", "Between a stream's consecutive tokens", STEP_BUCKETS
        )
        self.queue_wait = histogram("strata_queue_wait_seconds", "Submit to a batch slot", WAIT_BUCKETS)
        self.window = histogram(
            "strata_window_seconds",
            "One engine step: a token for every running slot and at most one prompt chunk",
            STEP_BUCKETS,
        )
        self.prefill_chunk = histogram(
            "strata_prefill_chunk_seconds",
            "Windows that read a prompt chunk (streams decoding beside it included)",
            WAIT_BUCKETS,
        )
        r.register(_Totals(scheduler))

    def render(self) -> bytes:
        """The text exposition format, as a scrape gets it."""
        return generate_latest(self.registry)

    def admitted(self, req: Request) -> None:
        self.queue_wait.observe(time.perf_counter() - req.submitted)

    def window_done(self, seconds: float, n_prefill: int) -> None:
        self.window.observe(seconds)
        if n_prefill:
            self.prefill_chunk.observe(seconds)

    def token(self, slot: Slot) -> None:
        """A window gave the slot's stream a token: its first (TTFT) or the gap since the last."""
        now = time.perf_counter()
        if slot.last_token:
            self.inter_token.observe(now - slot.last_token)
        else:
            self.ttft.observe(now - slot.req.submitted)
        slot.last_token = now


class _Totals:
    """Counters and gauges read from the engine's own counters at each scrape."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.sch = scheduler

    def collect(self) -> Iterator[Metric]:
        sch, c = self.sch, self.sch.counters
        outcomes = CounterMetricFamily(
            "strata_requests_total",
            "Requests ended, by outcome (the scheduler's finish reason; error: the window failed)",
            labels=["outcome"],
        )
        for reason in OUTCOMES:
            outcomes.add_metric([reason.value], c.outcomes.get(reason, 0))
        yield outcomes
        yield CounterMetricFamily("strata_prompt_tokens_total", "Prompt tokens prefilled", c.prompt_tokens)
        yield CounterMetricFamily(
            "strata_prompt_tokens_cached_total",
            "Prompt tokens reused from the prefix cache",
            c.cached_prompt_tokens,
        )
        yield CounterMetricFamily("strata_generated_tokens_total", "Tokens generated", c.generated_tokens)
        yield CounterMetricFamily(
            "strata_prompt_seconds_total",
            "Window seconds spent on prompt tokens (a window's time split by the tokens it fed)",
            c.prompt_seconds,
        )
        yield CounterMetricFamily(
            "strata_decode_seconds_total", "Window seconds spent on decode tokens", c.decode_seconds
        )
        yield GaugeMetricFamily("strata_slots_busy", "Slots holding a request now", sch.busy_slots)
        yield GaugeMetricFamily("strata_slots_total", "Configured slots (--parallel)", sch.parallel)
        yield GaugeMetricFamily("strata_queue_depth", "Requests waiting for a slot", sch.queue_depth)
        yield from _prefix_cache(sch)
        yield from _expert_cache(sch)
        ledger = getattr(sch.engine.model, "ledger", None)  # the GPU model's VRAM account
        if ledger is not None:
            yield GaugeMetricFamily(
                "strata_vram_used_bytes", "VRAM Strata holds (weights, buffers, KV)", ledger.used
            )
            yield GaugeMetricFamily(
                "strata_vram_budget_bytes", "The VRAM budget (--vram-budget-mib)", ledger.budget
            )


def _prefix_cache(sch: Scheduler) -> Iterator[Metric]:
    pc = sch.prefix_cache
    if pc is None:
        return
    yield GaugeMetricFamily("strata_prefix_cache_entries", "Prompt states kept", len(pc))
    yield GaugeMetricFamily("strata_prefix_cache_bytes", "RAM the kept prompt states take", pc.used)
    yield GaugeMetricFamily(
        "strata_prefix_cache_budget_bytes", "The prefix cache's RAM (--cache-ram-mib)", pc.budget
    )
    yield CounterMetricFamily(
        "strata_prefix_cache_hits_total", "Requests that restored a cached prefix", pc.hits
    )
    yield CounterMetricFamily(
        "strata_prefix_cache_reused_tokens_total", "Prompt tokens restored from it", pc.reused_tokens
    )


def _expert_cache(sch: Scheduler) -> Iterator[Metric]:
    cache = sch.engine.expert_cache
    if cache is None:
        return
    yield GaugeMetricFamily(
        "strata_expert_cache_slots", "Expert cache slots (VRAM; RAM for the CPU stand-in)", cache.n_slots
    )
    yield GaugeMetricFamily(
        "strata_expert_cache_bytes",
        "Bytes of the expert cache's slots",
        cache.n_slots * cache.layout.slot_bytes,
    )
    if cache.lender is not None:  # --kv-grow
        lent = cache.lender.status()
        yield GaugeMetricFamily(
            "strata_kv_grow_lent_bytes", "Expert cache bytes the KV has taken (--kv-grow)", lent["lent_bytes"]
        )
        yield CounterMetricFamily(
            "strata_kv_grow_lends_total", "Times a growing KV took slots", lent["lends"]
        )
        yield CounterMetricFamily(
            "strata_kv_grow_reclaims_total", "Times the cache took slots back from the KV", lent["reclaims"]
        )
    pinned = getattr(cache.arena, "nbytes", None)  # a pinned arena; the file's mapping has no size of its own
    if pinned is not None:
        yield GaugeMetricFamily(
            "strata_pinned_arena_bytes",
            "Page-locked RAM holding the expert arena (every expert, or what --ram-budget-mib allows)",
            pinned(),
        )
    yield GaugeMetricFamily(
        "strata_arena_experts", "Experts with a copy in the RAM tier", int(cache.in_ram.sum())
    )
    yield GaugeMetricFamily(
        "strata_mmap_experts",
        "Experts only the file's mapping holds (--ram-budget-mib)",
        int((~cache.in_ram).sum()),
    )
    ring = getattr(cache.slots, "ring", None)
    yield CounterMetricFamily(
        "strata_bounce_bytes_total",
        "Bytes copied from the file's mapping through the pinned bounce ring (fills, staging, restores)",
        ring.bytes if ring is not None else 0,
    )
    yield CounterMetricFamily(
        "strata_expert_swaps_total", "Experts the cache policy brought into slots", cache.swaps
    )
    yield CounterMetricFamily(
        "strata_expert_swap_bytes_total", "Bytes of the experts the cache policy brought in", cache.swap_bytes
    )
    yield CounterMetricFamily(
        "strata_expert_rides_total",
        "Experts brought in by the decode pass that read them as a miss (no copy; GPU)",
        cache.rides,
    )
    yield CounterMetricFamily(
        "strata_expert_ride_bytes_total", "Bytes of the experts brought in that way", cache.ride_bytes
    )
    pf = cache.prefetch
    yield CounterMetricFamily(
        "strata_prefetch_staged_total", "Expert parts the lookahead copied ahead of the router", pf.staged
    )
    yield CounterMetricFamily("strata_prefetch_used_total", "Staged parts the router then used", pf.used)
    yield CounterMetricFamily(
        "strata_prefetch_saved_bytes_total", "Bytes of staged parts the router used", pf.used_bytes
    )
    yield CounterMetricFamily(
        "strata_prefetch_wasted_bytes_total", "Bytes the lookahead copied for nothing", pf.wasted_bytes
    )
    by_phase = {  # a counter each, labelled decode / prefill
        "lookups": ("strata_expert_lookups_total", "Routed experts looked up"),
        "hits": ("strata_expert_hits_total", "Routed experts found in a slot"),
        "misses": ("strata_expert_misses_total", "Routed experts not in a slot"),
        "pcie": ("strata_pcie_bytes_total", "Expert bytes read from RAM over PCIe"),
        "cpu": ("strata_cpu_expert_calls_total", "Routed experts computed on the CPU pool"),
        "mmap_reads": ("strata_mmap_expert_reads_total", "Experts read from the file's mapping (page cache)"),
        "mmap_bytes": ("strata_mmap_bytes_total", "Expert bytes read from the file's mapping"),
    }
    families = {k: CounterMetricFamily(name, doc, labels=["phase"]) for k, (name, doc) in by_phase.items()}
    for phase, t in (("decode", cache.use.decode), ("prefill", cache.use.prefill)):
        for key, value in (
            ("lookups", t.lookups),
            ("hits", t.hits),
            ("misses", t.lookups - t.hits),
            ("pcie", t.pcie_bytes),
            ("cpu", t.cpu_calls),
            ("mmap_reads", t.mmap_reads),
            ("mmap_bytes", t.mmap_bytes),
        ):
            families[key].add_metric([phase], value)
    yield from families.values()

"""The prefill pacer (strata/sched/pacer.py) on its own: its cost fit and, simulated window by window
against a cost model of the GPU or CPU, the two promises it keeps (running streams keep KEEP of their
pace; a long prompt's TTFT stays within about 1 / KEEP of its solo TTFT). The scheduler's use of it is
in tests/test_scheduler.py.
"""

from __future__ import annotations

import pytest


def _simulate(
    d: float,
    a: float,
    b: float,
    chunk: int,
    prompt: int,
    floor: float = 0.0,
    taught: bool = True,
    gaps: tuple[float, ...] = (),
    calibrated: bool | tuple[int, ...] = False,
    short: tuple[float, float] | None = None,
) -> tuple[float, float, float]:
    """A newcomer's prompt read beside running streams under the cost model decode-only = d, mixed =
    max(floor, a + b n) (the floor: the GPU's eager pass, launch-bound at few tokens). The pacer sees only
    the times, after one earlier prompt read alone taught it b (taught), or after short prompts beside the
    streams only (as `strata bench` runs), and after the warm-up's passes alone (calibrated) or not. short:
    (a_s, b_s) of the GPU's short passes (up to SHORT tokens, decode rows costing d), which the engine takes
    where they are cheaper.
    Returns (the streams' pace / solo pace until the prompt's first token, as `strata bench`'s prefill
    scenario measures it; TTFT / solo TTFT; the longest window in d)."""
    from strata.sched.pacer import SHORT, PrefillPacer, calibration_sizes

    def cost(n: int, rows: float = a) -> float:
        t = max(floor, rows + b * n)
        if short is not None and n <= SHORT:
            t = min(t, short[0] + short[1] * n + rows - (a - d))  # rows: a beside streams, a - d alone
        return t

    p = PrefillPacer()
    if calibrated:  # the server's warm-up: the passes it times (or those given), alone
        sizes = calibrated if isinstance(calibrated, tuple) else calibration_sizes(chunk, 16384) or ()
        p.calibrate([(n, cost(n, a - d)) for n in sizes])
    if taught:
        p.observe(cost(chunk, a - d), chunk, streams=False)  # an earlier prompt, alone
    for _ in range(3):
        p.observe(d, 0)
    if not taught:
        for n in (15, 13, 12, 13):
            p.observe(cost(n), n)
            p.observe(d, 0)
    for g in gaps:  # decode cadences that took in an idle gap or a capture, as streams start
        p.observe(g, 0)
        p.observe(d, 0)
    left, elapsed, tokens, longest = prompt, 0.0, 0, 0.0
    while left > 0:
        n = p.chunk(chunk, left)
        t = d if n == 0 else cost(n)
        p.observe(t, n)
        left, elapsed, tokens, longest = left - n, elapsed + t, tokens + 1, max(longest, t)
    # alone: no decode rows in its windows
    solo = sum(cost(min(chunk, prompt - s), a - d) for s in range(0, prompt, chunk))
    return tokens * d / elapsed, elapsed / solo, longest / d


@pytest.mark.parametrize(
    "kind, d, a, b, chunk, prompt, floor, taught, gaps, calibrated",
    [
        ("gpu", 0.004, 0.008, 0.00012, 2048, 16384, 0.0, True, (), False),  # 80B: ~4 ms decode, ~8.4k tok/s
        ("gpu small fixed part", 0.004, 0.0045, 0.00012, 2048, 4096, 0.0, True, (), False),
        ("cpu", 0.1, 0.11, 0.002, 512, 3000, 0.0, True, (), False),
        # the H200 bench (issue 15): 3 streams at 11 ms, eager passes >= 36 ms, only short prompts before
        ("h200 bench", 0.011, 0.012, 0.00012, 2048, 4118, 0.036, False, (), False),
        ("h200 bench, taught", 0.011, 0.012, 0.00012, 2048, 4118, 0.036, True, (), False),
        ("h200 bench, calibrated", 0.011, 0.012, 0.00012, 2048, 4118, 0.036, False, (), True),
        # the 2026-12-04 H200 run's window log: 3 streams at 6.4 ms, eager passes ~50 ms, and decode cadences
        # of 70-100 ms (idle gaps, captures) among them before the prompt came
        ("h200 bench, gaps", 0.0064, 0.05, 0.0001, 2048, 4119, 0.05, False, (0.07, 0.1, 0.06), False),
        # 80B at 24 GiB on an H100 (perf/host_stub.py GpuTimes.h100_24g): 3 streams at 32.6 ms, every pass
        # past the staging rows ~0.56 s of expert copies first, 0.03 ms a token after that
        ("24 GiB, calibrated", 0.0326, 0.56, 0.00003, 2048, 4096, 0.0, False, (), True),
        ("24 GiB, calibrated, short", 0.0326, 0.56, 0.00003, 2048, 2069, 0.0, False, (), True),
    ],
)
def test_pacer_keeps_both_promises(
    kind: str,
    d: float,
    a: float,
    b: float,
    chunk: int,
    prompt: int,
    floor: float,
    taught: bool,
    gaps: tuple[float, ...],
    calibrated: bool,
) -> None:
    from strata.sched.pacer import KEEP

    pace, ttft, longest = _simulate(d, a, b, chunk, prompt, floor, taught, gaps, calibrated)
    print(
        f"{kind}: streams keep {pace:.0%} of their pace, TTFT {ttft:.2f}x solo, "
        f"longest window {longest:.0f} d"
    )
    assert pace >= KEEP * (0.95 if gaps else 0.9), kind  # within the first windows' learning
    assert ttft <= 1 / KEEP * 1.1, kind


def test_pacer_predicts_a_short_windows_own_cost() -> None:
    """At 24 GiB a prompt's short tail (2,069 = 2,048 + 21) runs per (row, expert) pair reading its misses in
    place, ~0.25 s where the line through the staged passes says 0.56: timed at the warm-up, the short passes
    let the pacer pay the streams what the tail costs, not what a staged pass would, and the TTFT stays
    within 1 / KEEP of its solo TTFT. Without them the streams are overpaid and the TTFT goes past it."""
    from strata.sched.pacer import KEEP

    d, a, b, short = 0.0326, 0.56, 0.00003, (0.02, 0.0097)  # perf/host_stub.py GpuTimes.h100_24g
    pace, ttft, _ = _simulate(d, a, b, 2048, 2069, calibrated=True, short=short)
    print(f"with the short line: streams keep {pace:.0%}, TTFT {ttft:.2f}x")
    assert pace >= KEEP * 0.95 and ttft <= 1 / KEEP * 1.05
    pace0, ttft0, _ = _simulate(d, a, b, 2048, 2069, calibrated=(256, 1024), short=short)
    print(f"without: streams keep {pace0:.0%}, TTFT {ttft0:.2f}x")
    assert ttft0 > ttft + 0.2 and pace0 > pace


def test_pacer_fits_the_fixed_and_per_token_costs() -> None:
    from strata.sched.pacer import PrefillPacer

    fresh = PrefillPacer(probe=64)
    assert fresh.chunk(512, 1000) == 64 and fresh.chunk(512, 20) == 20  # b unknown: the probe, or the rest
    p = PrefillPacer()
    p.observe(0.004, 0)
    for n in (64, 200, 32, 512):
        p.observe(0.008 + 0.00012 * n, n)
    a, b = p.cost()
    assert abs(a - 0.008) < 1e-6 and abs(b - 0.00012) < 1e-9
    # 8 + 2.4 ms beside 4 ms decode windows: one owed, paid first
    assert p.chunk(512, 20) == 0 and p.owed == 1
    p.observe(0.004, 0)
    assert p.chunk(512, 20) == 20
    p.observe(0.0104, 20)
    assert p.owed == 0
    # too long for the budget: a full chunk (8 + 61 ms predicted), its 16 windows paid first
    assert p.chunk(512, 5000) == 0 and p.owed == 16
    for _ in range(16):  # decode-only windows pay it back, whoever planned them
        p.observe(0.004, 0)
    assert p.owed == 0 and p.chunk(512, 4488) == 512
    p.observe(0.090, 512)  # it took 90 ms, not 69: the 5 windows that makes beyond the 16 paid come after
    assert p.owed == 5


def test_pacer_probes_before_it_predicts_from_small_windows() -> None:
    """The H200's bench: small prompts beside streams (~42 ms windows, nearly all fixed part), then a 4k
    prompt. The pacer used to take b from the small windows (2.3 ms a token, 0.12 really) and have the
    streams owed 425 decode windows (~5 s) before a 2048-token chunk that took 0.26 s. It reads a probe of
    BIG tokens instead, and pays the streams back what the probe took."""
    from strata.sched.pacer import BIG, PrefillPacer

    p = PrefillPacer()
    p.observe(0.0047, 0)
    for n, t in ((15, 0.0431), (13, 0.043), (12, 0.0425), (13, 0.0413)):
        p.observe(t, n)
        p.observe(0.008, 0)
    assert p.cost() is None
    assert p.chunk(2048, 4118) == BIG and p.owed == 0
    p.observe(0.012 + 0.00012 * BIG + 0.035, BIG)  # the probe, with the eager pass's launch floor
    assert p.owed == 8  # paid back after it: 78 ms beside the streams' 8 ms windows
    _, b = p.cost()
    assert b < 0.0002  # near the truth, not 2.3 ms
    for _ in range(9):
        p.observe(0.008, 0)
    assert p.chunk(2048, 4118 - BIG) == 0 and p.owed < 50  # a full chunk next, ~0.3 s of windows first


def test_pacer_learns_the_per_token_cost_from_large_windows() -> None:
    """Small prompts beside streams are all fixed part and noise: b from them was 2.7 ms a token on the H200
    (0.12 really). A large window, even one read alone, measures it."""
    from strata.sched.pacer import PrefillPacer

    p = PrefillPacer()
    p.observe(0.008, 0)
    for n, t in ((1, 0.0088), (9, 0.036), (15, 0.012)):
        p.observe(t, n)
    p.observe(0.26, 2048, streams=False)
    a, b = p.cost()
    assert abs(b - (0.26 - 0.008) / 2048) < 1e-12 and a >= 0.008


def test_pacer_calibrated_parts_the_fixed_cost_from_the_per_token_cost() -> None:
    """Without calibration one large window alone charges all but a decode window to its tokens: at 24 GiB
    (a 0.56 s fixed part) that is 70x the per-token cost, and the streams are owed seconds of windows
    before a chunk of a fraction of that. Passes of two lengths timed alone part the two; one length, or
    lengths under BIG, leave the pacer as it was; windows beside streams refine them."""
    from strata.sched.pacer import PrefillPacer

    d, a, b = 0.0326, 0.56, 0.00003
    plain, cal, one = PrefillPacer(), PrefillPacer(), PrefillPacer()
    cal.calibrate([(256, a + b * 256), (1024, a + b * 1024)])
    one.calibrate([(1024, a + b * 1024), (1024, a + b * 1024), (8, 0.1)])
    for p in (plain, cal, one):
        for _ in range(3):
            p.observe(d, 0)
    assert plain.cost() is None and one.cost() is None
    fit = cal.cost()
    assert fit is not None and fit[0] == pytest.approx(a) and fit[1] == pytest.approx(b)
    plain.observe(a + b * 256, 256, streams=False)  # the probe: b from one window
    fit = plain.cost()
    assert fit is not None and fit[1] > 50 * b
    t = a + 2 * b * 2048
    cal.observe(t, 2048)  # a slower chunk beside streams: both parts rise, the fixed one as a fixed one
    fit = cal.cost()
    assert fit is not None and a < fit[0] < t - b * 2048 and b < fit[1] < 2 * b

"""strata.bench.gpu_profile without a GPU: the profile's wrapper reaches every module's launches (ops.py's and
the ones qwen4exp, the mixers and the MoE launch from), and everything is put back after."""

from __future__ import annotations

import importlib

from strata.bench.gpu_profile import launches_through
from strata.gpu import runtime

MODULES = ["strata.gpu.ops", "strata.gpu.ops_qwen4exp", "strata.gpu.ops_mixers", "strata.gpu.ops_moe"]


def test_every_module_launches_through_the_wrapper() -> None:
    mods = [importlib.import_module(m) for m in MODULES]
    seen: list[str] = []

    def make(orig):
        assert orig is runtime.launch

        def wrapped(fn, *args, **kw):
            seen.append(fn)

        return wrapped

    with launches_through(make):
        for m in mods:
            m.launch("k-" + m.__name__, (1,), 32, ())
    assert seen == ["k-" + m for m in MODULES]
    assert all(m.launch is runtime.launch for m in mods)

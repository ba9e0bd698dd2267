"""strata.gpu.ops without a GPU: an Ops built over stand-in modules (nothing compiled) keeps every launcher
reachable. A kernel module stored under a launcher's name (`self.flash = Kernels(...)` beside the `flash`
method) would shadow the method on the instance, and only a GPU run would say so."""

from __future__ import annotations

import strata.gpu.runtime as runtime
from strata.gpu.ops import Ops


def test_no_kernel_module_shadows_a_launcher(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "_module", lambda source, names: None)
    ops = Ops()
    shadowed = [k for k in vars(ops) if callable(getattr(type(ops), k, None))]
    assert not shadowed, f"instance attributes hide these Ops methods: {shadowed}"

"""The test-only fault hook: POST /debug/fault (api/ops.py, mounted only with --test-hooks) arms it,
and the next windows raise inside the engine thread, so tests can watch a failed window fail only its own
requests (a 503 each with the reason) while the queue carries on."""

from __future__ import annotations

from dataclasses import dataclass


class InjectedFault(RuntimeError):
    """Raised inside a window by the fault hook."""


@dataclass(slots=True)
class FaultHook:
    pending: int = 0  # windows left to fail on purpose

    def arm(self, windows: int = 1) -> int:
        """Fail the next `windows` more windows; returns how many are now pending."""
        self.pending += windows
        return self.pending

    def check(self) -> None:
        """Called at the start of every forward pass: raises while armed."""
        if self.pending > 0:
            self.pending -= 1
            raise InjectedFault("fault injected by the test hook")

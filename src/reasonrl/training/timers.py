"""Per-phase wall-clock timings of a training step, logged as ``time/<phase>_seconds``."""

from __future__ import annotations

import time
from collections.abc import Iterable


class PhaseTimer:
    """Times a step's named phases with ``time.perf_counter`` from its creation, the start of the step. ``phases``:
    those it may report, in the order :meth:`metrics` gives them (the order a run logs them in)."""

    def __init__(self, phases: Iterable[str]) -> None:
        self.seconds: dict[str, float | None] = dict.fromkeys(phases)
        self.started = self.mark = time.perf_counter()

    def lap(self, phase: str) -> float:
        """Phase ``phase`` ends now: its seconds since the previous lap ended (or the step started)."""
        now = time.perf_counter()
        seconds = self.record(phase, now - self.mark)
        self.mark = now
        return seconds

    def total(self, phase: str) -> float:
        """Phase ``phase``, the step so far, ends now: its seconds since the step started."""
        now = time.perf_counter()
        seconds = self.record(phase, now - self.started)
        self.mark = now
        return seconds

    def record(self, phase: str, seconds: float) -> float:
        """Phase ``phase`` took ``seconds``, timed elsewhere (e.g. in another process)."""
        if phase not in self.seconds:
            raise KeyError(f"{phase!r} is not one of the phases {list(self.seconds)}")
        self.seconds[phase] = seconds
        return seconds

    def metrics(self) -> dict[str, float]:
        """``time/<phase>_seconds`` of every phase timed, in the order of ``phases``."""
        return {f"time/{phase}_seconds": seconds for phase, seconds in self.seconds.items() if seconds is not None}

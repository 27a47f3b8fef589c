"""Learning-rate schedules: the rate of an optimizer step as a pure function of the step's index, so that a resumed
run continues the same sequence from its step count alone, with no scheduler state to save."""

from __future__ import annotations

import math
from collections.abc import Callable


def _constant(progress: float) -> float:
    return 1.0


def _linear(progress: float) -> float:
    return 1.0 - progress


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


LR_SCHEDULES: dict[str, Callable[[float], float]] = {"constant": _constant, "linear": _linear, "cosine": _cosine}
"""Each schedule's multiplier of the peak rate after warm-up, as a function of the progress through the decay
(0 at its first step, 1 just past the last): ``linear`` and ``cosine`` fall from 1 toward 0."""


def learning_rate_factor(schedule: str, step: int, total_steps: int, warmup_steps: int) -> float:
    """The multiplier of the peak learning rate at optimizer step ``step`` (0-based) of ``total_steps``.

    Warm-up: step s < ``warmup_steps`` gets (s + 1) / ``warmup_steps``, so the first step already trains and the
    last warm-up step reaches the peak. Then ``schedule`` at progress (s - warmup) / (total - warmup): the decay's
    first step is at the peak and its last one just above 0, so no step is spent at rate 0. A step past the end
    (``torch.optim.lr_scheduler.LambdaLR`` evaluates the one after the last) gets the schedule's end value.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if step >= total_steps:
        return LR_SCHEDULES[schedule](1.0)
    return LR_SCHEDULES[schedule]((step - warmup_steps) / (total_steps - warmup_steps))

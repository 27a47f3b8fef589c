"""AdamW over the trainable parameters, and the learning rate it steps at: a pure function of the optimizer step's
index (:class:`LearningRateSchedule`), set into the parameter groups before each ``optimizer.step()``, so a resumed
run recomputes it from its step count alone, with no scheduler state to save."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from reasonrl.lora import trainable_parameters
from reasonrl.schedules import learning_rate_factor

if TYPE_CHECKING:
    from reasonrl.config import LRSchedule, OptimizerConfig


def make_optimizer(policy: torch.nn.Module, optimizer: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the policy's trainable parameters at ``optimizer``'s ``learning_rate``, ``betas`` and
    ``weight_decay`` (the section's: ``sft``, ``ei`` or ``grpo``)."""
    return torch.optim.AdamW(
        trainable_parameters(policy),
        lr=optimizer.learning_rate,
        betas=tuple(optimizer.betas),
        weight_decay=optimizer.weight_decay,
        fused=next(policy.parameters()).is_cuda,  # one kernel for all parameters (GPU-only: the CPU keeps its numerics)
    )


@dataclass(frozen=True)
class LearningRateSchedule:
    """The learning rate of each of a run's ``total_steps`` optimizer steps: ``peak`` times the factor of ``shape``
    after ``warmup_steps`` of linear warm-up (:func:`reasonrl.schedules.learning_rate_factor`)."""

    peak: float
    shape: LRSchedule
    total_steps: int
    warmup_steps: int

    def rate(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        return self.peak * learning_rate_factor(self.shape, step, self.total_steps, self.warmup_steps)


def set_learning_rate(optimizer: torch.optim.Optimizer, rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = rate


@contextlib.contextmanager
def scaled_learning_rate(optimizer: torch.optim.Optimizer, factor: float) -> Iterator[None]:
    """Every parameter group's learning rate times ``factor``, for one ``optimizer.step()``."""
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] *= factor
    try:
        yield
    finally:
        for group, rate in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = rate

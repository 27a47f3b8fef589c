"""The best weights of a run: those with the highest validation accuracy so far."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from reasonrl.lora import merged_weights


class HasBest(Protocol):
    """A checkpoint's training state: it carries the best checkpoint's figures (its weights go in the tensors)."""

    best_accuracy: float
    best_step: int | None
    best_interval: dict[str, Any] | None


class BestCheckpoint:
    """Keeps a CPU copy of the weights (LoRA merged) with the highest validation accuracy so far."""

    def __init__(self) -> None:
        self.accuracy = -1.0
        self.step: int | None = None
        self.interval: dict[str, Any] | None = None
        """The best accuracy's ``accuracy_interval`` (``reasonrl.evaluation.summarize``), for the model card."""
        self.state_dict: dict[str, torch.Tensor] | None = None

    def offer(
        self,
        policy: torch.nn.Module,
        accuracy: float,
        step: int,
        keep_weights: bool = True,
        interval: dict[str, Any] | None = None,
    ) -> bool:
        """Record a better ``accuracy`` (and its ``interval``); ``keep_weights=False`` (ranks but 0) joins the
        weights' gathers only."""
        if accuracy <= self.accuracy:
            return False
        self.accuracy, self.step, self.interval = accuracy, step, interval
        weights = merged_weights(policy)
        if keep_weights:
            self.state_dict = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        else:
            self.state_dict = None
            for _ in weights:  # every rank takes part in the gathers, in the same order; only rank 0 keeps a copy
                pass
        return True

    def save_to(self, state: HasBest) -> None:
        """Its figures into a checkpoint's training ``state``."""
        state.best_accuracy, state.best_step, state.best_interval = self.accuracy, self.step, self.interval

    def restore(self, state: HasBest, state_dict: dict[str, torch.Tensor] | None) -> None:
        """As a checkpoint saved it: the figures of its training ``state``, the weights ``state_dict`` (None on the
        ranks but 0)."""
        self.accuracy, self.step, self.interval = state.best_accuracy, state.best_step, state.best_interval
        self.state_dict = state_dict

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


def whole_weights(policy: torch.nn.Module, keep: bool, copy: bool = False) -> dict[str, torch.Tensor] | None:
    """``policy``'s weights whole, LoRA merged (:func:`merged_weights`), on the CPU where ``keep`` (rank 0, which
    saves them), None elsewhere; ``copy``: never the policy's own tensors, a snapshot that later steps leave alone.

    Every rank must call it, in the same order: under FSDP2 each tensor is gathered from all ranks' shards. A rank
    that does not keep drops each gathered tensor before the next, so it never holds more than one whole tensor;
    the keeper moves each to the CPU as it comes, so its GPU does not either.
    """
    weights = merged_weights(policy)
    if keep:
        return {name: tensor.detach().to("cpu", copy=copy) for name, tensor in weights}
    for _ in weights:
        pass
    return None


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
        self.state_dict = whole_weights(policy, keep_weights, copy=True)
        return True

    def save_to(self, state: HasBest) -> None:
        """Its figures into a checkpoint's training ``state``."""
        state.best_accuracy, state.best_step, state.best_interval = self.accuracy, self.step, self.interval

    def restore(self, state: HasBest, state_dict: dict[str, torch.Tensor] | None) -> None:
        """As a checkpoint saved it: the figures of its training ``state``, the weights ``state_dict`` (None on the
        ranks but 0)."""
        self.accuracy, self.step, self.interval = state.best_accuracy, state.best_step, state.best_interval
        self.state_dict = state_dict

"""The policy-gradient loss types ``grpo.loss_type`` can name, and what each needs from a rollout batch.

One registry, read by the params schema (the names), the loss (which weight, which importance ratio) and the GRPO
loop (whether old log-probs must be computed). It imports nothing heavy, so validating params loads no torch. A new
combination of weight and ratio is one entry here; a new formula also needs its per-token function in ``losses``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LossType:
    """A per-token loss ``-w · ρ · log π`` (schematically): its weight ``w`` and its importance ratio ``ρ``."""

    weight: Literal["raw_rewards", "advantages"]
    """``raw_rewards`` (no baseline) or ``advantages`` (group-normalised)."""
    ratio: Literal["none", "clipped", "unclipped"]
    """``none``: on-policy REINFORCE; ``clipped``: PPO's clipped π/π_old (arXiv:1707.06347); ``unclipped``: π/π_old."""

    @property
    def needs_old_log_probs(self) -> bool:
        return self.ratio != "none"

    @property
    def inputs(self) -> tuple[str, ...]:
        """The arguments of ``compute_policy_gradient_loss`` this loss type cannot do without."""
        ratio_inputs = {"none": (), "clipped": ("old_log_probs", "cliprange"), "unclipped": ("old_log_probs",)}
        return (self.weight, *ratio_inputs[self.ratio])


LOSS_TYPES: dict[str, LossType] = {
    "no_baseline": LossType(weight="raw_rewards", ratio="none"),
    "reinforce_with_baseline": LossType(weight="advantages", ratio="none"),
    "grpo_clip": LossType(weight="advantages", ratio="clipped"),
    "grpo_no_clip": LossType(weight="advantages", ratio="unclipped"),
}

LENGTH_NORMALIZATIONS = ("masked_mean", "masked_normalize")
"""Per-sequence reduction of the per-token loss: over its own tokens, or over a constant (Dr. GRPO)."""

KL_ESTIMATORS = ("k2", "k3")
"""Per-token KL penalties for ``grpo.kl_estimator``: ``k2`` follows ∇ KL(π ‖ π_ref), ``k3`` ∇ KL(π_ref ‖ π) (see
``losses.compute_kl``)."""

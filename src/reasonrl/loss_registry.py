"""The policy-gradient loss types ``grpo.loss_type`` can name: one registry entry each, its per-token loss included.

An entry says what its loss needs from a rollout batch (which weight, whether old log-probs), the settings it reads,
the per-token metrics it reports, and computes the loss per token, every entry with the same signature. Every reader
takes this knowledge from here: the params schema (the names, who may set ``grpo.cliprange_high``, who may train
off-policy), ``losses`` (the dispatch, the metrics) and the GRPO loop (the weight, the old log-probs). A new loss
type is one registered function in this module.

It loads no torch, so validating params stays light: the per-token functions use tensor methods only. The reduction
over tokens and sequences (``grpo.length_normalization``) is the same for every loss type, in ``losses``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

Weight = Literal["raw_rewards", "advantages"]
"""A loss's per-sequence weight ``w``, named as the rollout batch's field and ``compute_policy_gradient_loss``'s
argument: the raw reward (no baseline) or the group-normalised advantage."""


@dataclass(frozen=True)
class LossSettings:
    """The ``grpo`` params a per-token loss may read (those of the other loss types are there too, unread)."""

    cliprange: float | None = None
    """ε of a clipped importance ratio."""
    cliprange_high: float | None = None
    """The clip's upper ε (DAPO's clip-higher, arXiv:2503.14476); None = ``cliprange``."""


if TYPE_CHECKING:
    import torch

    PerTokenLoss = Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor | None, LossSettings],
        tuple[torch.Tensor, dict[str, torch.Tensor]],
    ]


@dataclass(frozen=True)
class LossType:
    """A registered loss type: schematically the per-token loss ``-w · ρ · log π`` with a weight ``w`` and an
    importance ratio ``ρ`` (none, clipped or not), and what it needs to be computed."""

    name: str
    weight: Weight
    needs_old_log_probs: bool
    """Whether it reads π_old: an importance ratio, which keeps the gradient unbiased on samples of an older policy."""
    settings: tuple[str, ...]
    """The :class:`LossSettings` fields it reads."""
    optional_settings: tuple[str, ...]
    """Those of ``settings`` it can do without (None has a meaning)."""
    token_metrics: dict[str, str]
    """Each metric it reports → the boolean ``[B, T]`` metadata entry whose mean over the response tokens it is."""
    per_token: PerTokenLoss
    """``(weights [B, 1], policy_log_probs [B, T], old_log_probs [B, T] or None, settings) → (loss [B, T],
    metadata)``."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """The arguments of ``losses.compute_policy_gradient_loss`` it cannot do without."""
        old_log_probs = ("old_log_probs",) if self.needs_old_log_probs else ()
        required = tuple(name for name in self.settings if name not in self.optional_settings)
        return (self.weight, *old_log_probs, *required)


LOSS_TYPES: dict[str, LossType] = {}
"""The loss types by name, in the order they were registered (the order error messages list them in)."""


def register_loss(
    name: str,
    weight: Weight,
    *,
    needs_old_log_probs: bool = False,
    settings: tuple[str, ...] = (),
    optional_settings: tuple[str, ...] = (),
    token_metrics: dict[str, str] | None = None,
) -> Callable[[PerTokenLoss], PerTokenLoss]:
    """Register the decorated per-token function as loss type ``name`` (see :class:`LossType` for the rest). The
    function is returned as it is, so stacked decorators make it several loss types (registered bottom-up)."""
    known = {field.name for field in dataclasses.fields(LossSettings)}
    if name in LOSS_TYPES:
        raise ValueError(f"loss type {name!r} is already registered")
    if weight not in get_args(Weight):
        raise ValueError(f"loss type {name!r}: weight must be one of {', '.join(get_args(Weight))}; got {weight!r}")
    if not set(optional_settings) <= set(settings) <= known:
        raise ValueError(f"loss type {name!r}: settings must be among {sorted(known)}, optional_settings among them")

    def register(per_token: PerTokenLoss) -> PerTokenLoss:
        metrics = dict(token_metrics or {})
        entry = LossType(name, weight, needs_old_log_probs, settings, optional_settings, metrics, per_token)
        LOSS_TYPES[name] = entry
        return per_token

    return register


def loss_types_where(predicate: Callable[[LossType], bool]) -> list[str]:
    """The names of the loss types ``predicate`` holds for, in registration order."""
    return [name for name, entry in LOSS_TYPES.items() if predicate(entry)]


# Decorators apply bottom-up: no_baseline is registered first, as the handout lists the loss types.
@register_loss("reinforce_with_baseline", "advantages")
@register_loss("no_baseline", "raw_rewards")
def reinforce_loss(
    weights: torch.Tensor, policy_log_probs: torch.Tensor, old_log_probs: torch.Tensor | None, settings: LossSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE, ``-w · log π(o_t)``: on the raw reward (``no_baseline``) or on the group-normalised advantage
    (``reinforce_with_baseline``). No ratio: on samples of an older policy its gradient is biased."""
    return -weights * policy_log_probs, {}


@register_loss(
    "grpo_clip",
    "advantages",
    needs_old_log_probs=True,
    settings=("cliprange", "cliprange_high"),
    optional_settings=("cliprange_high",),
    token_metrics={
        "clip_fraction": "clipped",
        "clip_fraction_low": "clipped_low",
        "clip_fraction_high": "clipped_high",
    },
)
def clipped_ratio_loss(
    weights: torch.Tensor, policy_log_probs: torch.Tensor, old_log_probs: torch.Tensor | None, settings: LossSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-style clipped loss ``-min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)`` with ``ρ = π/π_old`` (arXiv:1707.06347), safe
    off-policy; ``ε_high = cliprange_high`` (DAPO's clip-higher, arXiv:2503.14476) or ``cliprange``.

    Metadata: ``clipped`` (``[B, T]`` bool, the clipped term was the smaller one, i.e. the token gets no
    gradient), split into ``clipped_high`` (ρ above 1+ε_high with A > 0) and ``clipped_low`` (ρ below 1-ε with
    A < 0), and ``clip_fraction`` (the mean of ``clipped`` over all positions; mask it yourself when there is padding).
    """
    high = settings.cliprange if settings.cliprange_high is None else settings.cliprange_high
    ratio = (policy_log_probs - old_log_probs).exp()  # [B, T]
    unclipped = ratio * weights  # [B, T]
    clipped = ratio.clamp(1.0 - settings.cliprange, 1.0 + high) * weights  # [B, T]
    was_clipped = clipped < unclipped
    metadata = {
        "clipped": was_clipped,
        "clipped_high": was_clipped & (ratio > 1.0),
        "clipped_low": was_clipped & (ratio < 1.0),
        "clip_fraction": was_clipped.float().mean(),
    }
    return -unclipped.minimum(clipped), metadata


@register_loss("grpo_no_clip", "advantages", needs_old_log_probs=True)
def ratio_loss(
    weights: torch.Tensor, policy_log_probs: torch.Tensor, old_log_probs: torch.Tensor | None, settings: LossSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Unclipped importance-weighted loss ``-ρ·A`` with ``ρ = π/π_old`` (the handout's GRPO-No-Clip ablation)."""
    return -(policy_log_probs - old_log_probs).exp() * weights, {}


LENGTH_NORMALIZATIONS = ("masked_mean", "masked_normalize")
"""Per-sequence reduction of the per-token loss: over its own tokens, or over a constant (Dr. GRPO)."""

KL_ESTIMATORS = ("k2", "k3")
"""Per-token KL penalties for ``grpo.kl_estimator``: ``k2`` follows ∇ KL(π ‖ π_ref), ``k3`` ∇ KL(π_ref ‖ π) (see
``losses.compute_kl``)."""

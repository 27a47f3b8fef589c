"""The policy-gradient loss types ``grpo.loss_type`` can name: one registry entry each, its per-token loss included.

An entry says what its loss needs from a rollout batch (which weight, whether old log-probs), the settings it reads,
the per-token metrics it reports, and computes the loss per token, every entry with the same signature. Every reader
takes this knowledge from here: the params schema (the names, who may set ``grpo.cliprange_high``, who may train
off-policy), ``losses`` (the dispatch, the metrics) and the GRPO loop (the weight, the old log-probs). A new loss
type is one registered function in this module.

It loads no torch, so validating params stays light: the per-token functions use tensor methods only. The reduction
over tokens and sequences (``grpo.loss_aggregation``) is the same for every loss type, in ``losses``.
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
    dual_clip: float | None = None
    """Dual-clip's bound c > 1 on the ratio's loss for negative advantages (arXiv:1912.09729); None = off."""


if TYPE_CHECKING:
    import torch

    PerTokenLoss = Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, LossSettings],
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
    needs_response_mask: bool
    """Whether it reads the response mask: a ratio per sequence, over the sequence's own tokens."""
    settings: tuple[str, ...]
    """The :class:`LossSettings` fields it reads."""
    optional_settings: tuple[str, ...]
    """Those of ``settings`` it can do without (None has a meaning)."""
    token_metrics: dict[str, str]
    """Each metric it reports → the boolean ``[B, T]`` metadata entry whose mean over the response tokens it is."""
    per_token: PerTokenLoss
    """``(weights [B, 1], policy_log_probs [B, T], old_log_probs [B, T] or None, response_mask [B, T] or None,
    settings) → (loss [B, T], metadata)``."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """The arguments of ``losses.compute_policy_gradient_loss`` it cannot do without."""
        old_log_probs = ("old_log_probs",) if self.needs_old_log_probs else ()
        response_mask = ("response_mask",) if self.needs_response_mask else ()
        required = tuple(name for name in self.settings if name not in self.optional_settings)
        return (self.weight, *old_log_probs, *response_mask, *required)


LOSS_TYPES: dict[str, LossType] = {}
"""The loss types by name, in the order they were registered (the order error messages list them in)."""


def register_loss(
    name: str,
    weight: Weight,
    *,
    needs_old_log_probs: bool = False,
    needs_response_mask: bool = False,
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
        entry = LossType(
            name, weight, needs_old_log_probs, needs_response_mask, settings, optional_settings, metrics, per_token
        )
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
    weights: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    settings: LossSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE, ``-w · log π(o_t)``: on the raw reward (``no_baseline``) or on the group-normalised advantage
    (``reinforce_with_baseline``). No ratio: on samples of an older policy its gradient is biased."""
    return -weights * policy_log_probs, {}


CLIP_METRICS = {"clip_fraction": "clipped", "clip_fraction_low": "clipped_low", "clip_fraction_high": "clipped_high"}
"""The clip fractions of a clipped ratio (:func:`clipped_objective`'s metadata)."""


def clipped_objective(
    ratio: torch.Tensor, weights: torch.Tensor, settings: LossSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped loss ``-min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)`` of a ratio ρ (per token ``[B, T]``, or per sequence
    ``[B, 1]``), with its metadata: ``clipped`` (bool, the clipped term was the smaller one, i.e. no gradient), split
    into ``clipped_high`` (ρ above 1+ε_high with A > 0) and ``clipped_low`` (ρ below 1-ε with A < 0), and
    ``clip_fraction`` (the mean of ``clipped`` over all positions; mask it yourself when there is padding)."""
    high = settings.cliprange if settings.cliprange_high is None else settings.cliprange_high
    unclipped = ratio * weights
    clipped = ratio.clamp(1.0 - settings.cliprange, 1.0 + high) * weights
    was_clipped = clipped < unclipped
    metadata = {
        "clipped": was_clipped,
        "clipped_high": was_clipped & (ratio > 1.0),
        "clipped_low": was_clipped & (ratio < 1.0),
        "clip_fraction": was_clipped.float().mean(),
    }
    return -unclipped.minimum(clipped), metadata


@register_loss(
    "grpo_clip",
    "advantages",
    needs_old_log_probs=True,
    settings=("cliprange", "cliprange_high", "dual_clip"),
    optional_settings=("cliprange_high", "dual_clip"),
    token_metrics=CLIP_METRICS | {"clip_fraction_dual": "clipped_dual"},
)
def clipped_ratio_loss(
    weights: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    settings: LossSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-style clipped loss ``-min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)`` with ``ρ = π/π_old`` (arXiv:1707.06347), safe
    off-policy; ``ε_high = cliprange_high`` (DAPO's clip-higher, arXiv:2503.14476) or ``cliprange``. Metadata: that
    of :func:`clipped_objective`.

    ``dual_clip`` c (arXiv:1912.09729, verl's ``clip_ratio_c``): for A < 0 the loss is at most ``-c·A``. The clip
    alone leaves a negative advantage's loss ``-ρ·A`` unbounded as ρ grows, which one stale, very likely token can
    blow up; at the bound the token gets no gradient. Metadata ``clipped_dual``: tokens at the bound.
    """
    ratio = (policy_log_probs - old_log_probs).exp()  # [B, T]
    loss, metadata = clipped_objective(ratio, weights, settings)
    if settings.dual_clip is None:
        metadata["clipped_dual"] = metadata["clipped"].new_zeros(metadata["clipped"].shape)
        return loss, metadata
    bound = -settings.dual_clip * weights  # [B, 1]: the loss at ρ = c, positive where A < 0
    metadata["clipped_dual"] = (weights < 0) & (loss > bound)
    return loss.where(weights >= 0, loss.minimum(bound)), metadata


@register_loss("grpo_no_clip", "advantages", needs_old_log_probs=True)
def ratio_loss(
    weights: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    settings: LossSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Unclipped importance-weighted loss ``-ρ·A`` with ``ρ = π/π_old`` (the handout's GRPO-No-Clip ablation)."""
    return -(policy_log_probs - old_log_probs).exp() * weights, {}


GSPO_MAX_LOG_RATIO = 10.0
"""GSPO's bound on the log of the sequence ratio, as verl's ``compute_policy_loss_gspo`` has it: exp stays finite."""


def sequence_log_ratio(
    policy_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """``log s_i = (1/|y_i|) Σ_t log(π/π_old)`` over each sequence's response tokens, ``[B, 1]``: the log of the
    geometric mean of its token ratios. Padding (whatever its log-probs hold) is left out before the sum."""
    mask = response_mask.bool()
    log_ratio = (policy_log_probs - old_log_probs).where(mask, 0.0)  # [B, T]
    return log_ratio.sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)


@register_loss(
    "gspo",
    "advantages",
    needs_old_log_probs=True,
    needs_response_mask=True,
    settings=("cliprange", "cliprange_high"),
    optional_settings=("cliprange_high",),
    token_metrics=CLIP_METRICS,
)
def sequence_ratio_loss(
    weights: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    settings: LossSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (arXiv:2507.18071): the clipped loss of :func:`clipped_objective` on the sequence ratio ``s_i =
    (π(y_i)/π_old(y_i))^(1/|y_i|)`` (:func:`sequence_log_ratio`, its log at most ``GSPO_MAX_LOG_RATIO``), the same
    for every token of the sequence (broadcast, as the paper's): a sequence is clipped whole, and its gradient is
    ``s_i·A·(1/|y_i|) Σ_t ∇log π(y_t)``. The paper's ε are small (3e-4 and 4e-4): a sequence ratio moves far less
    than a token's. Its metadata broadcast to ``[B, T]``."""
    log_ratio = sequence_log_ratio(policy_log_probs, old_log_probs, response_mask).clamp(max=GSPO_MAX_LOG_RATIO)
    loss, metadata = clipped_objective(log_ratio.exp(), weights, settings)  # [B, 1]
    shape = policy_log_probs.shape
    return loss.expand(shape), {name: value.expand(shape) if value.dim() else value for name, value in metadata.items()}


@register_loss(
    "gspo_token",
    "advantages",
    needs_old_log_probs=True,
    needs_response_mask=True,
    settings=("cliprange", "cliprange_high"),
    optional_settings=("cliprange_high",),
    token_metrics=CLIP_METRICS,
)
def sequence_ratio_token_loss(
    weights: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    settings: LossSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token (arXiv:2507.18071, verl's ``compute_policy_loss_gspo``): per token the ratio ``s_{i,t} = sg[s_i] ·
    π(y_t)/sg[π(y_t)]``, equal to the sequence's ``s_i`` in value, each token's gradient through its own log-prob
    only, clipped as :func:`clipped_objective`. With one advantage per sequence, as here, its loss and gradient are
    GSPO's, whatever the aggregation; it is the form that would take per-token advantages."""
    log_ratio = sequence_log_ratio(policy_log_probs.detach(), old_log_probs, response_mask)  # [B, 1]
    token_log_ratio = (policy_log_probs - policy_log_probs.detach() + log_ratio).clamp(max=GSPO_MAX_LOG_RATIO)
    return clipped_objective(token_log_ratio.exp(), weights, settings)


@register_loss(
    "cispo",
    "advantages",
    needs_old_log_probs=True,
    settings=("cliprange", "cliprange_high"),
    optional_settings=("cliprange_high",),
    token_metrics={"clip_fraction": "clipped"},
)
def clipped_weight_loss(
    weights: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    settings: LossSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585): ``-sg[min(ρ, 1+ε_high)]·A·log π``, REINFORCE weighted by the clipped
    importance ratio, itself a constant (detached). Unlike PPO's clip, a clipped token keeps its gradient, only
    smaller: rare tokens that drive reflection are not dropped. ``ε_high = cliprange_high`` or ``cliprange``; no
    lower bound, as the paper (ε_low "large"). Metadata ``clipped``: tokens whose ρ exceeds 1+ε_high."""
    high = settings.cliprange if settings.cliprange_high is None else settings.cliprange_high
    ratio = (policy_log_probs.detach() - old_log_probs).exp()  # [B, T], no gradient
    return -ratio.clamp(max=1.0 + high) * weights * policy_log_probs, {"clipped": ratio > 1.0 + high}


LOSS_AGGREGATIONS = ("sequence_mean", "constant_normalizer", "token_mean")
"""``grpo.loss_aggregation``: the reduction of the per-token loss over an optimizer step (``losses.aggregate_loss``)."""

RENAMED_AGGREGATIONS = {"masked_mean": "sequence_mean", "masked_normalize": "constant_normalizer"}
"""The values of ``grpo.length_normalization`` (replaced by ``grpo.loss_aggregation``) and their new names."""

KL_ESTIMATORS = ("k2", "k3", "k3_k2grad")
"""Per-token KL penalties for ``grpo.kl_estimator``: ``k2`` follows ∇ KL(π ‖ π_ref), ``k3`` ∇ KL(π_ref ‖ π),
``k3_k2grad`` k3's value with k2's gradient (see ``losses.compute_kl``)."""

ROLLOUT_IS_LEVELS = ("token", "sequence")
"""``grpo.rollout_is_level``: an importance weight per token, or one per sequence
(``losses.rollout_importance_weights``)."""

ROLLOUT_IS_MODES = ("truncate", "mask")
"""``grpo.rollout_is_mode``: weights above the cap are cut to it, or weights outside [lower, cap] set to 0."""

"""Masked reductions, SFT and policy-gradient losses, and the microbatch train steps (CS336 a5 semantics)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from reasonrl.loss_registry import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LOSS_TYPES,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_IS_MODES,
    LossSettings,
    clipped_ratio_loss,
    ratio_loss,
    reinforce_loss,
)


# ---------------------------------------------------------------------------------------------------- reductions
def masked_normalize(
    tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None, normalize_constant: float = 1.0
) -> torch.Tensor:
    """Sum of ``tensor`` where ``mask`` is set, divided by a constant (over ``dim``, or everything); the handout's
    argument order."""
    masked = tensor * mask
    total = masked.sum() if dim is None else masked.sum(dim=dim)
    return total / normalize_constant


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``tensor`` over the positions where ``mask`` is set (over ``dim``, or everything).

    A slice with no masked position gives NaN (0/0), as the handout's reference does.
    """
    masked = tensor * mask
    if dim is None:
        return masked.sum() / mask.sum()
    return masked.sum(dim=dim) / mask.sum(dim=dim)


# ---------------------------------------------------------------------------------------------------- SFT
def sft_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    normalize_constant: float | None = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the response tokens of one microbatch; calls ``backward()``.

    Per sequence: the summed response log-prob over ``normalize_constant`` (None: 1, the handout's default); then
    the batch mean, divided by ``gradient_accumulation_steps`` so that accumulated gradients average over the
    microbatches.
    """
    constant = 1.0 if normalize_constant is None else normalize_constant
    per_sequence_nll = -masked_normalize(policy_log_probs, response_mask, dim=-1, normalize_constant=constant)  # [B]
    loss = per_sequence_nll.mean() / gradient_accumulation_steps
    loss.backward()
    metadata = {
        "nll_per_token": masked_mean(-policy_log_probs.detach(), response_mask),
        "response_tokens": response_mask.sum(),
    }
    return loss.detach(), metadata


# ---------------------------------------------------------------------------------------------------- rewards
def compute_group_normalized_rewards(
    reward_fn: Callable[[str, str], dict[str, float]],
    rollout_responses: list[str],
    repeated_ground_truths: list[str],
    group_size: int,
    advantage_eps: float,
    normalize_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Score each rollout and turn rewards into group-relative advantages (:func:`group_normalized_advantages`).

    Rollouts come in consecutive groups of ``group_size`` answers to the same question.

    Returns ``(advantages [N], raw_rewards [N], metadata)``.
    """
    if len(rollout_responses) != len(repeated_ground_truths):
        raise ValueError(
            f"got {len(rollout_responses)} responses but {len(repeated_ground_truths)} ground truths; they must pair up"
        )
    if group_size < 1 or len(rollout_responses) % group_size:
        raise ValueError(f"{len(rollout_responses)} responses do not split into groups of group_size={group_size}")
    scores = [
        reward_fn(response, truth) for response, truth in zip(rollout_responses, repeated_ground_truths, strict=True)
    ]
    advantages, raw_rewards = group_normalized_advantages(
        [score["reward"] for score in scores], group_size, advantage_eps, normalize_by_std
    )
    grouped = raw_rewards.view(-1, group_size)  # [N/G, G]
    metadata = {
        "reward_mean": raw_rewards.mean().item(),
        "reward_std": raw_rewards.std().item() if raw_rewards.numel() > 1 else 0.0,
        "format_reward_mean": sum(score["format_reward"] for score in scores) / len(scores),
        "answer_reward_mean": sum(score["answer_reward"] for score in scores) / len(scores),
        "zero_variance_group_fraction": (grouped.max(dim=-1).values == grouped.min(dim=-1).values)
        .float()
        .mean()
        .item(),
    }
    return advantages, raw_rewards, metadata


def group_normalized_advantages(
    rewards: list[float], group_size: int, advantage_eps: float, normalize_by_std: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages of rewards already graded, in consecutive groups of ``group_size``:
    ``A = (r - mean(group)) / (std(group) + advantage_eps)`` with the sample std (n−1) when
    ``normalize_by_std``, else ``A = r - mean(group)`` (Dr. GRPO, arXiv:2503.20783, which argues the std
    division over-weights groups that are nearly all right or all wrong).

    Returns ``(advantages [N], raw_rewards [N])``, the rewards as float32.
    """
    raw_rewards = torch.tensor(rewards, dtype=torch.float32)  # [N]
    grouped = raw_rewards.view(-1, group_size)  # [N/G, G]
    centered = grouped - grouped.mean(dim=-1, keepdim=True)
    if normalize_by_std:
        # unbiased=True: the handout's sample std; a group of one has no spread (NaN), so treat it as zero.
        std = grouped.std(dim=-1, keepdim=True).nan_to_num(0.0) if group_size > 1 else torch.zeros_like(centered)
        advantages = centered / (std + advantage_eps)
    else:
        advantages = centered
    return advantages.flatten(), raw_rewards


def leave_one_out_advantages(rewards: list[float], group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO's advantages (arXiv:2402.14740) of rewards in consecutive groups of ``group_size``: each reward minus the
    mean of the others in its group, ``A_i = r_i - (Σ_j r_j - r_i) / (G - 1)`` (TRL's form; verl's
    ``compute_rloo_outcome_advantage`` writes the same as ``G/(G-1) · (r_i - mean)``). A group of one has no other
    answer to compare with and keeps its reward as its advantage, as in verl.

    Returns ``(advantages [N], raw_rewards [N])``, the rewards as float32.
    """
    raw_rewards = torch.tensor(rewards, dtype=torch.float32)  # [N]
    if group_size == 1:
        return raw_rewards.clone(), raw_rewards
    grouped = raw_rewards.view(-1, group_size)  # [N/G, G]
    others_mean = (grouped.sum(dim=-1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others_mean).flatten(), raw_rewards


def overlong_penalties(lengths: list[int], max_tokens: int, buffer: int, max_penalty: float) -> list[float]:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13) of responses of ``lengths`` generated tokens,
    in verl's DAPO reward manager's operation order: ``min(-(n - (max_tokens - buffer)) / buffer · max_penalty,
    0)``, 0 up to ``max_tokens - buffer`` tokens, ``-max_penalty`` at ``max_tokens`` (see
    :class:`reasonrl.config.OverlongPenalty`)."""
    expected = max_tokens - buffer
    return [min(-(length - expected) / buffer * max_penalty, 0.0) for length in lengths]


# ------------------------------------------------------------------------------------------ policy-gradient losses
def compute_naive_policy_gradient_loss(
    raw_rewards_or_advantages: torch.Tensor, policy_log_probs: torch.Tensor
) -> torch.Tensor:
    """Per-token REINFORCE loss ``-A · log π(o_t)``; ``A`` is ``[B, 1]``, the result ``[B, T]``
    (:func:`reasonrl.loss_registry.reinforce_loss`)."""
    return reinforce_loss(raw_rewards_or_advantages, policy_log_probs, None, None, LossSettings())[0]


def compute_grpo_clip_loss(
    advantages: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    cliprange: float,
    cliprange_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO-style clipped loss ``-min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)`` with ``ρ = π/π_old``; ``ε_high =
    cliprange_high`` or ``cliprange``. Returns ``(loss [B, T], metadata)``, the metadata of
    :func:`reasonrl.loss_registry.clipped_ratio_loss` (``clipped``, ``clipped_high``, ``clipped_low``,
    ``clip_fraction``)."""
    settings = LossSettings(cliprange, cliprange_high)
    return clipped_ratio_loss(advantages, policy_log_probs, old_log_probs, None, settings)


def compute_grpo_no_clip_loss(
    advantages: torch.Tensor, policy_log_probs: torch.Tensor, old_log_probs: torch.Tensor
) -> torch.Tensor:
    """Per-token unclipped importance-weighted loss ``-ρ·A`` (the handout's GRPO-No-Clip ablation,
    :func:`reasonrl.loss_registry.ratio_loss`)."""
    return ratio_loss(advantages, policy_log_probs, old_log_probs, None, LossSettings())[0]


def compute_policy_gradient_loss(
    policy_log_probs: torch.Tensor,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
    cliprange_high: float | None = None,
    response_mask: torch.Tensor | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token loss of ``loss_type``, its entry's in ``reasonrl.loss_registry`` (which documents each loss
    type); returns ``(loss [B, T], metadata)``. Raises ValueError naming the arguments the loss type needs and
    lacks (``response_mask``: the loss types with a ratio per sequence)."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}; got {loss_type!r}")
    entry = LOSS_TYPES[loss_type]
    given = {
        "raw_rewards": raw_rewards,
        "advantages": advantages,
        "old_log_probs": old_log_probs,
        "cliprange": cliprange,
        "cliprange_high": cliprange_high,
        "response_mask": response_mask,
    }
    missing = [name for name in entry.inputs if given[name] is None]
    if missing:
        raise ValueError(f"loss_type {loss_type!r} needs {', '.join(missing)}")
    settings = LossSettings(cliprange=cliprange, cliprange_high=cliprange_high, dual_clip=dual_clip)
    return entry.per_token(given[entry.weight], policy_log_probs, old_log_probs, response_mask, settings)  # w: [B, 1]


def aggregate_loss(
    per_token_loss: torch.Tensor,
    response_mask: torch.Tensor,
    loss_aggregation: str,
    normalize_constant: float | None = None,
) -> torch.Tensor:
    """A ``[B, T]`` per-token loss reduced to a scalar, whatever its loss type (``grpo.loss_aggregation``).

    - ``sequence_mean``: each sequence's summed loss over its own length, then the batch mean (the handout's
      default; a token of a short answer weighs more than one of a long answer).
    - ``constant_normalizer``: each sequence's summed loss over one constant ``normalize_constant`` such as the max
      generation length, then the batch mean (Dr. GRPO, arXiv:2503.20783): every token weighs the same.
    - ``token_mean``: the summed loss of every token over ``normalize_constant``, the optimizer step's response
      tokens over all its microbatches (and ranks), so the microbatches add up to the step's mean per token (DAPO,
      arXiv:2503.14476; verl's ``token-mean`` with ``batch_num_tokens``). None: this batch's own tokens.
    """
    if loss_aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_aggregation must be one of {', '.join(LOSS_AGGREGATIONS)}; got {loss_aggregation!r}")
    if loss_aggregation == "constant_normalizer" and normalize_constant is None:
        raise ValueError("loss_aggregation 'constant_normalizer' needs normalize_constant (e.g. max_tokens)")
    if loss_aggregation == "token_mean":
        tokens = response_mask.sum() if normalize_constant is None else normalize_constant
        return masked_normalize(per_token_loss, response_mask, normalize_constant=tokens)
    if loss_aggregation == "sequence_mean":
        per_sequence_loss = masked_mean(per_token_loss, response_mask, dim=-1)  # [B]
    else:
        per_sequence_loss = masked_normalize(
            per_token_loss, response_mask, dim=-1, normalize_constant=normalize_constant
        )  # [B]
    return per_sequence_loss.mean()


def rollout_importance_weights(
    old_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
    level: str = "token",
    mode: str = "truncate",
    lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights ``w`` of the sampled tokens against the engine that sampled them, ``[B, T]``: ``π_old`` is
    the trainer's probability at the start of the step, ``μ`` the engine's (behaviour) probability of the token.

    ``level``: ``token``, ``w = π_old / μ`` per token (TIS, Yao et al. 2025; AReaL's decoupled objective,
    arXiv:2505.24298); ``sequence``, one ``w = Π_t π_old / μ`` per sequence over its response tokens, given to each
    of them (unbiased for the sequence, higher variance; TRL's ``sequence_*`` modes, verl's ``rollout_is:
    sequence``). ``mode``: ``truncate``, ``min(w, cap)``; ``mask``, ``w`` inside ``[lower, cap]`` and 0 outside
    (IcePop: a token, or sequence, the engine and the trainer disagree on too much gets no gradient); ``lower``
    defaults to ``1 / cap``.

    The weights are a constant of the loss: computed without gradient (detached). They are 0 where
    ``response_mask`` is off. The exponent is taken after the bound, ``exp(min(log w, log cap))``, so a large gap
    cannot overflow to inf.

    Metadata, over the masked tokens: ``is_log_prob_gap_mean`` (mean ``|log π_old − log μ|`` per token),
    ``is_log_prob_gap_max`` (its max; 0 without masked tokens), ``is_weight_mean`` (mean of ``w``) and the fraction of
    tokens the bound changed: ``is_truncated_fraction`` (``w`` above ``cap``) or ``is_masked_fraction`` (``w``
    outside the band); the means are NaN without masked tokens, as :func:`masked_mean`'s.
    """
    if cap < 1:
        raise ValueError(f"cap must be ≥ 1, got {cap}")
    if level not in ROLLOUT_IS_LEVELS or mode not in ROLLOUT_IS_MODES:
        raise ValueError(
            f"level must be one of {', '.join(ROLLOUT_IS_LEVELS)} and mode one of {', '.join(ROLLOUT_IS_MODES)}; "
            f"got {level!r}, {mode!r}"
        )
    with torch.no_grad():
        mask = response_mask.bool()
        dtype = torch.promote_types(old_log_probs.dtype, torch.float32)  # bf16 log-probs: exp in fp32
        difference = old_log_probs.detach().to(dtype) - behaviour_log_probs.detach().to(dtype)  # [B, T]
        # Padding may hold anything (-inf, NaN): zero it before it reaches a product or a reduction.
        log_ratio = torch.where(mask, difference, torch.zeros_like(difference))
        log_weight = log_ratio if level == "token" else log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
        if mode == "truncate":
            weights = torch.where(mask, torch.exp(torch.clamp(log_weight, max=math.log(cap))), 0.0)  # [B, T]
            affected = {"is_truncated_fraction": log_weight > math.log(cap)}
        else:
            bounds = math.log(1 / cap if lower is None else lower), math.log(cap)
            outside = (log_weight < bounds[0]) | (log_weight > bounds[1])
            weights = torch.where(mask & ~outside, torch.exp(torch.clamp(log_weight, *bounds)), 0.0)  # [B, T]
            affected = {"is_masked_fraction": outside}
        gap = log_ratio.abs()
        metadata = {
            "is_log_prob_gap_mean": masked_mean(gap, mask),
            "is_log_prob_gap_max": gap.max(),
            "is_weight_mean": masked_mean(weights, mask),
        } | {name: masked_mean(flags.float(), mask) for name, flags in affected.items()}
    return weights, metadata


def grpo_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
    loss_aggregation: str = "sequence_mean",
    normalize_constant: float | None = None,
    cliprange_high: float | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    importance_weights: torch.Tensor | None = None,
    dual_clip: float | None = None,
    entropy_coef: float = 0.0,
    token_entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy-gradient loss of one microbatch, reduced by ``loss_aggregation`` (:func:`aggregate_loss`, with
    ``normalize_constant``) and divided by ``gradient_accumulation_steps``; calls ``backward()``. Metadata: the loss
    type's, with its token metrics (e.g. clip fractions) as means over the response tokens.

    ``kl_coef > 0`` adds ``kl_coef`` times the ``kl_estimator`` penalty per token against ``ref_log_probs`` (see
    :func:`compute_kl`) before the same reduction; metadata ``kl`` is the masked mean of :func:`kl_value`.

    ``importance_weights`` (``[B, T]``, e.g. from :func:`rollout_importance_weights`) multiplies the per-token
    policy-gradient loss before the KL penalty is added (the penalty is not weighted): a constant ``w`` per token,
    so the token's gradient is ``w · ∇(PG term)``. None = the unweighted loss, computed exactly as without it.

    ``entropy_coef > 0`` subtracts ``entropy_coef`` times ``token_entropy`` (``[B, T]``, differentiable: the same
    forward's, :func:`reasonrl.logprobs.get_response_log_probs` with ``entropy_grad``) per token, reduced like the
    rest (verl's ``policy_loss - entropy_coeff * agg_loss(entropy)``): a bonus for spreading probability.
    """
    per_token_loss, metadata = compute_policy_gradient_loss(
        policy_log_probs, loss_type, raw_rewards, advantages, old_log_probs, cliprange, cliprange_high,
        response_mask, dual_clip,
    )  # fmt: skip
    if importance_weights is not None:
        per_token_loss = per_token_loss * importance_weights.detach()
    if kl_coef > 0:
        if ref_log_probs is None:
            raise ValueError("kl_coef > 0 needs ref_log_probs")
        kl = compute_kl(policy_log_probs, ref_log_probs, kl_estimator)  # [B, T]
        per_token_loss = per_token_loss + kl_coef * kl
        metadata["kl"] = masked_mean(kl_value(policy_log_probs.detach(), ref_log_probs), response_mask)
    if entropy_coef > 0:
        if token_entropy is None or not token_entropy.requires_grad:
            raise ValueError("entropy_coef > 0 needs token_entropy with its gradient (entropy_grad=True)")
        per_token_loss = per_token_loss - entropy_coef * token_entropy
    loss = aggregate_loss(per_token_loss, response_mask, loss_aggregation, normalize_constant)
    loss = loss / gradient_accumulation_steps
    loss.backward()
    for metric, flag in LOSS_TYPES[loss_type].token_metrics.items():
        metadata[metric] = masked_mean(metadata[flag].float(), response_mask)
    return loss.detach(), metadata


KL_MAX_LOG_RATIO = 20.0
"""The bound on ``|log r|`` inside k3, as verl's ``kl_penalty_forward`` (``low_var_kl``) and NeMo RL have it: ``r``
stays finite where π ≪ π_ref (a token the policy has all but ruled out)."""
KL_MAX_K3 = 10.0
"""The bound on k3's value per token (verl's, NeMo RL's): one token's penalty cannot swamp the step's loss."""


def compute_kl(policy_log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL penalty from the sampled tokens' log-probs, ``r = π_ref / π`` (J. Schulman, "Approximating KL
    divergence", 2020), meant as a loss term: the tokens are sampled from π and the gradient flows through log π
    only, so what counts is each estimator's expected *gradient*, not its expected value.

    - ``k2 = ½ (log r)²``: gradient ``(log π - log π_ref) ∇log π``, whose expectation under π is
      ∇ KL(π ‖ π_ref), the forward KL that the reward-shaped penalty of PPO-style RLHF follows.
    - ``k3 = (r - 1) - log r`` (the GRPO paper's, arXiv:2402.03300): gradient ``(1 - r) ∇log π``, whose
      expectation is ∇ KL(π_ref ‖ π), the reverse direction (its *value* estimates KL(π ‖ π_ref) unbiasedly). As in
      verl's ``kl_penalty_forward``, ``log r`` is clamped to ±``KL_MAX_LOG_RATIO`` and k3 to at most ``KL_MAX_K3``:
      where a bound holds the token's penalty is constant (no gradient). Inside them the value and gradient are
      the unclamped ones, bit for bit; k3 reaches 10 at r ≈ 13.6 (π_ref/π) or r ≈ e⁻¹¹ (π/π_ref ≈ 6·10⁴).
    - ``k3_k2grad``: k3's value (clamped as k3) with k2's gradient, ``k2 - sg(k2) + sg(k3)`` (verl's ``k3+``): a
      value that estimates KL(π ‖ π_ref) without bias and an expected gradient of ∇ KL(π ‖ π_ref), one direction.

    ``k1 = -log r`` is not offered: its gradient ``∇log π`` has expectation 0 under π, so as a loss it only adds noise.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}; got {estimator!r}")
    if estimator == "k2":
        return 0.5 * (ref_log_probs - policy_log_probs).square()  # ½ (log r)², [B, T]
    log_ratio = (ref_log_probs - policy_log_probs).clamp(-KL_MAX_LOG_RATIO, KL_MAX_LOG_RATIO)  # log r, [B, T]
    k3 = (torch.expm1(log_ratio) - log_ratio).clamp(max=KL_MAX_K3)
    if estimator == "k3":
        return k3
    k2 = 0.5 * (ref_log_probs - policy_log_probs).square()
    return k2 - k2.detach() + k3.detach()


def kl_value(policy_log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token ``(r - 1) - log r``: an unbiased, never negative estimate of KL(π ‖ π_ref) under samples of π, the
    logged ``train/kl`` whatever the penalty's estimator, so runs with either estimator compare. Unclamped: the log
    shows a blow-up that the penalty's bounds (:func:`compute_kl`) hide."""
    log_ratio = ref_log_probs - policy_log_probs  # log r, [B, T]
    return torch.expm1(log_ratio) - log_ratio

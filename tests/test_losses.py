"""Masked reductions, group normalisation and policy-gradient losses: hand-checkable numbers."""

import math

import pytest
import torch

from reasonrl import (
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
    grpo_microbatch_train_step,
    masked_mean,
    masked_normalize,
    sft_microbatch_train_step,
)
from reasonrl.losses import (
    compute_grpo_no_clip_loss,
    compute_kl,
    group_normalized_advantages,
    leave_one_out_advantages,
    overlong_penalties,
    rollout_importance_weights,
)


def handout_example():
    """Two sequences of 4 and 7 response tokens, max_gen_len 7, ratio 1, advantage 2."""
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.float32)
    ratio = torch.ones(2, 7, requires_grad=True)
    advantages = torch.full((2, 1), 2.0)
    return ratio, advantages, mask


def test_masked_mean_handout_example_values_and_gradients():
    ratio, advantages, mask = handout_example()
    per_sequence = masked_mean(ratio * advantages, mask, dim=-1)
    assert per_sequence.tolist() == pytest.approx([2.0, 2.0])
    per_sequence.mean().backward()
    expected = torch.tensor([[2 / 4] * 4 + [0.0] * 3, [2 / 7] * 7]) / 2  # d/dratio = A / n_tokens / batch
    assert torch.allclose(ratio.grad, expected)
    assert ratio.grad[0, 0].item() == pytest.approx(0.25)
    assert ratio.grad[1, 0].item() == pytest.approx(0.1429, abs=1e-4)


def test_masked_normalize_handout_example_values_and_gradients():
    ratio, advantages, mask = handout_example()
    per_sequence = masked_normalize(ratio * advantages, mask, normalize_constant=7, dim=-1)
    assert per_sequence.tolist() == pytest.approx([8 / 7, 2.0])
    assert per_sequence[0].item() == pytest.approx(1.1429, abs=1e-4)
    per_sequence.mean().backward()
    assert torch.allclose(ratio.grad, mask * (1 / 7))  # the same weight for every unmasked token


def test_masked_reductions_over_everything_and_over_rows():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, False, True], [False, False, True]])
    assert masked_mean(values, mask).item() == pytest.approx((1 + 3 + 6) / 3)
    assert masked_mean(values, mask, dim=-1).tolist() == pytest.approx([2.0, 6.0])
    assert masked_mean(values, mask, dim=0).tolist()[0] == pytest.approx(1.0)
    assert masked_normalize(values, mask, normalize_constant=2.0).item() == pytest.approx(5.0)
    assert masked_normalize(values, mask, dim=-1, normalize_constant=2.0).tolist() == pytest.approx([2.0, 3.0])


def test_sft_microbatch_train_step_scales_by_accumulation_and_backpropagates():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]], dtype=torch.float32)
    loss, metadata = sft_microbatch_train_step(log_probs, mask, gradient_accumulation_steps=4, normalize_constant=2.0)
    # per sequence: (2+3)/2 = 2.5 and (4+5)/2 = 4.5; batch mean 3.5; over 4 accumulation steps
    assert loss.item() == pytest.approx(3.5 / 4)
    assert torch.allclose(log_probs.grad, -mask / 2.0 / 2 / 4)
    assert metadata["nll_per_token"].item() == pytest.approx((2 + 3 + 4 + 5) / 4)


def test_group_normalization_uses_sample_std():
    def reward_fn(response, truth):
        value = float(response == truth)
        return {"reward": value, "format_reward": 1.0, "answer_reward": value}

    responses = ["1", "0", "0", "0", "1", "1", "1", "1"]
    truths = ["1"] * 8
    advantages, raw, metadata = compute_group_normalized_rewards(
        reward_fn, responses, truths, group_size=4, advantage_eps=1e-6, normalize_by_std=True
    )
    assert raw.tolist() == [1, 0, 0, 0, 1, 1, 1, 1]
    # group 1: mean 0.25, sample std sqrt((0.5625 + 3*0.0625)/3) = 0.5
    assert advantages[:4].tolist() == pytest.approx([0.75 / 0.5, -0.25 / 0.5, -0.25 / 0.5, -0.25 / 0.5], abs=1e-5)
    assert advantages[4:].tolist() == pytest.approx([0.0] * 4)  # zero variance: no signal
    assert metadata["zero_variance_group_fraction"] == pytest.approx(0.5)
    assert metadata["reward_mean"] == pytest.approx(5 / 8)

    mean_only, _, _ = compute_group_normalized_rewards(
        reward_fn, responses, truths, group_size=4, advantage_eps=1e-6, normalize_by_std=False
    )
    assert mean_only[:4].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_group_normalization_rejects_ragged_groups():
    with pytest.raises(ValueError, match="group_size=3"):
        compute_group_normalized_rewards(lambda r, t: {}, ["a"] * 4, ["a"] * 4, 3, 1e-6, True)


def hand_leave_one_out(rewards: list[float], group_size: int) -> list[float]:
    """RLOO written out: each reward minus the plain mean of the other rewards of its group."""
    advantages = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        for index, reward in enumerate(group):
            others = group[:index] + group[index + 1 :]
            advantages.append(reward - sum(others) / len(others) if others else reward)
    return advantages


def verl_rloo(rewards: list[float], group_size: int) -> list[float]:
    """verl's compute_rloo_outcome_advantage, its operations in its order: r·n/(n−1) − mean·n/(n−1) per group of
    n > 1, the reward itself in a group of one."""
    scores = torch.tensor(rewards)
    out = scores.clone()
    for start in range(0, len(rewards), group_size):
        group = scores[start : start + group_size]
        n = len(group)
        if n > 1:
            out[start : start + n] = group * n / (n - 1) - torch.mean(group) * n / (n - 1)
    return out.tolist()


@pytest.mark.parametrize(
    ("rewards", "group_size"),
    [
        ([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5], 4),  # a split group and one without variance
        ([1.0, 0.0, 0.1, 1.0, 0.0, 0.0], 3),
        ([1.0, 0.0, 0.0, 0.0], 2),  # groups of two: ±(r0 − r1)
        ([0.7, -0.3, 1.0], 1),  # a group of one keeps its reward, as in verl
    ],
)
def test_rloo_advantages_are_the_leave_one_out_baseline_by_hand_and_verls(rewards, group_size):
    advantages, raw = leave_one_out_advantages(rewards, group_size)
    assert raw.tolist() == pytest.approx(rewards) and raw.dtype == torch.float32
    assert advantages.tolist() == pytest.approx(hand_leave_one_out(rewards, group_size), abs=1e-6)
    assert advantages.tolist() == pytest.approx(verl_rloo(rewards, group_size), abs=1e-6)
    if group_size > 1:  # G/(G−1) times the mean-centred advantage (Dr. GRPO's)
        centred, _ = group_normalized_advantages(rewards, group_size, 1e-6, normalize_by_std=False)
        torch.testing.assert_close(advantages, centred * group_size / (group_size - 1))


def test_rloo_advantages_by_hand_and_their_policy_gradient():
    """One group [1, 0, 0, 1]: A = r − mean(others) = ±2/3, the sum over the group 0. Through
    reinforce_with_baseline and the per-sequence mean, d loss / d log π(o_t) = −A_i / (tokens_i · B)."""
    advantages, _ = leave_one_out_advantages([1.0, 0.0, 0.0, 1.0], 4)
    assert advantages.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    log_probs = torch.full((4, 3), -1.0, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    loss, _ = compute_policy_gradient_loss(log_probs, "reinforce_with_baseline", advantages=advantages.unsqueeze(-1))
    masked_mean(loss, mask, dim=-1).mean().backward()
    tokens = mask.sum(dim=-1, keepdim=True)
    torch.testing.assert_close(log_probs.grad, -advantages.unsqueeze(-1) / tokens / 4 * mask)


def verl_overlong(length: int, max_tokens: int, buffer: int, factor: float) -> float:
    """verl's DAPO reward manager's overlong term, written as it is there."""
    expected_len = max_tokens - buffer
    exceed_len = length - expected_len
    return min(-exceed_len / buffer * factor, 0)


def test_overlong_penalty_at_the_edges_of_its_buffer():
    """max_tokens 10, buffer 4: nothing up to 6 tokens, then −max_penalty · (n − 6) / 4, −max_penalty at 10."""
    lengths = [0, 5, 6, 7, 8, 9, 10]
    penalties = overlong_penalties(lengths, max_tokens=10, buffer=4, max_penalty=0.5)
    assert penalties == [0.0, 0.0, 0.0, -0.125, -0.25, -0.375, -0.5]  # exact: dyadic fractions
    assert penalties == [verl_overlong(n, 10, 4, 0.5) for n in lengths]
    assert [reward + penalty for reward, penalty in zip([1.0] * 3, penalties[:3], strict=True)] == [1.0] * 3
    # a buffer of the whole budget: from the first token on; a buffer of one: the last token only
    assert overlong_penalties([0, 3, 12], 12, 12, 1.0) == pytest.approx([0.0, -0.25, -1.0])
    assert overlong_penalties([10, 11, 12], 12, 1, 2.0) == [0.0, 0.0, -2.0]
    thirds = overlong_penalties([7, 8], 9, 3, 1.0)  # not dyadic: verl's order of operations, in double
    assert thirds == [verl_overlong(n, 9, 3, 1.0) for n in (7, 8)] == [-1 / 3, -2 / 3]


def test_naive_policy_gradient_loss():
    log_probs = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]])
    advantages = torch.tensor([[2.0], [-1.0]])
    loss = compute_naive_policy_gradient_loss(advantages, log_probs)
    assert loss.tolist() == [[2.0, 4.0], [-0.5, -0.25]]


def test_grpo_clip_loss_clips_and_reports_fraction():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[0.5, 0.9, 1.1, 1.5]]))
    positive = compute_grpo_clip_loss(torch.tensor([[1.0]]), new, old, cliprange=0.2)
    # A > 0: min(ρA, clip(ρ)A) → [0.5, 0.9, 1.1, 1.2]; only ρ = 1.5 is clipped
    assert (-positive[0]).tolist()[0] == pytest.approx([0.5, 0.9, 1.1, 1.2])
    assert positive[1]["clipped"].tolist() == [[False, False, False, True]]
    assert positive[1]["clip_fraction"].item() == pytest.approx(0.25)
    negative = compute_grpo_clip_loss(torch.tensor([[-1.0]]), new, old, cliprange=0.2)
    # A < 0: min(-ρ, -clip(ρ)) → [-0.8, -0.9, -1.1, -1.5]; only ρ = 0.5 is clipped
    assert (-negative[0]).tolist()[0] == pytest.approx([-0.8, -0.9, -1.1, -1.5])
    assert negative[1]["clip_fraction"].item() == pytest.approx(0.25)


def test_grpo_no_clip_is_the_plain_importance_weighted_loss():
    new = torch.log(torch.tensor([[0.5, 2.0]]))
    loss = compute_grpo_no_clip_loss(torch.tensor([[3.0]]), new, torch.zeros(1, 2))
    assert loss.tolist()[0] == pytest.approx([-1.5, -6.0])


@pytest.mark.parametrize(
    ("loss_type", "kwargs", "message"),
    [
        ("ppo", {}, "loss_type must be one of"),
        ("no_baseline", {}, "needs raw_rewards"),
        ("reinforce_with_baseline", {"raw_rewards": torch.ones(1, 1)}, "needs advantages"),
        ("grpo_clip", {"advantages": torch.ones(1, 1)}, "needs old_log_probs, cliprange"),
        ("grpo_no_clip", {"advantages": torch.ones(1, 1)}, "needs old_log_probs"),
    ],
)
def test_policy_gradient_loss_names_what_is_missing(loss_type, kwargs, message):
    with pytest.raises(ValueError, match=message):
        compute_policy_gradient_loss(torch.zeros(1, 2), loss_type, **kwargs)


def test_policy_gradient_loss_dispatch():
    log_probs = torch.log(torch.tensor([[0.5, 0.25]]))
    old = torch.log(torch.tensor([[0.25, 0.25]]))
    rewards, advantages = torch.tensor([[1.0]]), torch.tensor([[-2.0]])
    common = {"raw_rewards": rewards, "advantages": advantages, "old_log_probs": old, "cliprange": 0.2}
    no_baseline, _ = compute_policy_gradient_loss(log_probs, "no_baseline", **common)
    assert torch.allclose(no_baseline, -log_probs)
    with_baseline, _ = compute_policy_gradient_loss(log_probs, "reinforce_with_baseline", **common)
    assert torch.allclose(with_baseline, 2 * log_probs)
    no_clip, _ = compute_policy_gradient_loss(log_probs, "grpo_no_clip", **common)
    assert no_clip.tolist()[0] == pytest.approx([4.0, 2.0])  # -ρA with ρ = [2, 1]
    clip, metadata = compute_policy_gradient_loss(log_probs, "grpo_clip", **common)
    assert clip.tolist()[0] == pytest.approx([4.0, 2.0])  # A < 0: the larger (unclipped) ρ wins
    assert "clip_fraction" in metadata


@pytest.mark.parametrize("loss_aggregation", ["sequence_mean", "constant_normalizer"])
def test_grpo_microbatch_train_step_matches_handout_example(loss_aggregation):
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.float32)
    log_probs = torch.zeros(2, 7, requires_grad=True)  # ρ = 1 against old log-probs of 0
    loss, metadata = grpo_microbatch_train_step(
        log_probs,
        mask,
        gradient_accumulation_steps=2,
        loss_type="grpo_clip",
        advantages=torch.full((2, 1), 2.0),
        old_log_probs=torch.zeros(2, 7),
        cliprange=0.2,
        loss_aggregation=loss_aggregation,
        normalize_constant=7,
    )
    # dloss/dlogp = dloss/dρ at ρ = 1, negated (the loss is -ρA), halved by accumulation
    if loss_aggregation == "sequence_mean":
        assert loss.item() == pytest.approx(-2.0 / 2)
        expected_grad = -torch.tensor([[0.25] * 4 + [0.0] * 3, [1 / 7] * 7]) / 2
    else:
        assert loss.item() == pytest.approx(-(8 / 7 + 2.0) / 2 / 2)
        expected_grad = -mask / 7 / 2
    assert torch.allclose(log_probs.grad, expected_grad)
    assert metadata["clip_fraction"].item() == 0.0


def test_grpo_microbatch_train_step_rejects_bad_loss_aggregation():
    with pytest.raises(ValueError, match="loss_aggregation must be one of"):
        grpo_microbatch_train_step(
            torch.zeros(1, 2, requires_grad=True),
            torch.ones(1, 2),
            1,
            "no_baseline",
            raw_rewards=torch.ones(1, 1),
            loss_aggregation="sum",
        )
    with pytest.raises(ValueError, match="needs normalize_constant"):
        grpo_microbatch_train_step(
            torch.zeros(1, 2, requires_grad=True),
            torch.ones(1, 2),
            1,
            "no_baseline",
            raw_rewards=torch.ones(1, 1),
            loss_aggregation="constant_normalizer",
        )


def test_clip_higher_widens_only_the_upper_edge():
    """DAPO's clip-higher: ε_high = 0.28 lets ρ = 1.25 through for A > 0; the lower edge stays at 1 - ε = 0.8."""
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[0.5, 0.75, 1.25, 1.5]]))
    positive, meta = compute_grpo_clip_loss(torch.tensor([[1.0]]), new, old, cliprange=0.2, cliprange_high=0.28)
    assert (-positive).tolist()[0] == pytest.approx([0.5, 0.75, 1.25, 1.28])  # only 1.5 clipped, at 1.28
    assert meta["clipped_high"].tolist() == [[False, False, False, True]]
    assert not meta["clipped_low"].any()
    negative, meta = compute_grpo_clip_loss(torch.tensor([[-1.0]]), new, old, cliprange=0.2, cliprange_high=0.28)
    assert (-negative).tolist()[0] == pytest.approx([-0.8, -0.8, -1.25, -1.5])  # 0.5 and 0.75 clipped, at 0.8
    assert meta["clipped_low"].tolist() == [[True, True, False, False]]
    assert not meta["clipped_high"].any()
    symmetric, _ = compute_grpo_clip_loss(torch.tensor([[1.0]]), new, old, cliprange=0.2)
    assert (-symmetric).tolist()[0] == pytest.approx([0.5, 0.75, 1.2, 1.2])


def test_kl_estimators_by_hand():
    policy = torch.log(torch.tensor([[0.5, 0.25]]))
    reference = torch.log(torch.tensor([[0.25, 0.25]]))  # r = π_ref/π = [0.5, 1]
    assert compute_kl(policy, reference, "k2").tolist()[0] == pytest.approx([0.5 * math.log(2) ** 2, 0.0])
    assert compute_kl(policy, reference, "k3").tolist()[0] == pytest.approx([0.5 - 1 + math.log(2), 0.0])
    with pytest.raises(ValueError, match="kl_estimator must be one of k2, k3, k3_k2grad"):
        compute_kl(policy, reference, "k1")


def exact_kl_gradients(estimator: str) -> dict[str, torch.Tensor]:
    """Over a 6-token distribution π = softmax(θ): the estimator's expected gradient E_{a~π}[∇θ k(a)] (the token is
    sampled, the gradient flows through log π(a) only), enumerated exactly, and the two KL directions' gradients."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, generator=generator, dtype=torch.float64).requires_grad_()
    ref_log_probs = torch.log_softmax(torch.randn(6, generator=generator, dtype=torch.float64), dim=-1)
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    per_token = compute_kl(log_probs, ref_log_probs, estimator)  # [6]: the penalty if token a were sampled
    (expected,) = torch.autograd.grad((probs.detach() * per_token).sum(), logits, retain_graph=True)
    (forward,) = torch.autograd.grad((probs * (log_probs - ref_log_probs)).sum(), logits, retain_graph=True)
    (reverse,) = torch.autograd.grad((ref_log_probs.exp() * (ref_log_probs - log_probs)).sum(), logits)
    # forward = ∇ KL(π ‖ π_ref), reverse = ∇ KL(π_ref ‖ π)
    return {"expected": expected, "forward": forward, "reverse": reverse}


@pytest.mark.parametrize(("estimator", "direction"), [("k2", "forward"), ("k3", "reverse"), ("k3_k2grad", "forward")])
def test_kl_penalty_expected_gradient_is_the_documented_kl_gradient(estimator, direction):
    """k2's (and k3_k2grad's) expected gradient is ∇ KL(π ‖ π_ref), k3's ∇ KL(π_ref ‖ π) (what compute_kl's docstring
    says), exactly;
    k1 = -log r, the removed estimator, had expected gradient 0 (norm 0 here against ∇ KL's 0.3+)."""
    gradients = exact_kl_gradients(estimator)
    other = "reverse" if direction == "forward" else "forward"
    assert gradients[direction].norm() > 0.1
    assert torch.allclose(gradients["expected"], gradients[direction], atol=1e-12)
    assert not torch.allclose(gradients["expected"], gradients[other], atol=1e-3)


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_kl_penalty_adds_to_the_loss_and_its_gradient(estimator):
    """Per token: loss = -A·log π + β·k; d/dlogπ of k2 = ½(log r)² is -log r, of k3 it is 1 - r; masked mean per
    sequence. The logged KL is the k3 value whichever estimator trains."""
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    log_probs = torch.log(torch.tensor([[0.5, 0.25, 0.9]])).requires_grad_()
    reference = torch.log(torch.tensor([[0.25, 0.5, 0.9]]))  # r = [0.5, 2, 1]
    beta = 0.1
    loss, metadata = grpo_microbatch_train_step(
        log_probs, mask, 1, "reinforce_with_baseline", advantages=torch.tensor([[2.0]]),
        ref_log_probs=reference, kl_coef=beta, kl_estimator=estimator,
    )  # fmt: skip
    r = torch.tensor([0.5, 2.0])
    k3 = (r - 1) - torch.log(r)
    penalty = 0.5 * torch.log(r) ** 2 if estimator == "k2" else k3
    expected_loss = (-2.0 * log_probs.detach()[0, :2] + beta * penalty).mean()
    assert loss.item() == pytest.approx(expected_loss.item())
    assert metadata["kl"].item() == pytest.approx(k3.mean().item())
    dkl = -torch.log(r) if estimator == "k2" else 1 - r
    assert log_probs.grad[0, :2].tolist() == pytest.approx(((-2.0 + beta * dkl) / 2).tolist())
    assert log_probs.grad[0, 2].item() == 0.0


# ------------------------------------------------------------------------------------- truncated importance sampling
def test_rollout_importance_weights_and_metadata_by_hand():
    """w = min(exp(old − μ), cap) on the masked tokens, 0 elsewhere; the padding's huge or undefined gaps reach
    neither the weights nor the metadata."""
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -1.0, -4.0, 0.0]], requires_grad=True)
    behaviour = torch.tensor([[-2.0, -1.0, -0.5, float("-inf")], [-3.0, -1.5, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    # log π_old − log μ on the masked tokens: [1, -1, 0], [2.8, 0.5, -3]; e^1 and e^2.8 exceed the cap 2
    weights, metadata = rollout_importance_weights(old, behaviour, mask, cap=2.0)
    expected = torch.tensor([[2.0, math.exp(-1.0), 1.0, 0.0], [2.0, math.exp(0.5), math.exp(-3.0), 0.0]])
    assert torch.allclose(weights, expected)
    assert not weights.requires_grad  # a constant of the loss
    assert metadata["is_log_prob_gap_mean"].item() == pytest.approx((1 + 1 + 0 + 2.8 + 0.5 + 3) / 6)
    assert metadata["is_log_prob_gap_max"].item() == pytest.approx(3.0)  # not the padding's inf or 9
    assert metadata["is_weight_mean"].item() == pytest.approx(
        (2 + math.exp(-1) + 1 + 2 + math.exp(0.5) + math.exp(-3)) / 6
    )
    assert metadata["is_truncated_fraction"].item() == pytest.approx(2 / 6)
    assert sorted(metadata) == [
        "is_log_prob_gap_max",
        "is_log_prob_gap_mean",
        "is_truncated_fraction",
        "is_weight_mean",
    ]


def test_rollout_importance_weights_cannot_overflow():
    old, behaviour = torch.tensor([[0.0, 0.0]]), torch.tensor([[-1000.0, -0.5]])  # exp(1000) is inf in fp32
    weights, metadata = rollout_importance_weights(old, behaviour, torch.ones(1, 2, dtype=torch.bool), cap=3.0)
    assert weights.tolist()[0] == pytest.approx([3.0, math.exp(0.5)])
    assert all(torch.isfinite(value).all() for value in metadata.values())
    with pytest.raises(ValueError, match="cap must be ≥ 1"):
        rollout_importance_weights(old, behaviour, torch.ones(1, 2, dtype=torch.bool), cap=0.5)


def importance_batch():
    """Two sequences of 3 and 2 response tokens; ratios π/π_old = [1.5, 0.7, 1.05], [0.6, 1.3] (grpo_clip with ε 0.2
    clips the first row's 1.5 for A > 0 and the second row's 0.6 for A < 0)."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old = torch.log(torch.tensor([[0.2, 0.5, 0.4], [0.5, 0.3, 0.9]]))
    ratio = torch.tensor([[1.5, 0.7, 1.05], [0.6, 1.3, 1.0]])
    log_probs = (old + torch.log(ratio)).requires_grad_()
    advantages = torch.tensor([[1.5], [-0.8]])
    weights = torch.tensor([[2.0, 0.5, 1.2], [0.3, 1.7, 0.0]])
    return log_probs, old, ratio, advantages, weights, mask


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
@pytest.mark.parametrize("loss_type", ["reinforce_with_baseline", "grpo_clip", "grpo_no_clip"])
def test_importance_weights_scale_each_tokens_policy_gradient_not_the_kl(loss_type, kl_coef):
    """Hand-written loss per token: -w·A·log π (REINFORCE), -w·min(ρA, clip(ρ)A) (grpo_clip), -w·ρA (no clip), plus
    the unweighted k3 penalty β·((r − 1) − log r), r = π_ref/π; masked mean per sequence, batch mean, / accumulation.
    Its gradient in log π, by hand: -w·A, -w·ρA where the unclipped term is the smaller (else 0), -w·ρA; plus
    β(1 − r)."""
    log_probs, old, ratio, advantages, weights, mask = importance_batch()
    reference = old + 0.25  # r = e^0.25 / ratio
    accumulation = 2
    loss, _ = grpo_microbatch_train_step(
        log_probs, mask, accumulation, loss_type, advantages=advantages, old_log_probs=old, cliprange=0.2,
        ref_log_probs=reference, kl_coef=kl_coef, importance_weights=weights,
    )  # fmt: skip
    if loss_type == "reinforce_with_baseline":
        pg_grad = -advantages.expand(2, 3)
        pg_loss = -advantages * log_probs.detach()
    else:
        clipped = torch.clamp(ratio, 0.8, 1.2) * advantages
        kept = (ratio * advantages <= clipped) if loss_type == "grpo_clip" else torch.ones(2, 3, dtype=torch.bool)
        assert loss_type == "grpo_no_clip" or kept.tolist() == [[False, True, True], [False, True, True]]
        pg_grad = torch.where(kept, -ratio * advantages, 0.0)
        pg_loss = -torch.minimum(ratio * advantages, clipped) if loss_type == "grpo_clip" else -ratio * advantages
    r = torch.exp(reference - log_probs.detach())
    per_token_loss = weights * pg_loss + kl_coef * ((r - 1) - torch.log(r))
    per_token_grad = weights * pg_grad + kl_coef * (1 - r)
    lengths = mask.sum(dim=-1, keepdim=True)  # [3, 2]
    expected_loss = ((per_token_loss * mask).sum(dim=-1) / lengths.squeeze(-1)).mean() / accumulation
    expected_grad = per_token_grad * mask / lengths / 2 / accumulation  # batch of 2
    assert loss.item() == pytest.approx(expected_loss.item())
    assert torch.allclose(log_probs.grad, expected_grad, atol=1e-6)


def unweighted_reference(loss_type, log_probs, old, advantages, mask, accumulation, reference, kl_coef):
    """The loss as it was before importance weights, assembled from its parts; returns (loss, grad)."""
    leaf = log_probs.detach().clone().requires_grad_()
    per_token, _ = compute_policy_gradient_loss(
        leaf, loss_type, advantages=advantages, old_log_probs=old, cliprange=0.2
    )
    if kl_coef > 0:
        per_token = per_token + kl_coef * compute_kl(leaf, reference, "k3")
    loss = masked_mean(per_token, mask, dim=-1).mean() / accumulation
    loss.backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
@pytest.mark.parametrize("loss_type", ["reinforce_with_baseline", "grpo_clip"])
def test_no_importance_weights_is_bit_for_bit_the_unweighted_loss_and_all_ones_match_it(loss_type, kl_coef):
    log_probs, old, _, advantages, _, mask = importance_batch()
    reference = old + 0.25
    common = {"advantages": advantages, "old_log_probs": old, "cliprange": 0.2, "ref_log_probs": reference}
    expected_loss, expected_grad = unweighted_reference(
        loss_type, log_probs, old, advantages, mask, 2, reference, kl_coef
    )
    results = {}
    for name, weights in (("absent", ...), ("none", None), ("ones", torch.ones(2, 3))):
        leaf = log_probs.detach().clone().requires_grad_()
        extra = {} if weights is ... else {"importance_weights": weights}
        loss, _ = grpo_microbatch_train_step(leaf, mask, 2, loss_type, kl_coef=kl_coef, **common, **extra)
        results[name] = (loss, leaf.grad)
    for name in ("absent", "none"):
        assert torch.equal(results[name][0], expected_loss), name
        assert torch.equal(results[name][1], expected_grad), name
    assert torch.allclose(results["ones"][0], expected_loss)
    assert torch.allclose(results["ones"][1], expected_grad)

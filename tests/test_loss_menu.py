"""The loss menu of issue 32, each option against a hand computation on small tensors (value and gradient) that
follows its peer's definition (verl's ``core_algos``, TRL's ``GRPOTrainer``), and token_mean's split-invariance
across microbatches and across two gloo ranks."""

import math
import time

import pytest
import torch
from loss_menu_worker import CONFIG as TWO_RANK_CONFIG
from loss_menu_worker import RANK_ROWS, uneven_batch

from reasonrl.config import ConfigError, GRPOConfig, from_dict, load_params
from reasonrl.distributed import SINGLE
from reasonrl.grpo import (
    FixedLogProbs,
    Forwards,
    accumulate_gradients,
    compute_old_log_probs,
    fixed_log_probs,
    has_learning_signal,
)
from reasonrl.logprobs import compute_entropy
from reasonrl.losses import (
    aggregate_loss,
    compute_kl,
    compute_policy_gradient_loss,
    grpo_microbatch_train_step,
    kl_value,
    masked_mean,
    rollout_importance_weights,
)
from reasonrl.training.policy import load_policy
from tests.test_distributed import run_two_ranks
from tests.test_grpo import fixed_batch, train_step

HANDOUT_MASK = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.float32)


def full_logits_scores(model, batch):
    """log π(label) and the entropy at every position, from the full logits (the reference the tests compare with)."""
    logits = model(batch.input_ids).logits  # [N, L, V]
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)
    return log_probs, compute_entropy(logits)


def gradients_of(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    return grads


def assert_same_gradients(model, expected, atol=1e-6):
    for name, parameter in model.named_parameters():
        assert torch.allclose(parameter.grad, expected[name], atol=atol, rtol=1e-4), name


# ------------------------------------------------------------------------------------------------ loss_aggregation
def test_token_mean_by_hand_is_verls_token_mean():
    """verl's ``agg_loss(token-mean)``: masked sum over the global token count (× dp_size, which DDP's average undoes).
    Rows of 4 and 7 tokens, -A·log π with log π = -0.5: (4·1 + 7·(-0.5)) / 11; d/dlog π = -A / 11 per token."""
    log_probs = torch.full((2, 7), -0.5, requires_grad=True)
    advantages = torch.tensor([[2.0], [-1.0]])
    loss, _ = grpo_microbatch_train_step(
        log_probs, HANDOUT_MASK, 1, "reinforce_with_baseline", advantages=advantages, loss_aggregation="token_mean"
    )
    assert loss.item() == pytest.approx((4 * 1.0 + 7 * -0.5) / 11)
    assert torch.allclose(log_probs.grad, -advantages * HANDOUT_MASK / 11)
    # The step's token count when this batch is part of a larger step: 22 tokens, half the weight per token.
    per_token = -advantages * log_probs.detach()
    assert aggregate_loss(per_token, HANDOUT_MASK, "token_mean", 22).item() == pytest.approx(0.5 / 22)
    # sequence_mean weighs the short row's tokens 7/4 times as much: a different gradient.
    assert aggregate_loss(per_token, HANDOUT_MASK, "sequence_mean").item() == pytest.approx((1.0 - 0.5) / 2)


def test_token_mean_microbatches_add_up_to_the_full_batch():
    """Microbatches passing the step's token count as ``normalize_constant`` give the full batch's loss and
    gradient (to 1e-6), however the rows are split."""
    generator = torch.Generator().manual_seed(0)
    mask = (torch.rand(6, 5, generator=generator) > 0.3).float()
    mask[:, 0] = 1.0
    log_probs = (-torch.rand(6, 5, generator=generator)).requires_grad_()
    old = log_probs.detach() + 0.3 * torch.randn(6, 5, generator=generator)
    advantages = torch.randn(6, 1, generator=generator)
    common = {"advantages": advantages, "cliprange": 0.2, "loss_aggregation": "token_mean"}
    full, _ = grpo_microbatch_train_step(log_probs, mask, 1, "grpo_clip", old_log_probs=old, **common)
    full_grad = log_probs.grad.clone()
    log_probs.grad = None
    total, tokens = 0.0, mask.sum().item()
    for part in ([0, 1], [2, 3, 4], [5]):
        loss, _ = grpo_microbatch_train_step(
            log_probs[part], mask[part], 1, "grpo_clip", old_log_probs=old[part], normalize_constant=tokens,
            **common | {"advantages": advantages[part]},
        )  # fmt: skip
        total += loss.item()
    assert total == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(log_probs.grad, full_grad, atol=1e-6)


def token_mean_by_hand(model, batch, rows, entropy_coef=0.0):
    """The token_mean step written out: every trained token's -A·log π (- c·H) over the rows' token count."""
    log_probs, entropy = full_logits_scores(model, batch)
    mask = batch.response_mask.float()
    per_token = -batch.advantages.unsqueeze(-1) * log_probs - entropy_coef * entropy
    loss = (per_token * mask)[rows].sum() / mask[rows].sum()
    return loss.item(), gradients_of(model, loss)


@pytest.mark.parametrize(
    ("gradient_accumulation_steps", "microbatch_tokens", "mask_truncated"),
    [(1, None, False), (4, None, False), (1, 8, False), (2, None, True)],
)
def test_token_mean_step_is_the_steps_token_mean_whatever_the_split(
    tiny_model, gradient_accumulation_steps, microbatch_tokens, mask_truncated
):
    """Through ``accumulate_gradients``: the mean over the step's response tokens (fp32, to 1e-6); with
    ``mask_truncated`` over the kept rows' tokens."""
    batch = fixed_batch(advantages=[1.5, -0.5, 0.7, -1.0], raw_rewards=[1.0, 0.0, 1.0, 0.0])
    batch.truncated = torch.tensor([False, mask_truncated, False, False])
    config = GRPOConfig(
        rollout_batch_size=4, group_size=2, train_batch_size=4, loss_aggregation="token_mean",
        gradient_accumulation_steps=gradient_accumulation_steps, microbatch_tokens=microbatch_tokens,
        mask_truncated=mask_truncated,
    )  # fmt: skip
    kept = [row for row in range(4) if not batch.truncated[row]]
    expected_loss, expected = token_mean_by_hand(tiny_model, batch, kept)
    metrics = train_step(tiny_model, batch, config)
    assert metrics["train/loss"] == pytest.approx(expected_loss, abs=1e-6)
    assert_same_gradients(tiny_model, expected)
    tiny_model.zero_grad()


def test_token_mean_over_two_gloo_ranks_is_the_full_batchs(tiny_model_dir, tmp_path):
    """Two DDP ranks of 6 and 22 response tokens, in 2 and 4 microbatches, with an entropy bonus: every rank holds
    the gradient of one process on the whole step, to 1e-6, and the step's token mean (not the mean of the ranks')."""
    started = time.perf_counter()
    ranks = run_two_ranks("loss_menu_worker.py", tmp_path, tiny_model_dir, tmp_path)
    print(f"two ranks: {time.perf_counter() - started:.1f} s")
    assert ranks[0]["microbatches"] != ranks[1]["microbatches"]
    policy, _ = load_policy(tiny_model_dir, torch.device("cpu"))
    batch, config = uneven_batch(), TWO_RANK_CONFIG
    rows = RANK_ROWS[0] + RANK_ROWS[1]
    single = accumulate_gradients(
        policy, batch, rows, FixedLogProbs(), config.loss, Forwards.training(config), config.sampling.max_tokens
    )
    one_process = {name: p.grad.clone() for name, p in policy.named_parameters()}
    expected_loss, by_hand = token_mean_by_hand(policy, batch, rows, config.loss.entropy_coef)
    assert single["train/loss"] == pytest.approx(expected_loss, abs=1e-6)
    for rank in ranks:
        assert rank["metrics"]["train/loss"] == pytest.approx(expected_loss, abs=1e-6)
        assert rank["metrics"]["train/entropy"] == pytest.approx(single["train/entropy"], abs=1e-6)
        for name, grad in one_process.items():
            assert (rank["gradients"][name] - grad).abs().max().item() < 1e-6, name
            assert torch.allclose(grad, by_hand[name], atol=1e-6, rtol=1e-4), name
    # The ranks' own token means, averaged, weigh rank 0's 6 tokens like rank 1's 22: not the step's mean.
    mask = batch.response_mask.float()
    with torch.no_grad():
        log_probs, entropy = full_logits_scores(policy, batch)
        per_token = (-batch.advantages.unsqueeze(-1) * log_probs - config.loss.entropy_coef * entropy) * mask
    means = [per_token[part].sum() / mask[part].sum() for part in RANK_ROWS]
    assert abs((means[0] + means[1]).item() / 2 - expected_loss) > 1e-3


def test_length_normalization_is_refused_naming_its_replacement(params_file):
    with pytest.raises(ConfigError) as refused:
        from_dict(GRPOConfig, {"length_normalization": "masked_normalize"}, "grpo")
    message = str(refused.value)
    assert message == (
        "grpo.length_normalization: replaced by grpo.loss_aggregation (masked_mean → sequence_mean, masked_normalize "
        "→ constant_normalizer); write grpo.loss_aggregation: constant_normalizer"
    )
    params_file.write_text(params_file.read_text().replace("loss_aggregation:", "length_normalization:"))
    with pytest.raises(ConfigError, match=r": grpo.length_normalization: replaced by grpo.loss_aggregation \("):
        load_params(params_file)


def test_the_default_loss_is_the_handouts_bit_for_bit():
    """Defaults (sequence_mean, no dual clip, no entropy bonus): the same float ops as before the menu."""
    generator = torch.Generator().manual_seed(3)
    log_probs = (-torch.rand(2, 7, generator=generator)).requires_grad_()
    advantages = torch.randn(2, 1, generator=generator)
    loss, _ = grpo_microbatch_train_step(log_probs, HANDOUT_MASK, 2, "reinforce_with_baseline", advantages=advantages)
    reference = log_probs.detach().clone().requires_grad_()
    expected = masked_mean(-advantages * reference, HANDOUT_MASK, dim=-1).mean() / 2
    expected.backward()
    assert torch.equal(loss, expected.detach()) and torch.equal(log_probs.grad, reference.grad)


# ---------------------------------------------------------------------------------------------------- loss types
def gspo_example():
    """Three responses (2, 3 and 4 tokens; padding holds junk) with log π - log π_old chosen per token: sequence
    means -0.1 (s = e^-0.1 ≈ 0.905, inside [0.8, 1.2]), 0.4 (s ≈ 1.49, A > 0: clipped at 1.2) and -0.3 (s ≈ 0.741,
    A < 0: clipped at 0.8)."""
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float32)
    deltas = torch.tensor([[0.1, -0.3, 7.0, -9.0], [0.5, 0.3, 0.4, 5.0], [-0.5, -0.3, -0.2, -0.2]])
    old = torch.full((3, 4), -1.0)
    log_probs = (old + deltas).requires_grad_()
    advantages = torch.tensor([[1.0], [2.0], [-1.0]])
    return log_probs, old, mask, advantages


@pytest.mark.parametrize("loss_type", ["gspo", "gspo_token"])
def test_gspo_by_hand_is_trls_sequence_level_ratio(loss_type):
    """TRL's ``importance_sampling_level="sequence"`` (verl's ``compute_policy_loss_gspo`` for gspo_token): s_i =
    exp(masked mean of the log-ratio), -min(s·A, clip(s, 0.8, 1.2)·A) on every token of the sequence. Per sequence
    (sequence_mean): -A·s, gradient -A·s/|y| per token (÷ 3 sequences) where unclipped, 0 where clipped."""
    log_probs, old, mask, advantages = gspo_example()
    loss, metadata = grpo_microbatch_train_step(
        log_probs, mask, 1, loss_type, advantages=advantages, old_log_probs=old, cliprange=0.2
    )
    s0 = math.exp(-0.1)
    assert loss.item() == pytest.approx((-s0 - 2 * 1.2 + 0.8) / 3, abs=1e-6)
    expected_grad = torch.zeros(3, 4)
    expected_grad[0, :2] = -1.0 * s0 / 2 / 3
    assert torch.allclose(log_probs.grad, expected_grad, atol=1e-7)
    assert metadata["clipped_high"][:, 0].tolist() == [False, True, False]
    assert metadata["clipped_low"][:, 0].tolist() == [False, False, True]
    assert metadata["clip_fraction"].item() == pytest.approx(7 / 9)  # rows 1 and 2: 3 + 4 of 9 response tokens


@pytest.mark.parametrize("loss_aggregation", ["sequence_mean", "constant_normalizer", "token_mean"])
def test_gspo_token_equals_gspo_with_one_advantage_per_sequence(loss_aggregation):
    """verl's GSPO-token ratio sg[s_i]·π_t/sg[π_t]: the same value and, with one advantage per sequence, the same
    gradient as GSPO's sequence ratio, whatever the aggregation; per token before aggregation it is -A·s_i."""
    results = {}
    for loss_type in ("gspo", "gspo_token"):
        log_probs, old, mask, advantages = gspo_example()
        loss, _ = grpo_microbatch_train_step(
            log_probs, mask, 1, loss_type, advantages=advantages, old_log_probs=old, cliprange=0.2,
            loss_aggregation=loss_aggregation, normalize_constant=4,
        )  # fmt: skip
        results[loss_type] = loss.item(), log_probs.grad
    assert results["gspo"][0] == pytest.approx(results["gspo_token"][0], abs=1e-7)
    assert torch.allclose(results["gspo"][1], results["gspo_token"][1], atol=1e-7)
    log_probs, old, mask, advantages = gspo_example()
    per_token, _ = compute_policy_gradient_loss(
        log_probs, "gspo_token", advantages=advantages, old_log_probs=old, cliprange=0.2, response_mask=mask
    )
    (per_token * mask).sum().backward()
    assert log_probs.grad[0].tolist() == pytest.approx([-math.exp(-0.1)] * 2 + [0.0, 0.0])


@pytest.mark.parametrize("loss_type", ["gspo", "cispo"])
def test_the_loops_step_takes_the_new_loss_types(tiny_model, loss_type):
    """Through ``accumulate_gradients`` (microbatches of one row): the loss written out on full logits, GSPO's sequence
    ratio over each row's own response tokens, CISPO's detached capped weight."""
    batch = fixed_batch(advantages=[1.0, -1.0, 2.0, -2.0], raw_rewards=[1.0, 0.0, 1.0, 0.0])
    config = GRPOConfig(
        rollout_batch_size=8, group_size=2, train_batch_size=4, gradient_accumulation_steps=4, loss_type=loss_type
    )
    old = compute_old_log_probs(tiny_model, batch, Forwards.fixed(config))
    old = old + torch.tensor([[-0.05], [0.3], [0.02], [-0.4]]) * batch.response_mask
    log_probs, _ = full_logits_scores(tiny_model, batch)
    mask, advantages = batch.response_mask.float(), batch.advantages.unsqueeze(-1)
    if loss_type == "gspo":
        ratio = (((log_probs - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).exp()
        per_token = -torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).expand_as(mask)
    else:
        per_token = -(log_probs - old).exp().clamp(max=1.2).detach() * advantages * log_probs
    expected_loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    expected = gradients_of(tiny_model, expected_loss)
    metrics = train_step(tiny_model, batch, config, old)
    assert metrics["train/loss"] == pytest.approx(expected_loss.item(), abs=1e-5)  # terms of |log π| ≈ 5.7 cancel
    assert_same_gradients(tiny_model, expected)
    tiny_model.zero_grad()


def test_cispo_by_hand():
    """-sg[min(ρ, 1+ε_high)]·A·log π (MiniMax-M1; TRL's ``cispo`` with ``epsilon_high`` 1.28): ρ = [0.5, 0.9, 1.5,
    3.0] against π_old = 1, A = 2, ε_high = 0.28; the gradient -w·A keeps flowing through the clipped tokens. No
    lower bound (the paper's; verl's ``compute_policy_loss_cispo`` would lift ρ = 0.5 to 1 - ε = 0.8)."""
    ratios = torch.tensor([[0.5, 0.9, 1.5, 3.0]])
    log_probs = ratios.log().requires_grad_()
    loss, metadata = compute_policy_gradient_loss(
        log_probs, "cispo", advantages=torch.tensor([[2.0]]), old_log_probs=torch.zeros(1, 4), cliprange=0.2,
        cliprange_high=0.28,
    )  # fmt: skip
    weights = torch.tensor([[0.5, 0.9, 1.28, 1.28]])
    assert torch.allclose(loss, -weights * 2.0 * ratios.log())
    loss.sum().backward()
    assert torch.allclose(log_probs.grad, -2.0 * weights)
    assert metadata["clipped"].tolist() == [[False, False, True, True]]
    symmetric, _ = compute_policy_gradient_loss(
        log_probs, "cispo", advantages=torch.tensor([[2.0]]), old_log_probs=torch.zeros(1, 4), cliprange=0.2
    )
    assert torch.allclose(symmetric, -torch.tensor([[0.5, 0.9, 1.2, 1.2]]) * 2.0 * ratios.log())


def verl_dual_clip(ratio, advantages, low, high, clip_ratio_c):
    """verl's ``compute_policy_loss_vanilla`` per token, its definition (the ratio's ±20 clamp aside)."""
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * ratio.clamp(1 - low, 1 + high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.minimum(-advantages * clip_ratio_c, clip_pg_losses1)
    return torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)


def test_dual_clip_by_hand_and_against_verls_vanilla_loss():
    """A = -1, ρ = [0.5, 1, 2, 4], c = 3: the clip gives [0.8, 1, 2, 4]; dual-clip caps it at -c·A = 3, where the
    token's gradient is 0 (d/dlog π of ρ is ρ: [0, 1, 2, 0]); A > 0 is untouched. Random tensors: verl's loss."""
    ratios = torch.tensor([[0.5, 1.0, 2.0, 4.0], [0.5, 1.0, 2.0, 4.0]])
    log_probs = ratios.log().requires_grad_()
    advantages = torch.tensor([[-1.0], [1.0]])
    loss, metadata = compute_policy_gradient_loss(
        log_probs, "grpo_clip", advantages=advantages, old_log_probs=torch.zeros(2, 4), cliprange=0.2, dual_clip=3.0
    )
    assert loss.tolist() == [pytest.approx([0.8, 1.0, 2.0, 3.0]), pytest.approx([-0.5, -1.0, -1.2, -1.2])]
    loss[0].sum().backward()
    assert log_probs.grad[0].tolist() == pytest.approx([0.0, 1.0, 2.0, 0.0])
    assert metadata["clipped_dual"].tolist() == [[False, False, False, True], [False] * 4]

    generator = torch.Generator().manual_seed(1)
    log_ratio = 1.5 * torch.randn(8, 6, generator=generator)
    advantages = torch.randn(8, 1, generator=generator)
    ours, _ = compute_policy_gradient_loss(
        log_ratio, "grpo_clip", advantages=advantages, old_log_probs=torch.zeros(8, 6), cliprange=0.2,
        cliprange_high=0.28, dual_clip=3.0,
    )  # fmt: skip
    assert torch.allclose(ours, verl_dual_clip(log_ratio.exp(), advantages, 0.2, 0.28, 3.0), atol=1e-6)


# ------------------------------------------------------------------------------------------------------ entropy
def test_entropy_bonus_by_hand():
    """-A·log π - c·H per token, reduced like the rest: over 2 tokens, d/dH = -c/2 on them, 0 on the padding."""
    log_probs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    entropy = torch.tensor([[1.0, 2.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = grpo_microbatch_train_step(
        log_probs, mask, 1, "reinforce_with_baseline", advantages=torch.tensor([[1.0]]), entropy_coef=0.1,
        token_entropy=entropy,
    )  # fmt: skip
    assert loss.item() == pytest.approx(((1.0 - 0.1) + (2.0 - 0.2)) / 2)
    assert entropy.grad.tolist() == [pytest.approx([-0.05, -0.05, 0.0])]
    assert log_probs.grad.tolist() == [pytest.approx([-0.5, -0.5, 0.0])]
    with pytest.raises(ValueError, match="entropy_coef > 0 needs token_entropy with its gradient"):
        grpo_microbatch_train_step(
            log_probs, mask, 1, "no_baseline", raw_rewards=torch.ones(1, 1), entropy_coef=0.1,
            token_entropy=entropy.detach(),
        )  # fmt: skip


def test_entropy_bonus_step_equals_hand_computed_and_gives_signal_without_advantages(tiny_model):
    """Through the loop's step: -A·log π - c·H with H from the same forward, per sequence then over the step;
    ``train/entropy`` is the mean entropy of the trained tokens. A step of zero advantages still has a gradient."""
    batch = fixed_batch(advantages=[1.5, -0.5, 0.0, -1.0], raw_rewards=[1.0, 0.0, 0.0, 0.0])
    config = GRPOConfig(
        rollout_batch_size=4, group_size=2, train_batch_size=4, gradient_accumulation_steps=2, entropy_coef=0.05
    )
    log_probs, entropy = full_logits_scores(tiny_model, batch)
    mask = batch.response_mask.float()
    per_token = -batch.advantages.unsqueeze(-1) * log_probs - 0.05 * entropy
    expected_loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    expected_entropy = masked_mean(entropy.detach(), mask).item()
    expected = gradients_of(tiny_model, expected_loss)
    metrics = train_step(tiny_model, batch, config)
    assert metrics["train/loss"] == pytest.approx(expected_loss.item(), abs=1e-6)
    assert metrics["train/entropy"] == pytest.approx(expected_entropy, rel=1e-6)
    assert_same_gradients(tiny_model, expected)
    tiny_model.zero_grad()
    no_advantage = fixed_batch(advantages=[0.0] * 4, raw_rewards=[0.0] * 4)
    assert has_learning_signal(no_advantage, [0, 1, 2, 3], config.loss)
    assert not has_learning_signal(no_advantage, [0, 1, 2, 3], GRPOConfig().loss)


# ----------------------------------------------------------------------------------------------------------- KL
def verl_k3(log_probs, ref_log_probs):
    """verl's ``kl_penalty_forward(..., "low_var_kl")``: log r clamped to ±20, exp(kl) - kl - 1 clamped to ±10."""
    kl = (ref_log_probs - log_probs).clamp(min=-20, max=20)
    return (kl.exp() - kl - 1).clamp(min=-10, max=10)


def test_k3_clamps_by_hand_and_as_verls():
    """log r = [25, -25, 0.5, -0.5, 2.7]: the first two hit ±20 and then k3's 10, the last k3's 10 alone (e^2.7 -
    3.7 ≈ 11.2); a bound holds the penalty constant (no gradient), elsewhere d/dlog π = 1 - r."""
    log_r = torch.tensor([[25.0, -25.0, 0.5, -0.5, 2.7]])
    log_probs = torch.zeros(1, 5, requires_grad=True)
    k3 = compute_kl(log_probs, log_r, "k3")
    expected = [10.0, 10.0, math.exp(0.5) - 1.5, math.exp(-0.5) - 0.5, 10.0]
    assert k3.tolist()[0] == pytest.approx(expected)
    assert torch.allclose(k3, verl_k3(log_probs.detach(), log_r), atol=1e-6)
    k3.sum().backward()
    assert log_probs.grad.tolist()[0] == pytest.approx([0.0, 0.0, 1 - math.exp(0.5), 1 - math.exp(-0.5), 0.0])


def test_k3_inside_its_bounds_is_the_unclamped_k3_bit_for_bit():
    """Where |log r| < 20 and k3 < 10 (log r in [-5, 2.5] here), value and gradient are those of the unclamped
    formula exactly: a kl_coef > 0 run that never reaches a bound trains as before the clamps."""
    generator = torch.Generator().manual_seed(2)
    reference = -3 * torch.rand(4, 9, generator=generator)
    log_probs = (reference + (7.5 * torch.rand(4, 9, generator=generator) - 2.5)).requires_grad_()  # log r: -5..2.5
    unclamped_inputs = log_probs.detach().clone().requires_grad_()
    clamped, unclamped = compute_kl(log_probs, reference, "k3"), kl_value(unclamped_inputs, reference)
    assert torch.equal(clamped, unclamped)
    clamped.sum().backward()
    unclamped.sum().backward()
    assert torch.equal(log_probs.grad, unclamped_inputs.grad)


def test_k3_k2grad_has_k3s_value_and_k2s_gradient():
    """verl's ``k3+``: k2 - sg(k2) + sg(k3). The value is k3's exactly (clamped too), the gradient log π - log π_ref,
    k2's, even where k3 is clamped."""
    log_r = torch.tensor([[0.5, -0.5, 2.7, -25.0]])
    log_probs = torch.zeros(1, 4, requires_grad=True)
    value = compute_kl(log_probs, log_r, "k3_k2grad")
    assert torch.equal(value, compute_kl(log_probs, log_r, "k3").detach())
    value.sum().backward()
    assert log_probs.grad.tolist()[0] == pytest.approx((-log_r[0]).tolist())


# ----------------------------------------------------------------------------------------- rollout importance
def rollout_example():
    """Two responses of 2 and 3 tokens; π_old/μ per token e^[0.3, 0.4] and e^[-0.5, 0.2, 0.1]; padding holds -inf."""
    behaviour = torch.tensor([[-1.0, -1.0, float("-inf")], [-1.0, -1.0, -1.0]])
    old = torch.tensor([[-0.7, -0.6, 0.0], [-1.5, -0.8, -0.9]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    return old, behaviour, mask


def test_sequence_level_truncated_weights_by_hand():
    """Row sums 0.7 and -0.2: w = min(e^0.7 ≈ 2.01, 2) = 2 on both tokens of the first, e^-0.2 on the second's
    three; the first's 2 of 5 tokens are truncated."""
    weights, metadata = rollout_importance_weights(*rollout_example(), cap=2.0, level="sequence")
    assert weights.tolist() == [pytest.approx([2.0, 2.0, 0.0]), pytest.approx([math.exp(-0.2)] * 3)]
    assert metadata["is_truncated_fraction"].item() == pytest.approx(2 / 5)
    assert metadata["is_weight_mean"].item() == pytest.approx((4 + 3 * math.exp(-0.2)) / 5)


def test_masked_weights_by_hand():
    """IcePop: w inside [lower, cap] kept as it is, 0 outside. Token level, cap 1.4, lower 1/1.4: e^0.4 ≈ 1.49 and
    e^-0.5 ≈ 0.61 are masked; sequence level, lower 0.9: the second response (e^-0.2 ≈ 0.82) is masked whole."""
    weights, metadata = rollout_importance_weights(*rollout_example(), cap=1.4, mode="mask")
    expected = [[math.exp(0.3), 0.0, 0.0], [0.0, math.exp(0.2), math.exp(0.1)]]
    assert weights.tolist() == [pytest.approx(row) for row in expected]
    assert metadata["is_masked_fraction"].item() == pytest.approx(2 / 5)
    assert "is_truncated_fraction" not in metadata
    weights, metadata = rollout_importance_weights(
        *rollout_example(), cap=2.5, level="sequence", mode="mask", lower=0.9
    )
    assert weights.tolist() == [pytest.approx([math.exp(0.7)] * 2 + [0.0]), [0.0] * 3]
    assert metadata["is_masked_fraction"].item() == pytest.approx(3 / 5)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_rollout_weights_are_trls_on_random_tensors(level, mode):
    """TRL's ``vllm_importance_sampling_mode`` {token,sequence}_{truncate,mask} (clip_max = cap, clip_min = 1/cap for
    mask, none for truncate), on the response tokens."""
    generator = torch.Generator().manual_seed(4)
    behaviour = -torch.rand(5, 6, generator=generator) * 3
    old = behaviour + 0.4 * torch.randn(5, 6, generator=generator)
    mask = torch.rand(5, 6, generator=generator) > 0.25
    mask[:, 0] = True
    ours, _ = rollout_importance_weights(old, behaviour, mask, cap=1.5, level=level, mode=mode)
    difference = (old - behaviour) * mask
    ratio = torch.exp(difference.sum(-1, keepdim=True) if level == "sequence" else difference)
    if mode == "truncate":
        trl = ratio.clamp(max=1.5)
    else:
        trl = ratio.masked_fill((ratio < 1 / 1.5) | (ratio > 1.5), 0.0)
    trl = trl.expand_as(old)
    assert torch.allclose(ours[mask], trl[mask], rtol=1e-6, atol=1e-7)
    assert (ours[~mask] == 0).all()
    if mode == "mask":
        assert 0 < (ours[mask] == 0).float().mean() < 1  # the band masks some, not all


def test_the_loop_takes_the_level_and_mode_from_the_params(tiny_model):
    """``fixed_log_probs`` under rollout_is_level sequence, mode mask: whole responses masked, the fraction logged.
    (Two epochs: the separate pass computes π_old; from the training forward, test_grpo.py.)"""
    batch = fixed_batch(advantages=[1.0, -1.0, 0.5, -0.5], raw_rewards=[1.0, 0.0, 1.0, 0.0])
    config = GRPOConfig(
        rollout_batch_size=4, group_size=2, train_batch_size=4, gradient_accumulation_steps=1, rollout_is_cap=2.0,
        rollout_is_level="sequence", rollout_is_mode="mask", epochs_per_rollout_batch=2, loss_type="grpo_clip",
        cliprange=0.2,
    )  # fmt: skip
    old = compute_old_log_probs(tiny_model, batch, Forwards.fixed(config))
    batch.engine_log_probs = old - torch.tensor([[0.0], [1.0], [0.0], [0.0]]) * batch.response_mask  # row 1: e^2+
    fixed, figures = fixed_log_probs(tiny_model, batch, None, config, SINGLE)
    kept = [True, False, True, True]
    mask = batch.response_mask
    assert [(fixed.importance_weights[row][mask[row]] > 0).all().item() for row in range(4)] == kept
    assert figures["train/is_masked_fraction"] == pytest.approx(mask[1].sum().item() / mask.sum().item())


# --------------------------------------------------------------------------------------------------------- params
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dual_clip": 1.0}, r"grpo.dual_clip: must be a ratio bound > 1 or null \(off\), got 1.0"),
        ({"dual_clip": 3.0, "loss_type": "gspo"}, r"grpo.dual_clip: only grpo_clip has a dual clip; .*\(it is gspo\)"),
        ({"entropy_coef": -0.01}, r"grpo.entropy_coef: must be ≥ 0"),
        ({"loss_aggregation": "token-mean"}, r"grpo.loss_aggregation: must be one of \['sequence_mean', "),
        ({"rollout_is_level": "sequence"}, r"grpo.rollout_is_level: \(sequence\) shapes .* grpo.rollout_is_cap"),
        ({"rollout_is_cap": 2.0, "rollout_is_lower": 0.5}, r"grpo.rollout_is_lower: .* \(it is truncate\)"),
        (
            {"rollout_is_cap": 2.0, "rollout_is_mode": "mask", "rollout_is_lower": 0.0},
            r"grpo.rollout_is_lower: must be null, or in \(0, 1\]",
        ),
        ({"kl_estimator": "k3+"}, r"grpo.kl_estimator: must be one of \['k2', 'k3', 'k3_k2grad'\]"),
    ],
)
def test_menu_params_are_validated_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(GRPOConfig, overrides, "grpo")


def test_menu_params_load():
    config = from_dict(
        GRPOConfig,
        {
            "loss_type": "cispo", "cliprange_high": 4.0, "loss_aggregation": "token_mean", "entropy_coef": 0.001,
            "kl_coef": 0.01, "kl_estimator": "k3_k2grad", "rollout_is_cap": 3.0, "rollout_is_level": "sequence",
            "rollout_is_mode": "mask", "rollout_is_lower": 0.5, "epochs_per_rollout_batch": 2,
        },
        "grpo",
    )  # fmt: skip
    assert (config.loss.loss_type, config.asynchrony.rollout_is_lower) == ("cispo", 0.5)
    assert from_dict(GRPOConfig, {"loss_type": "grpo_clip", "dual_clip": 3}, "grpo").loss.dual_clip == 3.0

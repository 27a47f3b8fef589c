"""GRPO options mean what they say: the KL reference, steps without signal, steps short of a train batch, and
off-policy configurations without an importance ratio. (Dr. GRPO's constant under overlong filtering: test_grpo.py.)"""

import copy

import pytest
import torch

from reasonrl.config import ConfigError, GRPOConfig
from reasonrl.grpo import KLReference, NonFiniteGuard, has_learning_signal, optimizer_step
from reasonrl.losses import compute_kl
from tests.test_grpo import fixed_batch

SMALL = {"rollout_batch_size": 4, "group_size": 2, "train_batch_size": 4, "gradient_accumulation_steps": 1}


def test_kl_reference_is_the_policy_as_loaded_in_its_own_dtype(tiny_model):
    """A bf16 reference beside an fp32 ``mixed`` policy gave a KL of up to 0.28 nat per token before any update.
    The reference copies the policy, whatever its dtype: the penalty at step 0 is exactly 0."""
    batch = fixed_batch(advantages=[1.0, -1.0, 0.5, -0.5], raw_rewards=[1.0, 0.0, 1.0, 0.0])
    config = GRPOConfig(**SMALL, kl_coef=0.1)
    assert KLReference.of(tiny_model, GRPOConfig(**SMALL).loss, 0) is None
    for dtype in (torch.float32, torch.bfloat16):
        policy = copy.deepcopy(tiny_model).to(dtype)
        reference = KLReference.of(policy, config.loss, config.lora.lora_rank).frozen
        assert reference is not policy and not any(p.requires_grad for p in reference.parameters())
        assert all(p.dtype == dtype for p in reference.parameters())
        with torch.no_grad():
            log_probs = torch.log_softmax(policy(batch.input_ids).logits.float(), dim=-1)
            ref_log_probs = torch.log_softmax(reference(batch.input_ids).logits.float(), dim=-1)
        kl = compute_kl(log_probs, ref_log_probs, "k3")
        assert kl[batch.response_mask.unsqueeze(-1).expand_as(kl)].abs().max().item() == 0.0
        with torch.no_grad():
            next(policy.parameters()).add_(1.0)  # training the policy leaves the reference where it started
        assert not torch.equal(next(policy.parameters()), next(reference.parameters()))
    lora = GRPOConfig(**SMALL, kl_coef=0.1, lora_rank=4)
    assert KLReference.of(tiny_model, lora.loss, lora.lora.lora_rank).frozen is None  # the policy, adapters off


def test_a_step_without_signal_is_recognised():
    """All-zero loss weights give a zero gradient, which AdamW's momentum would still turn into an update."""
    config = GRPOConfig(**SMALL)
    zero = fixed_batch(advantages=[0.0] * 4, raw_rewards=[1.0] * 4)
    assert not has_learning_signal(zero, [0, 1, 2, 3], config.loss)
    no_baseline = GRPOConfig(**{**config.__dict__, "loss_type": "no_baseline"}).loss
    assert has_learning_signal(zero, [0, 1, 2, 3], no_baseline)  # its weight is the raw reward
    assert not has_learning_signal(fixed_batch([1.0] * 4, [0.0] * 4), [0, 1, 2, 3], no_baseline)
    assert has_learning_signal(zero, [0, 1], GRPOConfig(**{**config.__dict__, "kl_coef": 0.1}).loss)  # KL still pulls
    some = fixed_batch(advantages=[0.0, 0.0, 1.0, -1.0], raw_rewards=[0.0] * 4)
    assert has_learning_signal(some, [0, 1, 2, 3], config.loss) and not has_learning_signal(some, [0, 1], config.loss)
    some.truncated = torch.tensor([False, False, True, True])
    masked = GRPOConfig(**{**config.__dict__, "mask_truncated": True}).loss
    assert not has_learning_signal(some, [0, 1, 2, 3], masked)  # the rows with signal get no loss
    assert has_learning_signal(fixed_batch([float("nan")] * 4, [0.0] * 4), [0, 1], config.loss)  # for the NaN guard


def test_zero_gradient_still_moves_adamw_weights():
    """Why a step without signal is skipped rather than taken: after one real step, AdamW moves the weights on a
    zero gradient (momentum), by about the learning rate."""
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight], lr=0.1, weight_decay=0.0)
    weight.grad = torch.ones(3)
    optimizer.step()
    before = weight.detach().clone()
    weight.grad = torch.zeros(3)
    optimizer.step()
    assert (before - weight.detach()).abs().min().item() > 0.05


def test_a_step_short_of_a_train_batch_scales_its_learning_rate(tiny_model):
    """Dynamic sampling short of groups: a step on half a train batch takes AdamW's step at half the learning rate,
    and the next full step is back at the full rate."""
    config = GRPOConfig(**SMALL, learning_rate=1e-2)
    model = copy.deepcopy(tiny_model)
    twin = copy.deepcopy(tiny_model)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.optimizer.learning_rate, betas=(0.9, 0.95), weight_decay=0.0
    )
    halved = torch.optim.AdamW(
        twin.parameters(), lr=config.optimizer.learning_rate / 2, betas=(0.9, 0.95), weight_decay=0.0
    )
    for parameter, other in zip(model.parameters(), twin.parameters(), strict=True):
        parameter.grad = torch.full_like(parameter, 1e-3)
        other.grad = parameter.grad.clone()
    metrics = optimizer_step(model, optimizer, config.optimizer.max_grad_norm, NonFiniteGuard(3), 0, {}, share=0.5)
    torch.nn.utils.clip_grad_norm_(twin.parameters(), config.optimizer.max_grad_norm)
    halved.step()
    assert metrics["train/learning_rate"] == pytest.approx(config.optimizer.learning_rate / 2)
    assert optimizer.param_groups[0]["lr"] == config.optimizer.learning_rate
    for parameter, other in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(parameter, other, rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    "changes",
    [
        {"loss_type": "reinforce_with_baseline", "train_batch_size": 64},
        {"loss_type": "no_baseline", "train_batch_size": 64},
        {"loss_type": "reinforce_with_baseline", "epochs_per_rollout_batch": 2},
    ],
)
def test_off_policy_steps_without_an_importance_ratio_are_refused(changes):
    base = {"rollout_batch_size": 256, "train_batch_size": 256, "gradient_accumulation_steps": 64}
    with pytest.raises(ConfigError, match=r"^grpo.loss_type: .* has no importance ratio.*grpo.epochs_per_rollout"):
        GRPOConfig(**{**base, **changes})
    GRPOConfig(**{**base, **changes, "loss_type": "grpo_clip"})  # the ratio corrects it
    GRPOConfig(**{**base, **changes, "loss_type": "grpo_no_clip"})


def test_a_remainder_of_rows_is_refused():
    with pytest.raises(ConfigError, match=r"^grpo.rollout_batch_size: \(192\) must be divisible by grpo.train_batch"):
        GRPOConfig(rollout_batch_size=192, train_batch_size=128, gradient_accumulation_steps=64, loss_type="grpo_clip")

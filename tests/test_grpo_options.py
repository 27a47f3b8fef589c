"""GRPO options mean what they say: the KL reference and its refresh, the rewards the advantages see (the overlong
penalty, the RLOO baseline), steps without signal, steps short of a train batch, and off-policy configurations without
an importance ratio. (Dr. GRPO's constant under overlong filtering: test_grpo.py.)"""

import copy

import pytest
import torch

from reasonrl.config import ConfigError, GRPOConfig, OverlongPenalty
from reasonrl.data import GSM8KExample
from reasonrl.distributed import SINGLE
from reasonrl.grpo import (
    KLReference,
    NonFiniteGuard,
    TrainingState,
    grpo_checkpoints,
    has_learning_signal,
    optimizer_step,
    score_rollouts,
    summarize_rollouts,
)
from reasonrl.losses import compute_kl, group_normalized_advantages
from reasonrl.rollouts.types import DrawnRollouts, Sample, StepRollouts
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.checkpoints import CheckpointError
from tests.test_grpo import fixed_batch, forge_digests

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


def response_log_probs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        log_probs = torch.log_softmax(model(batch.input_ids).logits, dim=-1)
    return log_probs.gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)  # [B, T]


def test_the_kl_reference_becomes_the_policy_every_n_steps(tiny_model):
    """``ref_update_every: 2``: after step 1 the reference is still the init model (k3 = (r − 1) − log r > 0, its
    gradient in log π 1 − r), after step 2 it is the policy of that moment (k3 = 0 and gradient 0, exactly), a copy
    that training the policy further leaves behind."""
    batch = fixed_batch(advantages=[1.0, -1.0, 0.5, -0.5], raw_rewards=[1.0, 0.0, 1.0, 0.0])
    mask = batch.response_mask
    policy = copy.deepcopy(tiny_model)
    config = GRPOConfig(**SMALL, kl_coef=0.1, ref_update_every=2)
    reference = KLReference.of(policy, config.loss, config.lora.lora_rank)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))

    def penalty() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        log_probs = response_log_probs(policy, batch).requires_grad_()
        reference_log_probs = response_log_probs(reference.frozen, batch)
        kl = compute_kl(log_probs, reference_log_probs, "k3")
        kl[mask].sum().backward()
        return kl.detach()[mask], log_probs.grad[mask], (reference_log_probs - log_probs.detach())[mask]

    reference.refresh(policy, steps_done=1)
    kl, gradient, log_ratio = penalty()
    assert all(torch.equal(a, b) for a, b in zip(reference.frozen.parameters(), tiny_model.parameters(), strict=True))
    torch.testing.assert_close(kl, log_ratio.exp() - 1 - log_ratio)
    torch.testing.assert_close(gradient, 1 - log_ratio.exp())
    assert kl.min() > 0

    reference.refresh(policy, steps_done=2)
    kl, gradient, _ = penalty()
    assert all(torch.equal(a, b) for a, b in zip(reference.frozen.parameters(), policy.parameters(), strict=True))
    assert kl.abs().max().item() == 0.0 and gradient.abs().max().item() == 0.0
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    assert not torch.equal(next(policy.parameters()), next(reference.frozen.parameters()))
    assert not any(p.requires_grad for p in reference.frozen.parameters()) and not reference.frozen.training


def test_a_refreshed_reference_is_part_of_the_checkpoint_and_only_then(tiny_model, tmp_path):
    """Saved beside the policy when it refreshes and loaded back into a run's own reference (the init model there),
    before the policy; one of other names or shapes is refused with everything left as it was. A reference that
    never refreshes is the init model and not saved."""
    live = tmp_path / "live"
    live.mkdir()
    policy = copy.deepcopy(tiny_model)
    config = GRPOConfig(**SMALL, kl_coef=0.1, ref_update_every=1)
    reference = KLReference.of(policy, config.loss, 0)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.5)
    reference.refresh(policy, steps_done=1)

    def checkpoints(directory, model, kl_reference):
        optimizer = torch.optim.AdamW(model.parameters())
        return grpo_checkpoints(
            tmp_path / directory, "f", model, optimizer, BestCheckpoint(), live, reference=kl_reference
        )

    checkpoints("refreshed", policy, reference).save(TrainingState(step=1))
    saved = torch.load(tmp_path / "refreshed/step-000001/checkpoint.pt", weights_only=True)
    assert all(torch.equal(saved["reference"][name], t) for name, t in reference.frozen.state_dict().items())

    resumed_policy = copy.deepcopy(tiny_model)
    resumed = KLReference.of(resumed_policy, config.loss, 0)  # a rerun's: the init model, as loaded
    checkpoints("refreshed", resumed_policy, resumed).load(tmp_path / "refreshed/step-000001")
    for state in (resumed.frozen.state_dict(), resumed_policy.state_dict()):
        assert all(torch.equal(state[name], tensor) for name, tensor in policy.state_dict().items())

    del saved["reference"]["lm_head.weight"]
    torch.save(saved, tmp_path / "refreshed/step-000001/checkpoint.pt")
    forge_digests(tmp_path / "refreshed/step-000001")  # what is refused is the reference, not the file's digest
    fresh_policy = copy.deepcopy(tiny_model)
    fresh = KLReference.of(fresh_policy, config.loss, 0)
    with pytest.raises(CheckpointError, match="its KL reference is not of this policy's names and shapes"):
        checkpoints("refreshed", fresh_policy, fresh).load(tmp_path / "refreshed/step-000001")
    for model in (fresh.frozen, fresh_policy):
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), tiny_model.parameters(), strict=True))

    never = KLReference.of(policy, GRPOConfig(**SMALL, kl_coef=0.1).loss, 0)
    checkpoints("never", policy, never).save(TrainingState(step=1))
    assert "reference" not in torch.load(tmp_path / "never/step-000001/checkpoint.pt", weights_only=True)


def drawn_rollouts() -> DrawnRollouts:
    """Two questions, two answers each, sampled with max_tokens 8: 3 tokens ending with EOS (graded right), 8 cut
    at the budget (right), 6 ending with EOS (wrong) and 7 ended by a stop string (right)."""
    questions = [GSM8KExample("q1", "", "1"), GSM8KExample("q2", "", "2")]
    samples = [
        Sample("a", [1, 2, 0], None, [5], "eos"),
        Sample("b", list(range(1, 9)), None, [5], "length"),
        Sample("c", [1, 2, 3, 4, 5, 0], None, [6], "eos"),
        Sample("d", list(range(1, 8)), None, [6], "stop_string"),
    ]
    scores = [dict.fromkeys(("reward", "format_reward", "answer_reward"), grade) for grade in (1.0, 1.0, 0.0, 1.0)]
    return DrawnRollouts(
        questions, ["p1", "p2"], samples, scores,
        sampled_questions=questions, sampled_samples=samples, sampled_scores=scores,
    )  # fmt: skip


def test_the_advantages_see_the_overlong_penalty_and_the_grades_stay(tiny_tokenizer):
    """buffer 4 of max_tokens 8, max_penalty 1: tokens 3, 8, 6, 7 (a final EOS counted) → penalties 0, −1, −0.5,
    −0.75; rewards 1, 0, −0.5, 0.25 for the advantages, grades 1, 1, 0, 1 for the metrics."""
    drawn, loss = drawn_rollouts(), GRPOConfig(**SMALL).loss
    plain = GRPOConfig(**SMALL, max_tokens=8).sampling
    shaped = GRPOConfig(**SMALL, max_tokens=8, overlong_penalty=OverlongPenalty(buffer=4, max_penalty=1.0)).sampling
    batch = score_rollouts(tiny_tokenizer, drawn, 2, loss, shaped)
    assert batch.raw_rewards.tolist() == [1.0, 0.0, -0.5, 0.25]
    assert torch.equal(batch.advantages, group_normalized_advantages([1.0, 0.0, -0.5, 0.25], 2, 1e-6, True)[0])
    assert [score["reward"] for score in drawn.scores] == [1.0, 1.0, 0.0, 1.0]
    summary = summarize_rollouts(StepRollouts(0, 0, drawn), 2, shaped, SINGLE)
    assert summary["rollout/overlong_penalty"] == -2.25 / 4 and summary["rollout/reward"] == 0.75

    off = score_rollouts(tiny_tokenizer, drawn, 2, loss, plain)  # off: the grades, bit for bit as before
    assert off.raw_rewards.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert torch.equal(off.advantages, group_normalized_advantages([1.0, 1.0, 0.0, 1.0], 2, 1e-6, True)[0])
    assert "rollout/overlong_penalty" not in summarize_rollouts(StepRollouts(0, 0, drawn), 2, plain, SINGLE)

    rloo = GRPOConfig(**SMALL, advantage_estimator="rloo", use_std_normalization=False).loss
    assert score_rollouts(tiny_tokenizer, drawn, 2, rloo, shaped).advantages.tolist() == [1.0, -1.0, -0.75, 0.75]


def test_rloo_refuses_std_normalization_and_a_refresh_needs_a_copyable_reference():
    with pytest.raises(ConfigError, match=r"^grpo.use_std_normalization: must be false with grpo.advantage_estima"):
        GRPOConfig(advantage_estimator="rloo")
    with pytest.raises(ConfigError, match=r"^grpo.ref_update_every: refreshes the KL reference, but grpo.kl_coef"):
        GRPOConfig(ref_update_every=5)
    with pytest.raises(ConfigError, match=r"^grpo.ref_update_every: needs grpo.lora_rank 0"):
        GRPOConfig(ref_update_every=5, kl_coef=0.1, lora_rank=8)
    GRPOConfig(ref_update_every=5, kl_coef=0.1)


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

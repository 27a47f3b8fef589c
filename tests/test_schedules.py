"""Learning-rate schedules (issue 23): each schedule's rate per optimizer step against hand-computed values, SFT's and
GRPO's use of them, the composition with a short step's scaling, and a resumed GRPO run continuing the sequence."""

import copy
import math

import pytest
import torch

from reasonrl.config import GRPOConfig, SFTConfig
from reasonrl.grpo import NonFiniteGuard, TrainingState, grpo_checkpoints, optimizer_step, scheduled_learning_rate
from reasonrl.schedules import learning_rate_factor
from reasonrl.sft import Pair, sft_schedule, sft_steps
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.optimizer import make_optimizer, set_learning_rate

# 10 optimizer steps, 2 of warm-up (0.5, then the peak at its last step), then 8 of decay at progress (s - 2) / 8.
HAND_COMPUTED = {
    "constant": [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    "linear": [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125],
    # 0.5 (1 + cos(π p)): p = 1/8 → 0.96194, 1/4 → 0.85355, 3/8 → 0.69134, 1/2 → 0.5, 7/8 → 0.03806.
    "cosine": [0.5, 1.0, 1.0, 0.9619397663, 0.8535533906, 0.6913417162, 0.5, 0.3086582838, 0.1464466094, 0.0380602337],
}


@pytest.mark.parametrize("schedule", list(HAND_COMPUTED))
def test_each_schedule_gives_the_hand_computed_rate_per_step(schedule):
    factors = [learning_rate_factor(schedule, step, total_steps=10, warmup_steps=2) for step in range(10)]
    assert factors == pytest.approx(HAND_COMPUTED[schedule], abs=1e-9)
    # Warm-up's end, the decay's midpoint and the last step, named: the last step still trains (rate above 0).
    midpoint, last = {
        "constant": (1.0, 1.0),
        "linear": (0.5, 1 / 8),
        "cosine": (0.5, (1 + math.cos(7 * math.pi / 8)) / 2),
    }[schedule]
    assert (factors[1], factors[6], factors[9]) == pytest.approx((1.0, midpoint, last))


def test_no_warmup_and_constant_is_the_peak_rate_at_every_step():
    """The defaults (constant, 0 warm-up steps) keep GRPO's fixed learning rate."""
    assert [learning_rate_factor("constant", step, 7, 0) for step in range(7)] == [1.0] * 7
    assert learning_rate_factor("linear", 0, 4, 0) == 1.0  # decay starts at the peak


def test_sft_steps_follow_the_schedule_and_the_default_keeps_the_old_warmup():
    """SFT's schedule: the rate each step trains at over 10 steps with a 20% warm-up; and the default (constant, 5%)
    is the former warm-up-then-constant rule min(1, (s + 1) / warmup)."""
    config = SFTConfig(learning_rate=0.1, warmup_ratio=0.2, lr_schedule="linear", batch_size=4, microbatch_size=2)
    rates = [sft_schedule(config, total_steps=10).rate(step) for step in range(10)]
    assert rates == pytest.approx([0.1 * factor for factor in HAND_COMPUTED["linear"]])

    default = SFTConfig(learning_rate=0.1)
    rates = [sft_schedule(default, total_steps=100).rate(step) for step in range(100)]
    assert rates == pytest.approx([0.1 * min(1.0, (step + 1) / 5) for step in range(100)])


@pytest.mark.parametrize(
    ("schedule", "warmup_ratio", "total_steps"), [("cosine", 0.2, 10), ("linear", 0.08, 40), ("constant", 0.05, 7)]
)
def test_sft_rates_are_bit_for_bit_those_of_lambdalr(schedule, warmup_ratio, total_steps):
    """The rate set before each step is, to the bit, what ``torch.optim.lr_scheduler.LambdaLR`` over
    :func:`learning_rate_factor` gave that step (``base_lr * factor(step)``: ``factor(0)`` from its construction,
    ``factor(n)`` after its ``n``-th ``step()``), SFT's mechanism before the rate was a function of the step."""
    config = SFTConfig(learning_rate=3e-3, warmup_ratio=warmup_ratio, lr_schedule=schedule)
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=config.optimizer.learning_rate)
    warmup = round(warmup_ratio * total_steps)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate_factor(schedule, step, total_steps, warmup)
    )
    expected = []
    for _ in range(total_steps):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        lambda_lr.step()
    assert [sft_schedule(config, total_steps).rate(step) for step in range(total_steps)] == expected


def test_sft_steps_train_and_log_at_the_scheduled_rate(tiny_model, tiny_tokenizer):
    """Each optimizer step of ``sft_steps`` runs at the schedule's rate of its index, and logs it."""
    pairs = [Pair(f"User: {n} plus 1?\nAssistant: <think>", f" {n + 1} </think>") for n in range(8)]
    config = SFTConfig(learning_rate=0.1, warmup_ratio=0.5, lr_schedule="cosine", batch_size=2, microbatch_size=2)
    schedule, policy = sft_schedule(config, 4), copy.deepcopy(tiny_model).train()
    optimizer = make_optimizer(policy, config.optimizer)
    set_rates = []
    step = optimizer.step

    def recording_step(*args, **kwargs):
        set_rates.append(optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    optimizer.step = recording_step
    logged = [
        m["train/learning_rate"] for m in sft_steps(policy, tiny_tokenizer, optimizer, schedule, pairs, config, 1)
    ]
    assert logged == set_rates == [schedule.rate(step) for step in range(4)]


# 5 GRPO steps × 2 epochs × 2 train batches per rollout batch = 20 optimizer steps.
SCHEDULED = {
    "n_grpo_steps": 5,
    "rollout_batch_size": 16,
    "group_size": 4,
    "train_batch_size": 8,
    "gradient_accumulation_steps": 2,
    "epochs_per_rollout_batch": 2,
    "loss_type": "grpo_clip",
    "learning_rate": 0.2,
    "lr_schedule": "linear",
    "warmup_steps": 4,
}


def grpo_rates(config: GRPOConfig, first_step: int = 0) -> list[float]:
    """The rates of the optimizer steps in run_grpo's loop order, from GRPO step ``first_step`` on."""
    per_epoch = config.batching.rollout_batch_size // config.batching.train_batch_size
    return [
        scheduled_learning_rate(config, step, epoch, batch)
        for step in range(first_step, config.n_grpo_steps)
        for epoch in range(config.batching.epochs_per_rollout_batch)
        for batch in range(per_epoch)
    ]


def test_grpo_optimizer_steps_run_through_the_schedule_once_in_loop_order():
    config = GRPOConfig(**SCHEDULED)
    assert config.total_optimizer_steps == 20
    rates = grpo_rates(config)
    # Warm-up 0.05, 0.1, 0.15, 0.2; the decay from the peak at GRPO step 1 down to 0.2 / 16 at the last step.
    assert rates[:5] == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2])
    assert rates[12] == pytest.approx(0.1)  # the decay's midpoint: progress 8/16
    assert rates[-1] == pytest.approx(0.2 / 16)
    assert rates == pytest.approx([0.2 * learning_rate_factor("linear", place, 20, 4) for place in range(20)])


def test_a_short_step_scales_the_scheduled_rate_and_leaves_it_for_the_next():
    """Dynamic sampling short of groups: the step trains (and logs) at the scheduled rate times its share."""
    config = GRPOConfig(**SCHEDULED)
    policy = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.optimizer.learning_rate)
    policy(torch.ones(1, 2)).sum().backward()
    scheduled = scheduled_learning_rate(config, 2, 1, 0)
    set_learning_rate(optimizer, scheduled)
    metrics = optimizer_step(policy, optimizer, config.optimizer.max_grad_norm, NonFiniteGuard(3), 2, {}, share=0.25)
    assert scheduled != config.optimizer.learning_rate
    assert metrics["train/learning_rate"] == pytest.approx(scheduled * 0.25)
    assert optimizer.param_groups[0]["lr"] == scheduled


def test_a_resumed_run_continues_the_same_rate_sequence(tiny_model, tmp_path):
    """The rate is a function of the GRPO step alone, which the checkpoint carries: a run resumed at step 3 trains
    at the rates an uninterrupted run has from its step 3 on, whatever rate the saved optimizer last held."""
    config = GRPOConfig(**SCHEDULED)
    live = tmp_path / "live"
    live.mkdir()
    optimizer = torch.optim.AdamW(tiny_model.parameters(), lr=config.optimizer.learning_rate)
    set_learning_rate(optimizer, scheduled_learning_rate(config, 2, 1, 1))  # the last step before the checkpoint
    state = TrainingState(step=3, optimizer_steps=12)
    directory = tmp_path / "checkpoints"
    grpo_checkpoints(directory, "fingerprint", tiny_model, optimizer, BestCheckpoint(), live).save(state)

    restored = torch.optim.AdamW(tiny_model.parameters(), lr=config.optimizer.learning_rate)
    resumed = grpo_checkpoints(directory, "fingerprint", tiny_model, restored, BestCheckpoint(), live).resume()
    assert (resumed.step, resumed.optimizer_steps) == (3, 12)
    assert grpo_rates(config, first_step=resumed.step) == grpo_rates(config)[12:]

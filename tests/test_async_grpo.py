"""Asynchronous GRPO (``grpo.max_staleness`` ≥ 1): the weight channel into the engine's own process, the fixed
policy lag, validation on the weights of the step it reports, and ``max_staleness: 0`` as exactly the synchronous
generate-then-train loop."""

import copy
import dataclasses
import functools
import json
import random
from pathlib import Path

import pytest
import torch

from reasonrl.batching import chunks
from reasonrl.cli import open_live
from reasonrl.config import EngineConfig, EvalConfig, GRPOConfig
from reasonrl.data import parse_lines
from reasonrl.grpo import (
    FixedLogProbs,
    Forwards,
    NonFiniteGuard,
    accumulate_gradients,
    compute_old_log_probs,
    grpo_rollouts,
    optimizer_step,
    run_grpo,
    scheduled_learning_rate,
    score_rollouts,
)
from reasonrl.logprobs import compute_entropy
from reasonrl.losses import masked_mean
from reasonrl.rollouts.channel import WeightLayout
from reasonrl.rollouts.drawing import draw_rollouts, step_seed
from reasonrl.rollouts.engine import RolloutEngine, engine_weights
from reasonrl.rollouts.process import Draw, Drawn, RolloutProcess, Setup, Validate, Validated
from reasonrl.rollouts.sources import LaggedRollouts
from reasonrl.rollouts.types import DrawnRollouts, StepRollouts
from reasonrl.synthetic import arithmetic_lines
from reasonrl.training.optimizer import make_optimizer, set_learning_rate
from reasonrl.training.policy import load_policy
from reasonrl.training.validation import validate

ENGINE = EngineConfig(cpu_kv_cache_gib=1, max_model_len=1024, enforce_eager=True)  # float32, as the trainer on the CPU
TRAIN = parse_lines(arithmetic_lines(32, 0, 1, 9), "train")
EVAL = EvalConfig(max_tokens=12)
# The tiny random model earns no reward, hence no advantage: the KL penalty (moved off its reference by weight
# decay) is what makes every optimizer step change the weights.
CONFIG = GRPOConfig(
    n_grpo_steps=5, learning_rate=1e-4, rollout_batch_size=8, group_size=4, train_batch_size=8,
    gradient_accumulation_steps=2, max_tokens=12, eval_every=2, eval_examples=4, checkpoint_every=100,
    kl_coef=0.04, weight_decay=0.1, keep_every=2,
)  # fmt: skip


def test_weight_layout_fills_buckets_in_order_and_puts_a_larger_tensor_alone():
    layout = WeightLayout(("a", "b", "c", "d"), ((4,), (3, 2), (100,), (1,)), "float32", bucket_bytes=40)
    assert layout.buckets() == [range(0, 2), range(2, 3), range(3, 4)]  # 16 + 24 bytes | 400 | 4
    assert WeightLayout(("a", "b"), ((4,), (4,)), "bfloat16", bucket_bytes=16).buckets() == [range(0, 2)]


@pytest.fixture(scope="module")
def engine_process(tiny_model_dir):
    with RolloutProcess(tiny_model_dir, ENGINE, engine_threads=1) as process:
        yield process


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return RolloutEngine(tiny_model_dir, ENGINE)


def perturbed_policy(model_dir, seed: int = 0):
    policy, tokenizer = load_policy(model_dir, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in policy.parameters():  # the tied embedding too: the output layer must follow it
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return policy, tokenizer


@pytest.mark.slow
def test_weights_streamed_to_the_engine_process_give_the_trainers_log_probs(engine_process, tiny_model_dir):
    """Perturbed weights, streamed in many small buckets: the engine's log-probs of what it then samples equal the
    trainer's to 1e-3, and differ from the unperturbed model's (the transfer took effect). ``min_tokens: 0``: the
    engine's log-probs of the first ``min_tokens`` tokens are of a distribution without EOS."""
    policy, tokenizer = perturbed_policy(tiny_model_dir)
    config = GRPOConfig(
        rollout_batch_size=8, group_size=4, train_batch_size=8, gradient_accumulation_steps=2, max_tokens=12,
        min_tokens=0, max_staleness=1, rollout_is_cap=2.0,
    )  # fmt: skip
    draw = functools.partial(draw_rollouts, train=TRAIN, config=config, stop=EVAL.stop)
    engine_process.setup(
        Setup(draw, functools.partial(validate, val=TRAIN[:2], eval_config=EVAL, num_examples=2, prompt_name="r1_zero"))
    )
    layout = WeightLayout.of(engine_weights(policy, ENGINE.dtype), ENGINE.dtype, bucket_bytes=64 * 2**10)
    assert len(layout.buckets()) > 5
    engine_process.load_weights(engine_weights(policy, ENGINE.dtype), layout, version=7)
    engine_process.request(Draw(step=0, step_seed=123))
    reply = engine_process.reply()
    assert (reply.step, reply.version) == (0, 7)
    drawn = reply.rollouts
    batch = scored(tokenizer, drawn, config)
    mask = batch.response_mask
    assert mask.sum() > 8
    trainer = compute_old_log_probs(policy, batch, Forwards.fixed(config))
    assert (trainer - batch.engine_log_probs)[mask].abs().max() < 1e-3
    unperturbed, _ = load_policy(tiny_model_dir, torch.device("cpu"))
    old_log_probs = compute_old_log_probs(unperturbed, batch, Forwards.fixed(config))
    assert (old_log_probs - batch.engine_log_probs)[mask].abs().max() > 0.05


def scored(tokenizer, drawn, config):
    """The step's rollout batch, as the loop scores it."""
    return score_rollouts(tokenizer, drawn, config.batching.group_size, config.loss, config.sampling)


def run(engine, policy, tokenizer, model_dir, work, config, kept: dict | None = None):
    def keep(step, best):
        kept[step] = copy.deepcopy(policy.state_dict())

    run_grpo(
        policy, tokenizer, engine, TRAIN, TRAIN[:8], config, EVAL,
        open_live=lambda resume: open_live(str(work / "live"), resume=resume), live_dir=work / "live",
        checkpoint_dir=work / "checkpoints", init_model_dir=model_dir, keep=None if kept is None else keep,
    )  # fmt: skip


def column(work, name: str) -> list[float]:
    rows = (work / "live/plots/metrics" / f"{name}.tsv").read_text().splitlines()[1:]
    return [float(row.split("\t")[1]) for row in rows]


@pytest.mark.slow
def test_every_step_trains_on_samples_of_the_policy_exactly_lag_steps_older(engine_process, tiny_model_dir, tmp_path):
    """Lag 2: steps 0, 1, 2 train on the initial weights' samples, step s ≥ 2 on step s − 2's; the engine draws
    ahead while the policy trains. The correction's figures are logged every step, and the validation at step 2
    is that of step 2's own weights, whatever the engine had in flight then (validated afresh by another engine
    process: the loop's source stops the one it drew from). ``min_tokens: 0``: over the first ``min_tokens`` tokens
    μ is of the distribution without EOS, a gap of its own (3e-3 for this model)."""
    config = dataclasses.replace(CONFIG, max_staleness=2, rollout_is_cap=2.0, min_tokens=0)
    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
    kept = {}
    process = RolloutProcess(tiny_model_dir, ENGINE, engine_threads=1)
    run(process, policy, tokenizer, tiny_model_dir, tmp_path, config, kept)
    assert not Path(f"/proc/{process.pid}").exists()  # stopped (and reaped) when the loop ended
    assert column(tmp_path, "rollout/policy_lag") == [0, 1, 2, 2, 2]
    for name in ("is_log_prob_gap_mean", "is_log_prob_gap_max", "is_weight_mean", "is_truncated_fraction"):
        assert len(column(tmp_path, f"train/{name}")) == 5
    gaps = column(tmp_path, "train/is_log_prob_gap_max")
    assert gaps[0] < 1e-3 < max(gaps[2:])  # step 0's samples are the current policy's; later ones are stale

    # Step 2's weights, validated afresh by the engine as the run's source has it validate: the run's validation at
    # step 2 answered exactly this.
    validated = copy.deepcopy(policy)
    validated.load_state_dict(kept[2])
    source = grpo_rollouts(engine_process, validated, TRAIN, TRAIN[:8], config, EVAL)
    engine_process.setup(Setup(source.draw, source.check))
    layout = WeightLayout.of(engine_weights(validated, ENGINE.dtype), ENGINE.dtype)
    engine_process.load_weights(engine_weights(validated, ENGINE.dtype), layout, version=2)
    engine_process.request(Validate())
    result = engine_process.reply().result
    logged = json.loads((tmp_path / "live/examples/step_000002.json").read_text())
    assert [example["response"] for example in logged] == [record["response"] for record in result.records[:4]]
    assert column(tmp_path, "eval/accuracy")[1] == result.metrics["accuracy"]  # validations at steps 0, 2, 4, 5
    # The trainer's time on streaming each step's new weights to the engine, and on waiting for each step's draw.
    assert len(column(tmp_path, "time/weight_sync_seconds")) == len(column(tmp_path, "time/rollout_seconds")) == 5
    assert min(column(tmp_path, "time/weight_sync_seconds")) > 0


@pytest.mark.slow
def test_lag_zero_is_the_synchronous_loop(engine, tiny_model_dir, tmp_path):
    """``max_staleness: 0`` with ``rollout_is_cap: null``: the weights are exactly those of generate-then-train
    written out step by step from the same library functions, with no validation in between."""
    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
    run(engine, policy, tokenizer, tiny_model_dir, tmp_path, CONFIG)

    expected, _ = load_policy(tiny_model_dir, torch.device("cpu"))
    reference = copy.deepcopy(expected).eval().requires_grad_(False)
    optimizer = make_optimizer(expected, CONFIG.optimizer)
    guard = NonFiniteGuard(CONFIG.max_consecutive_nonfinite)
    forwards, max_tokens = Forwards.training(CONFIG), CONFIG.sampling.max_tokens
    for step in range(CONFIG.n_grpo_steps):
        seed = step_seed(CONFIG.seed, step)
        with engine.serving(expected):
            drawn = draw_rollouts(engine, TRAIN, CONFIG, EVAL.stop, seed)
        batch = scored(tokenizer, drawn, CONFIG)
        fixed = FixedLogProbs(reference=compute_old_log_probs(reference, batch, Forwards.fixed(CONFIG)))
        order = list(range(len(batch.responses)))
        random.Random(seed).shuffle(order)
        for train_batch, rows in enumerate(chunks(order, CONFIG.batching.train_batch_size)):
            accumulate_gradients(expected, batch, rows, fixed, CONFIG.loss, forwards, max_tokens)
            set_learning_rate(optimizer, scheduled_learning_rate(CONFIG, step, 0, train_batch))
            optimizer_step(expected, optimizer, CONFIG.optimizer.max_grad_norm, guard, step, {})
    trained, initial = policy.state_dict(), load_policy(tiny_model_dir, torch.device("cpu"))[0].state_dict()
    assert all(torch.equal(trained[name], tensor) for name, tensor in expected.state_dict().items())
    assert not all(torch.equal(trained[name], tensor) for name, tensor in initial.items())
    # Loading the weights into the in-process engine is part of each step's rollout time.
    syncs, rollouts = column(tmp_path, "time/weight_sync_seconds"), column(tmp_path, "time/rollout_seconds")
    assert len(syncs) == 5 and all(0 < sync < rollout for sync, rollout in zip(syncs, rollouts, strict=True))


@pytest.mark.slow
def test_the_old_log_prob_pass_runs_only_when_a_later_optimizer_step_needs_it(engine, tiny_model_dir, tmp_path):
    """grpo_clip with the importance weights, no KL penalty (an entropy bonus gives each step its signal): with one
    optimizer step per rollout batch the policy runs only the update's forwards, one per microbatch, and no
    ``old_log_prob`` time is logged; with two epochs the pass before the update runs (its two microbatches) and is
    timed."""
    one_step = dataclasses.replace(
        CONFIG, n_grpo_steps=1, eval_every=100, loss_type="grpo_clip", cliprange=0.2, rollout_is_cap=2.0, kl_coef=0.0,
        entropy_coef=0.01, weight_decay=0.0, keep_every=0,
    )  # fmt: skip
    two_epochs = dataclasses.replace(one_step, epochs_per_rollout_batch=2)
    forwards_per_step = {}
    for name, config in (("one step", one_step), ("two epochs", two_epochs)):
        policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
        forwards = []
        decoder = policy.get_decoder()  # what the trainer runs (a chunked head follows it, not the HF forward)
        decoder.register_forward_hook(lambda module, args, output, seen=forwards: seen.append(torch.is_grad_enabled()))
        run(engine, policy, tokenizer, tiny_model_dir, tmp_path / name, config)
        forwards_per_step[name] = (forwards.count(True), forwards.count(False))  # (with, without gradient)
        timed = (tmp_path / name / "live/plots/metrics/time/old_log_prob_seconds.tsv").exists()
        assert timed == (name == "two epochs")
        assert len(column(tmp_path / name, "train/is_log_prob_gap_max")) == config.batching.epochs_per_rollout_batch
    microbatches = CONFIG.batching.gradient_accumulation_steps
    assert forwards_per_step == {"one step": (microbatches, 0), "two epochs": (2 * microbatches, microbatches)}


def tempered_scores(policy, batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: ``log_softmax(logits / T)`` of the full HF forward at the labels, and its entropy, ``[N, L]``."""
    with torch.no_grad():
        logits = policy(batch.input_ids).logits / temperature  # [N, L, V]
    return torch.log_softmax(logits, dim=-1).gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1), compute_entropy(logits)


@pytest.mark.slow
def test_at_a_temperature_the_engine_and_the_trainer_score_the_distribution_sampled_from(engine, tiny_model_dir):
    """At T = 0.5 the engine's log-probs of its samples (μ) and the trainer's (π_old and π_ref, and π's entropy in
    training, on the path GRPO takes) are of ``softmax(logits / T)`` at the sampled tokens. ``min_tokens: 0``: over
    the first ``min_tokens`` tokens the engine samples, and μ scores, without EOS."""
    temperature = 0.5
    policy, tokenizer = perturbed_policy(tiny_model_dir, seed=1)
    config = dataclasses.replace(CONFIG, temperature=temperature, min_tokens=0, rollout_is_cap=2.0)
    with engine.serving(policy):
        drawn = draw_rollouts(engine, TRAIN, config, EVAL.stop, step_seed(config.seed, 0))
    batch = scored(tokenizer, drawn, config)
    mask = batch.response_mask
    assert mask.sum() > 16
    expected, entropy = tempered_scores(policy, batch, temperature)
    old_log_probs = compute_old_log_probs(policy, batch, Forwards.fixed(config))
    engine_diff = (batch.engine_log_probs - expected)[mask].abs().max().item()
    trainer_diff = (old_log_probs - expected)[mask].abs().max().item()
    untempered_diff = (tempered_scores(policy, batch, 1.0)[0] - expected)[mask].abs().max().item()
    print(
        f"\nT={temperature}: max |log-prob - log_softmax(logits/T)|: engine {engine_diff:.2e}, trainer "
        f"{trainer_diff:.2e} (untempered {untempered_diff:.2f})"
    )
    assert untempered_diff > 0.1  # the temperature matters for this model
    assert engine_diff < 1e-3
    assert trainer_diff < 1e-3
    rows = list(range(len(batch.responses)))
    fixed = FixedLogProbs(old=old_log_probs, reference=old_log_probs)
    metrics = accumulate_gradients(
        policy, batch, rows, fixed, config.loss, Forwards.training(config), config.sampling.max_tokens
    )
    assert metrics["train/entropy"] == pytest.approx(masked_mean(entropy, mask).item(), rel=1e-4)


def recorded_replies(engine_process, monkeypatch) -> list:
    """Every reply the trainer takes from ``engine_process`` from now on, in order."""
    replies, reply = [], engine_process.reply

    def recording():
        replies.append(reply())
        return replies[-1]

    monkeypatch.setattr(engine_process, "reply", recording)
    return replies


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_validations_and_checkpoints_wait_for_no_draw_requested_after_them(engine_process, tiny_model_dir, monkeypatch):
    """Lag 1: the validation of step 0's weights is the engine's first reply (requested with those weights, ahead of
    the draws of steps 0 and 1); a checkpoint after step 1 takes step 1's rollouts, drawn by the initial weights,
    and leaves step 2's, drawn by its own weights, to request: its draw goes on after the checkpoint."""
    config = dataclasses.replace(CONFIG, n_grpo_steps=3, max_staleness=1, rollout_is_cap=2.0)
    policy, _ = load_policy(tiny_model_dir, torch.device("cpu"))
    rollouts = grpo_rollouts(engine_process, policy, TRAIN, TRAIN[:8], config, EVAL)
    assert isinstance(rollouts, LaggedRollouts)
    replies = recorded_replies(engine_process, monkeypatch)
    rollouts.start(0, [])
    rollouts.validate(0)
    assert [type(reply) for reply in replies] == [Validated]
    assert rollouts.batch(0).version == 0
    rollouts.advance(1)
    held, to_request = rollouts.in_flight(1)
    assert [(drawn.step, drawn.version) for drawn in held] == [(1, 0)] and to_request == [2]
    assert [(type(reply), getattr(reply, "step", None)) for reply in replies] == [
        (Validated, None), (Drawn, 0), (Drawn, 1)
    ]  # fmt: skip
    assert rollouts.batch(1) is held[0] and rollouts.batch(2).version == 1  # nothing left in the engine's queue


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rollouts_neither_held_nor_requested_fail_at_once(engine_process, tiny_model_dir):
    """Started at step 4 (lag 2) with the rollouts of steps 4 and 6 but not 5: step 5's batch, never requested,
    is refused at once instead of waiting for the engine forever."""
    config = dataclasses.replace(CONFIG, n_grpo_steps=7, eval_every=100, max_staleness=2, rollout_is_cap=2.0)
    policy, _ = load_policy(tiny_model_dir, torch.device("cpu"))
    rollouts = grpo_rollouts(engine_process, policy, TRAIN, TRAIN[:8], config, EVAL)
    nothing = DrawnRollouts([], [], [], [], sampled_questions=[], sampled_samples=[], sampled_scores=[])
    rollouts.start(4, [StepRollouts(4, 2, nothing), StepRollouts(6, 4, nothing)])  # requests no draw: 6 is held
    assert rollouts.batch(4).version == 2
    with pytest.raises(RuntimeError, match="the rollouts of GRPO step 5 were neither held nor requested"):
        rollouts.batch(5)

"""Expert iteration (handout Algorithm 2, STaR-style): sample answers, keep the correct ones, fine-tune on them."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from reasonrl.code_deps import STAGES
from reasonrl.cost import CostLedger
from reasonrl.data import examples_digest
from reasonrl.prompts import RewardFn, load_prompt
from reasonrl.rewards import prompt_reward
from reasonrl.rollouts.drawing import sample_groups, step_seed
from reasonrl.rollouts.types import samples_tokens
from reasonrl.sft import Pair, count_steps, sft_schedule, sft_steps
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.cadence import is_checkpoint_step
from reasonrl.training.checkpoints import RunCheckpoints, fingerprint
from reasonrl.training.optimizer import make_optimizer
from reasonrl.training.validation import log_validation, timed_validation

if TYPE_CHECKING:
    from dvclive import Live
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reasonrl.config import EIConfig, EvalConfig
    from reasonrl.data import GSM8KExample
    from reasonrl.rollouts.engine import RolloutEngine
    from reasonrl.rollouts.types import Sample


def correct_pairs(
    questions: list[GSM8KExample], prompts: list[str], samples: list[list[Sample]], reward_fn: RewardFn
) -> tuple[list[Pair], int]:
    """The rollouts that earn reward 1 from ``reward_fn``, as SFT pairs, and how many questions have at least one."""
    kept: list[Pair] = []
    solved = 0
    for example, prompt, group in zip(questions, prompts, samples, strict=True):
        correct = [s.text for s in group if reward_fn(s.text, example.answer)["reward"] == 1.0]
        kept.extend(Pair(prompt, text) for text in correct)
        solved += bool(correct)
    return kept, solved


EI_STAGE = STAGES / "expert_iteration.py"


@dataclass
class EIState:
    """What a resumed expert iteration needs besides the weights: each round makes its own optimizer."""

    step: int = 0
    """Rounds completed."""
    skipped_rounds: int = 0
    best_accuracy: float = -1.0
    best_step: int | None = None
    best_interval: dict[str, Any] | None = None


def draw_round(
    engine: RolloutEngine,
    policy: PreTrainedModel,
    questions: list[GSM8KExample],
    prompts: list[str],
    config: EIConfig,
    stop: list[str],
    reward_fn: RewardFn,
    round_index: int,
    live: Live,
    ledger: CostLedger,
) -> tuple[list[Pair], int]:
    """Round ``round_index``'s rollouts: ``num_rollouts`` answers to each of ``questions`` (posed as ``prompts``) from
    the current policy, loaded into the engine for this phase (``ledger``'s ``rollout``); logs them, and returns the
    correct ones as SFT pairs and how many answers were sampled."""
    with ledger.timed("rollout"), engine.serving(policy):
        seed = step_seed(config.seed, round_index)
        samples = sample_groups(engine, prompts, config.sampling.num_rollouts, config, stop, seed)
    ledger.add_tokens("rollout", "generated", samples_tokens(sample for group in samples for sample in group))
    kept, solved = correct_pairs(questions, prompts, samples, reward_fn)
    lengths = [sample.length for group in samples for sample in group]
    live.log_metric("rollout/questions_with_correct", solved)
    live.log_metric("rollout/kept_pairs", len(kept))
    live.log_metric("rollout/response_length", sum(lengths) / len(lengths))
    return kept, len(lengths)


def fine_tune_round(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    kept: list[Pair],
    config: EIConfig,
    live: Live,
    ledger: CostLedger,
) -> None:
    """``sft_epochs`` of SFT on a round's ``kept`` pairs, with an optimizer and a schedule of the round's own; logs
    the means of its steps' metrics, and adds their cost to ``ledger``'s ``train``."""
    total = count_steps(len(kept), config.batching.batch_size, config.sft_epochs)
    optimizer, schedule = make_optimizer(policy, config.optimizer), sft_schedule(config, total)
    steps = sft_steps(policy, tokenizer, optimizer, schedule, kept, config, config.sft_epochs, ledger=ledger)
    step_metrics = list(steps)
    for name in ("train/loss", "train/entropy", "train/grad_norm", "time/tokens_per_second"):
        live.log_metric(name, sum(m[name] for m in step_metrics) / len(step_metrics))


def run_expert_iteration(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    engine: RolloutEngine,
    train: list[GSM8KExample],
    val: list[GSM8KExample],
    config: EIConfig,
    eval_config: EvalConfig,
    open_live: Callable[[bool], Live],
    live_dir: Path,
    checkpoint_dir: Path,
    init_model_dir: str | Path,
    rewards: Mapping[str, str] | None = None,
    ledger: CostLedger | None = None,
) -> BestCheckpoint:
    """``config.n_steps`` rounds; a round with no correct rollout is logged (``ei/skipped_rounds``) and makes no
    update. Validation after every round; returns the best round's weights. ``rewards[config.prompt]`` grades both the
    rollouts and the validation (None: the prompt's built-in).

    A resumable checkpoint (the weights, the best round's, the curves) goes to ``checkpoint_dir`` after every round
    but the last; a rerun continues from the newest one made from the same inputs
    (:func:`reasonrl.training.checkpoints.fingerprint`: the reward that filters the rollouts and grades validation
    among them). Every draw is a function of the seed and the round (questions, samples, data order, validation), so
    a round cut short by a crash is replayed as it would have run. The checkpoints stay after a completed run: call
    :func:`reasonrl.training.checkpoints.remove_checkpoints` once the outputs are saved. ``ledger``: what the run
    cost (its ``rollout``, ``train`` and ``validation`` phases, :mod:`reasonrl.cost`)."""
    ledger = CostLedger() if ledger is None else ledger  # a caller that keeps no account of the cost
    prompt, reward_fn = load_prompt(config.prompt), prompt_reward(config.prompt, rewards)
    question_rng = random.Random(config.seed)
    best = BestCheckpoint()
    device = next(policy.parameters()).device.type
    data = {"train": examples_digest(train), "val": examples_digest(val)}
    inputs = fingerprint("ei", config, eval_config, engine.config, init_model_dir, data, EI_STAGE, device, rewards)
    # No optimizer: each round makes its own.
    checkpoints = RunCheckpoints(checkpoint_dir, inputs, "expert iteration", EIState, policy, None, best, live_dir)
    state = checkpoints.resume()
    questions_per_round = min(config.sampling.questions_per_step, len(train))
    for _ in range(state.step):  # the rounds done drew their questions from the same stream
        question_rng.sample(train, questions_per_round)
    rounds = tqdm(
        range(state.step + 1, config.n_steps + 1),
        desc="expert iteration",
        unit="round",
        initial=state.step,
        total=config.n_steps,
    )
    with open_live(state.step > 0) as live:
        for round_index in rounds:
            live.step = round_index
            questions = question_rng.sample(train, questions_per_round)
            prompts = [prompt.render(example.question, tokenizer) for example in questions]
            kept, sampled = draw_round(
                engine, policy, questions, prompts, config, eval_config.stop, reward_fn, round_index, live, ledger
            )
            # A round that kept nothing has nothing to learn from.
            if kept:
                fine_tune_round(policy, tokenizer, kept, config, live, ledger)
            else:
                state.skipped_rounds += 1
                tqdm.write(f"expert iteration round {round_index}: no correct rollout among {sampled}; skipped")
            live.log_metric("ei/skipped_rounds", state.skipped_rounds)

            # Validate the round's weights.
            val_metrics = timed_validation(
                ledger,
                engine,
                policy,
                val,
                eval_config,
                config.eval_examples,
                config.prompt,
                seed=config.seed,
                rewards=rewards,
            ).metrics
            log_validation(live, val_metrics)
            best.offer(policy, val_metrics["accuracy"], round_index, interval=val_metrics["accuracy_interval"])
            live.next_step()
            state.step = round_index
            if is_checkpoint_step(round_index, 1, config.n_steps):
                checkpoints.save(state)
    return best

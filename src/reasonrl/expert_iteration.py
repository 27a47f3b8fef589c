"""Expert iteration (handout Algorithm 2, STaR-style): sample answers, keep the correct ones, fine-tune on them."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from tqdm import tqdm

from reasonrl.prompts import REWARD_FNS, RewardFn, load_prompt
from reasonrl.sft import BestCheckpoint, Pair, count_steps, log_validation, make_optimizer, sft_steps, validate

if TYPE_CHECKING:
    from dvclive import Live
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reasonrl.config import EIConfig, EvalConfig
    from reasonrl.data import GSM8KExample
    from reasonrl.rollout import RolloutEngine, Sample


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


def run_expert_iteration(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    engine: RolloutEngine,
    train: list[GSM8KExample],
    val: list[GSM8KExample],
    config: EIConfig,
    eval_config: EvalConfig,
    live: Live,
) -> BestCheckpoint:
    """``config.n_steps`` rounds; a round with no correct rollout is logged (``ei/skipped_rounds``) and makes no
    update. Validation after every round; returns the best round's weights."""
    prompt = load_prompt(config.prompt)
    question_rng = random.Random(config.seed)
    best = BestCheckpoint()
    skipped = 0
    for round_index in tqdm(range(1, config.n_steps + 1), desc="expert iteration", unit="round"):
        live.step = round_index
        # Sample G answers per question from the current policy, loaded into the engine for this phase.
        questions = question_rng.sample(train, min(config.questions_per_step, len(train)))
        prompts = [prompt.render(example.question, tokenizer) for example in questions]
        with engine.serving(policy):
            samples = engine.generate(
                prompts,
                n=config.num_rollouts,
                temperature=config.temperature,
                min_tokens=config.min_tokens,
                max_tokens=config.max_tokens,
                stop=eval_config.stop,
            )
        kept, solved = correct_pairs(questions, prompts, samples, REWARD_FNS[config.prompt])
        lengths = [sample.length for group in samples for sample in group]
        live.log_metric("rollout/questions_with_correct", solved)
        live.log_metric("rollout/kept_pairs", len(kept))
        live.log_metric("rollout/response_length", sum(lengths) / len(lengths))

        # Fine-tune on the kept pairs; a round that kept nothing has nothing to learn from.
        if kept:
            total = count_steps(len(kept), config.batch_size, config.sft_epochs)
            optimizer, schedule = make_optimizer(policy, config, total)
            step_metrics = list(sft_steps(policy, tokenizer, optimizer, schedule, kept, config, config.sft_epochs))
            for name in ("train/loss", "train/entropy", "train/grad_norm", "time/tokens_per_second"):
                live.log_metric(name, sum(m[name] for m in step_metrics) / len(step_metrics))
        else:
            skipped += 1
            tqdm.write(f"expert iteration round {round_index}: no correct rollout among {len(lengths)}; skipped")
        live.log_metric("ei/skipped_rounds", skipped)

        # Validate the round's weights.
        val_metrics = validate(engine, policy, val, eval_config, config.eval_examples, config.prompt).metrics
        log_validation(live, val_metrics)
        best.offer(policy, val_metrics["accuracy"], round_index, interval=val_metrics["accuracy_interval"])
        live.next_step()
    return best

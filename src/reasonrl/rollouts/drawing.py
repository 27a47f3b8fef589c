"""Drawing rollouts: questions, and a group of samples for each from an engine loaded with the policy.

Expert iteration and GRPO sample their groups through one function, :func:`sample_groups`, seeded per step (or round)
by :func:`step_seed`; :func:`draw_rollouts` is a GRPO step's whole draw, dynamic sampling included, and grades each
sample once (:func:`score_samples`): whatever reads a sample's reward later reads that grade.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tqdm import tqdm

from reasonrl.distributed import SINGLE, Ranks
from reasonrl.prompts import load_prompt
from reasonrl.rewards import ResponseInfo, prompt_reward
from reasonrl.rollouts.types import DrawnRollouts

if TYPE_CHECKING:
    from reasonrl.config import EIConfig, GRPOAsynchrony, GRPOConfig
    from reasonrl.data import GSM8KExample
    from reasonrl.rewards import RewardFn
    from reasonrl.rollouts.engine import RolloutEngine
    from reasonrl.rollouts.types import Sample, Scores


def step_seed(seed: int, step: int) -> int:
    """The seed of step (or round) ``step`` of a run seeded with ``seed``: a pure function of the two, so a resumed
    run replays every draw exactly."""
    return seed * 1_000_003 + step


def sample_groups(
    engine: RolloutEngine,
    prompts: list[str],
    group_size: int,
    config: EIConfig | GRPOConfig,
    stop: Sequence[str],
    seed: int,
    return_logprobs: bool = False,
) -> list[list[Sample]]:
    """``group_size`` samples for each prompt at ``config``'s temperature and lengths, seeded with ``seed``, nested
    ``[prompt][sample]``; with the sampled tokens' log-probs when ``return_logprobs``."""
    return engine.generate(
        prompts,
        n=group_size,
        temperature=config.sampling.temperature,
        min_tokens=config.sampling.min_tokens,
        max_tokens=config.sampling.max_tokens,
        stop=stop,
        seed=seed,
        return_logprobs=return_logprobs,
    )


def wants_engine_log_probs(asynchrony: GRPOAsynchrony) -> bool:
    """Whether the engine returns the sampled tokens' log-probs (μ): as π_old (``old_log_probs_from: engine``), or
    for the importance weight π_old / μ (``rollout_is_cap``)."""
    return asynchrony.old_log_probs_from == "engine" or asynchrony.rollout_is_cap is not None


def sample_rollouts(
    engine: RolloutEngine, questions: list[GSM8KExample], config: GRPOConfig, stop: list[str], seed: int
) -> tuple[list[str], list[Sample]]:
    """The prompts, and ``group_size`` samples per question, flattened group after group."""
    prompt, tokenizer = load_prompt(config.prompt), engine.tokenizer()
    prompts = [prompt.render(example.question, tokenizer) for example in questions]
    groups = sample_groups(
        engine, prompts, config.batching.group_size, config, stop, seed, wants_engine_log_probs(config.asynchrony)
    )
    return prompts, [sample for group in groups for sample in group]


def score_samples(
    questions: list[GSM8KExample], samples: list[Sample], group_size: int, reward_fn: RewardFn, max_tokens: int
) -> list[Scores]:
    """``reward_fn``'s grade of each of ``samples``, ``group_size`` answers to each of ``questions`` in turn, each
    with its :class:`reasonrl.rewards.ResponseInfo` (sampled with a budget of ``max_tokens``): ``reward_fn`` is a
    checked reward (:func:`reasonrl.rewards.prompt_reward`), which passes it on to a function that takes it."""
    answers = [question.answer for question in questions for _ in range(group_size)]
    return [
        reward_fn(sample.text, answer, info=ResponseInfo(len(sample.token_ids), sample.finish == "length", max_tokens))
        for sample, answer in zip(samples, answers, strict=True)
    ]


def draw_rollouts(
    engine: RolloutEngine,
    train: list[GSM8KExample],
    config: GRPOConfig,
    stop: list[str],
    step_seed: int,
    ranks: Ranks = SINGLE,
    rewards: Mapping[str, str] | None = None,
) -> DrawnRollouts:
    """``questions_per_step`` questions drawn with ``step_seed``, and a group of samples for each, each sample graded
    once by ``rewards[config.prompt]`` (None: the prompt's built-in): of this rank's data-parallel group's share of
    them, with the group's own sampling seed (the draw is the same on every rank, so the shares together are the
    questions one process would train on; each group of responses stays on one rank, or one tensor-parallel group,
    with its advantages).

    With ``dynamic_sampling`` (DAPO, arXiv:2503.14476) a group whose rewards are all equal, which has no advantage
    to learn from, is dropped, and up to ``max_sampling_rounds`` rounds draw further questions (not drawn before in
    this step) until the step has ``questions_per_step`` groups with signal. Short of that at the cap, the step
    trains on the groups it has, and says so (its last optimizer step at a learning rate scaled by its share of a
    train batch); with none at all it keeps the first round's groups, whose zero advantages make no update (see
    :func:`reasonrl.grpo.has_learning_signal`).
    Every draw and seed is a function of ``step_seed``: a resumed run replays it.
    """
    wanted = min(config.batching.questions_per_step, len(train))
    questions = ranks.share(random.Random(step_seed).sample(train, wanted))
    sampling_seed = step_seed * ranks.data_parallel_size + ranks.data_parallel_rank
    reward_fn, group = prompt_reward(config.prompt, rewards), config.batching.group_size
    grade = functools.partial(
        score_samples, group_size=group, reward_fn=reward_fn, max_tokens=config.sampling.max_tokens
    )
    prompts, samples = sample_rollouts(engine, questions, config, stop, sampling_seed)
    scores = grade(questions, samples)
    drawn = DrawnRollouts(
        questions, prompts, samples, scores, sampled_questions=questions, sampled_samples=samples, sampled_scores=scores
    )
    if not config.sampling.dynamic_sampling:
        return drawn
    kept = DrawnRollouts([], [], [], [], sampled_questions=[], sampled_samples=[], sampled_scores=[], sampling_rounds=0)
    used = set()
    while True:
        kept.sampling_rounds += 1
        used.update(id(question) for question in questions)
        kept.sampled_questions.extend(questions)
        kept.sampled_samples.extend(samples)
        kept.sampled_scores.extend(scores)
        for index, (question, prompt) in enumerate(zip(questions, prompts, strict=True)):
            of_question = slice(index * group, (index + 1) * group)
            group_rewards = {score["reward"] for score in scores[of_question]}
            if len(group_rewards) == 1 or len(kept.questions) == wanted:
                kept.dropped_groups += len(group_rewards) == 1
                continue
            kept.questions.append(question)
            kept.prompts.append(prompt)
            kept.samples.extend(samples[of_question])
            kept.scores.extend(scores[of_question])
        pool = [question for question in train if id(question) not in used]
        if len(kept.questions) == wanted or kept.sampling_rounds == config.sampling.max_sampling_rounds or not pool:
            break
        round_seed = step_seed * 1000 + kept.sampling_rounds
        questions = random.Random(round_seed).sample(pool, min(wanted, len(pool)))
        prompts, samples = sample_rollouts(engine, questions, config, stop, round_seed)
        scores = grade(questions, samples)
    if len(kept.questions) < wanted:
        fallback = "" if kept.questions else "; none has reward variance (no update from its advantages)"
        tqdm.write(
            f"GRPO: dynamic sampling found {len(kept.questions)} of {wanted} groups with reward variance in "
            f"{kept.sampling_rounds} rounds (grpo.max_sampling_rounds){fallback}"
        )
    if not kept.questions:
        return dataclasses.replace(
            kept, questions=drawn.questions, prompts=drawn.prompts, samples=drawn.samples, scores=drawn.scores
        )
    return kept

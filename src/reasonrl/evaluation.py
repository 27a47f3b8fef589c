"""The one evaluation function every stage uses: sample answers with the engine, grade them, summarise."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from reasonrl.cost import Tokens
from reasonrl.data import GSM8KExample
from reasonrl.prompts import ANSWER, load_prompt, vote_answer_fn
from reasonrl.rewards import MATH_VERIFY, prompt_reward
from reasonrl.rollouts.types import require_room, samples_tokens
from reasonrl.statistics import (
    INTERVAL_CLUSTERED,
    INTERVAL_WILSON,
    TEST_MCNEMAR,
    TEST_SIGN_FLIP,
    effective_sample_size,
    sign_flip_p_value,
    wilson_interval,
)
from reasonrl.symbolic import timeouts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from reasonrl.config import EvalConfig
    from reasonrl.rollouts.engine import RolloutEngine


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, Any]
    """See :func:`summarize`."""
    records: list[dict[str, Any]]
    """One per sample: question (and its index), prompt, response, ground_truth, the three rewards, the answer as
    a canonical number (or null), length (tokens)."""
    tokens: Tokens
    """What the engine processed for the answers (:class:`reasonrl.cost.Tokens`), for the stage's cost."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pass_at_k(samples: int, correct: int, k: int) -> float:
    """The unbiased pass@k of one question with ``correct`` of ``samples`` answers right: the chance that ``k``
    answers drawn without replacement hold at least one right one (Chen et al. 2021, arXiv:2107.03374). Counts no
    question can have (``k`` or ``correct`` outside ``1..samples`` and ``0..samples``) raise ValueError naming them.

    >>> pass_at_k(samples=4, correct=1, k=2)  # 3 of the 6 pairs miss the right answer
    0.5
    """
    if samples < 1:
        raise ValueError(f"pass_at_k: samples must be 1 or more, got {samples}")
    if not 0 <= correct <= samples:
        raise ValueError(f"pass_at_k: correct must lie in 0..samples (0..{samples}), got {correct}")
    if not 1 <= k <= samples:
        raise ValueError(f"pass_at_k: k must lie in 1..samples (1..{samples}), got {k}")
    if samples - correct < k:
        return 1.0
    return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


def per_question_metrics(records: list[dict[str, Any]]) -> dict[str, Any]:
    """With several samples per question: pass@k for k = 1, 2, 4, … up to the sample count (its mean over the
    questions), and majority-vote accuracy (the most frequent answer among the well-formed ones, ties to the one seen
    first, is graded; a question with no well-formed answer counts as wrong)."""
    by_question: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        by_question.setdefault(record["question_index"], []).append(record)
    samples = min(len(group) for group in by_question.values())
    ks = sorted({2**power for power in range(samples.bit_length()) if 2**power <= samples} | {samples})
    pass_at = {
        str(k): _mean([pass_at_k(len(g), sum(r["reward"] == 1.0 for r in g), k) for g in by_question.values()])
        for k in ks
    }
    majority_correct = 0
    for group in by_question.values():
        answers = [r["answer"] for r in group if r["answer"] is not None]
        if answers:
            voted = max(answers, key=answers.count)  # max keeps the first of equal counts
            majority_correct += next(r for r in group if r["answer"] == voted)["reward"] == 1.0
    return {
        "samples_per_question": samples,
        "pass_at_k": pass_at,
        "majority_accuracy": majority_correct / len(by_question),
    }


def _right_per_question(records: list[dict[str, Any]]) -> dict[int, list[bool]]:
    """Each question's answers, right or not, in the order of ``records`` (questions in order of first sample)."""
    by_question: dict[int, list[bool]] = {}
    for record in records:
        by_question.setdefault(record["question_index"], []).append(record["reward"] == 1.0)
    return by_question


def clustered_interval(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The 95% interval of the accuracy over ``records``, clustered by question (see ``reasonrl.statistics``):
    ``method``, ``effective_n`` (the independent answers the accuracy is worth), ``low`` and ``high``."""
    by_question = _right_per_question(records)
    correct = [sum(group) for group in by_question.values()]
    samples = [len(group) for group in by_question.values()]
    effective_n = effective_sample_size(correct, samples)
    low, high = wilson_interval(sum(correct) / len(records), effective_n)
    method = INTERVAL_WILSON if max(samples) == 1 else INTERVAL_CLUSTERED
    return {"method": method, "level": 0.95, "effective_n": effective_n, "low": low, "high": high}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy with its standard error and 95% interval, format rate, category counts and response lengths; with
    several samples per question also pass@k and majority-vote accuracy (:func:`per_question_metrics`).

    The standard error and the interval treat the question as the unit (:func:`clustered_interval`): with one sample
    per question they are the binomial ones over the ``n`` answers; with several, samples of one question count as
    ``effective_n / n`` of an independent answer each. Categories: ``correct`` (reward 1), ``format_only`` (format
    right, answer wrong), ``neither`` (format wrong; the answer is then not credited). Lengths are in tokens; a mean
    over no responses is null.
    """
    n = len(records)
    if n == 0:
        raise ValueError("no evaluation records to summarise")
    correct = [r for r in records if r["reward"] == 1.0]
    incorrect = [r for r in records if r["reward"] != 1.0]
    formatted = sum(r["format_reward"] == 1.0 for r in records)
    accuracy = len(correct) / n
    interval = clustered_interval(records)
    questions = len({r["question_index"] for r in records})
    return {
        "n": n,
        "questions": questions,
        "accuracy": accuracy,
        "accuracy_stderr": math.sqrt(accuracy * (1 - accuracy) / interval["effective_n"]),
        "accuracy_interval": interval,
        "format_rate": formatted / n,
        "categories": {"correct": len(correct), "format_only": formatted - len(correct), "neither": n - formatted},
        "response_length": {
            "all": _mean([r["length"] for r in records]),
            "correct": _mean([r["length"] for r in correct]),
            "incorrect": _mean([r["length"] for r in incorrect]),
        },
    } | (per_question_metrics(records) if questions < n else {})


def evaluate(
    engine: RolloutEngine,
    examples: list[GSM8KExample],
    prompt_name: str,
    config: EvalConfig,
    seed: int | None = None,
    progress: str | None = None,
    rewards: Mapping[str, str] | None = None,
    extraction: str = ANSWER,
) -> EvalResult:
    """Generate ``config.samples_per_question`` answers per question with ``prompt_name`` and grade them with
    that prompt's reward function, ``rewards[prompt_name]`` (params' ``rewards``; None: the built-in). ``seed``
    makes the sampling repeatable (None: the engine's running stream). ``progress`` labels a progress bar over the
    answers; None (validation inside a training loop, which has its own bar) shows none. The answer a majority vote
    counts is the prompt's built-in reading of the response, whichever function grades it; with ``extraction``
    ``boxed`` (a LaTeX benchmark's, :data:`reasonrl.prompts.EXTRACTIONS`) math-verify reads, and the vote counts, the
    boxed answer (:func:`reasonrl.prompts.vote_answer_fn`). Graded by ``math_verify``, the metrics count the answers
    whose grading ran out of time (``grading_timeouts``: wrong)."""
    prompt, answer_fn = load_prompt(prompt_name), vote_answer_fn(prompt_name, extraction)
    reward_fn = prompt_reward(prompt_name, rewards, extraction=extraction)
    examples = examples[: config.num_examples]
    tokenizer = engine.tokenizer()
    prompts = [prompt.render(example.question, tokenizer) for example in examples]
    outputs = engine.generate(
        prompts,
        n=config.samples_per_question,
        temperature=config.temperature,
        top_p=config.top_p,
        max_tokens=config.max_tokens,
        min_tokens=config.min_tokens,
        stop=config.stop,
        seed=seed,
        progress=progress,
    )
    timeouts_before = timeouts()
    records = []
    for index, (example, prompt, samples) in enumerate(zip(examples, prompts, outputs, strict=True)):
        for sample in samples:
            records.append(
                {
                    "question_index": index,
                    "question": example.question,
                    "prompt": prompt,
                    "response": sample.text,
                    "ground_truth": example.answer,
                    **reward_fn(sample.text, example.answer),
                    "answer": answer_fn(sample.text),
                    "length": sample.length,
                }
            )
    metrics = summarize(records)
    if (rewards or {}).get(prompt_name) == MATH_VERIFY:
        metrics["grading_timeouts"] = timeouts() - timeouts_before
    tokens = samples_tokens(sample for samples in outputs for sample in samples)
    return EvalResult(metrics=metrics, records=records, tokens=tokens)


Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class EvalTask:
    """One held-out set sampled one way, which :func:`evaluate_checkpoints` runs for every model."""

    examples: list[GSM8KExample]
    config: EvalConfig
    """The sampling (``eval.*``, or under one of ``eval.protocols``); every question is asked (``num_examples``
    is ignored)."""
    rewards: Mapping[str, str] | None = None
    """Each prompt's reward spec (params' ``rewards``); None: the built-ins."""
    extraction: str = ANSWER
    """Where math-verify reads each answer (:func:`evaluate`): the set's benchmark declares it."""


def check_room(
    tasks: Mapping[Hashable, EvalTask],
    prompt_names: Mapping[str, str],
    tokenizer: PreTrainedTokenizerBase,
    max_model_len: int,
) -> None:
    """Every question of every task, in every route's prompt, leaves room for its longest answer within
    ``max_model_len`` (``rollout.max_model_len``). The engine checks each batch as it generates; checked here for all
    of them before a model loads, a benchmark's long question stops final_eval at once rather than after the sets
    before it were evaluated. Counted as the engine counts a text prompt (special tokens included)."""
    lengths: dict[tuple[int, str], list[int]] = {}  # the protocols of one set share its questions
    for key, task in tasks.items():
        for prompt_name in sorted(set(prompt_names.values())):
            cached = lengths.setdefault((id(task.examples), prompt_name), [])
            if not cached:
                prompt = load_prompt(prompt_name)
                cached += [len(tokenizer.encode(prompt.render(e.question, tokenizer))) for e in task.examples]
            for number, tokens in enumerate(cached, start=1):
                require_room(
                    tokens,
                    task.config.max_tokens,
                    max_model_len,
                    prompt=f"question {number} of {key} ({tokens} tokens in prompt {prompt_name})",
                    answer_param="eval.max_tokens",
                    other_fixes=", lower eval.max_tokens or leave the set out",
                )


def evaluate_checkpoints(
    engine: RolloutEngine,
    model_dirs: Mapping[str, str | Path],
    tasks: Mapping[Key, EvalTask],
    prompt_names: Mapping[str, str],
    seed: int,
) -> dict[Key, dict[str, EvalResult]]:
    """Evaluate each model of ``model_dirs`` (same architecture and tokenizer as the engine's) on each of ``tasks``
    with the prompt it was trained with, ``prompt_names[name]``, graded by that prompt's reward (the task's
    ``rewards``, as :func:`evaluate`): ``{task: {model: result}}``. Each model is loaded into the engine once, then
    every task runs on it with the same seed, so a task's answers do not depend on the tasks before it; a progress
    bar per task, labelled by model and task (``str(key)``). Each summary records its ``prompt``."""
    import torch
    from transformers import AutoModelForCausalLM

    device = engine.policy_device()  # where the training stages keep their policy: loading there is fastest
    dtype = getattr(torch, engine.config.dtype)  # the weights only pass through, into the engine
    results: dict[Key, dict[str, EvalResult]] = {task: {} for task in tasks}
    for name, model_dir in model_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        engine.sync_weights(model)
        del model
        for task_name, task in tasks.items():
            full = dataclasses.replace(task.config, num_examples=None)
            label = name if len(tasks) == 1 else f"{name} {task_name}"
            prompt = prompt_names[name]
            result = evaluate(
                engine, task.examples, prompt, full, seed, label, rewards=task.rewards, extraction=task.extraction
            )
            results[task_name][name] = EvalResult({**result.metrics, "prompt": prompt}, result.records, result.tokens)
    return results


def paired_comparison(records: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, Any]:
    """Answer by answer against ``reference`` (the same questions, samples and seed): how often only one of the two
    was right; question by question, on how many each had more right answers; and the p-value of ``test`` for
    "equally accurate". With one sample per question the test is McNemar's exact test; with several, the exact
    sign-flip test over the per-question differences in right answers, since samples of a question are not
    independent (``reasonrl.statistics``)."""
    if [r["question_index"] for r in records] != [r["question_index"] for r in reference]:
        raise ValueError("paired comparison needs the same questions and samples per question in both evaluations")
    only_this = sum(a["reward"] == 1.0 and b["reward"] != 1.0 for a, b in zip(records, reference, strict=True))
    only_reference = sum(a["reward"] != 1.0 and b["reward"] == 1.0 for a, b in zip(records, reference, strict=True))
    these, theirs = _right_per_question(records), _right_per_question(reference)
    differences = [sum(these[q]) - sum(theirs[q]) for q in these]
    several = max(len(group) for group in these.values()) > 1
    return {
        "only_this_right": only_this,
        "only_reference_right": only_reference,
        "questions_this_better": sum(d > 0 for d in differences),
        "questions_reference_better": sum(d < 0 for d in differences),
        "test": TEST_SIGN_FLIP if several else TEST_MCNEMAR,
        "p_value": sign_flip_p_value(differences),
    }


def add_paired_comparisons(results: dict[str, EvalResult], references: Mapping[str, str]) -> None:
    """Add to each result's metrics ``paired`` against the model it started from (``references[name]``, when that
    model was evaluated too), with ``reference`` naming it."""
    for name, reference in references.items():
        if name in results and reference in results:
            paired = paired_comparison(results[name].records, results[reference].records)
            results[name].metrics["paired"] = {"reference": reference, **paired}


def question_accuracies(records: list[dict[str, Any]]) -> list[float]:
    """Each question's share of right answers, questions in the order of their first sample."""
    return [sum(group) / len(group) for group in _right_per_question(records).values()]

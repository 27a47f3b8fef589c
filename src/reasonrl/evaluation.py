"""The one evaluation function every stage uses: sample answers with the engine, grade them, summarise."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reasonrl.data import GSM8KExample
from reasonrl.prompts import REWARD_FNS, format_prompt, load_prompt

if TYPE_CHECKING:
    from reasonrl.config import EvalConfig
    from reasonrl.rollout import RolloutEngine


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, Any]
    """See :func:`summarize`."""
    records: list[dict[str, Any]]
    """One per sample: question, prompt, response, ground_truth, the three rewards, length (tokens)."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy (with its standard error), format rate, category counts and response lengths.

    Categories: ``correct`` (reward 1), ``format_only`` (format right, answer wrong), ``neither`` (format
    wrong; the answer is then not credited). Lengths are in tokens; a mean over no responses is null.
    """
    n = len(records)
    if n == 0:
        raise ValueError("no evaluation records to summarise")
    correct = [r for r in records if r["reward"] == 1.0]
    incorrect = [r for r in records if r["reward"] != 1.0]
    formatted = sum(r["format_reward"] == 1.0 for r in records)
    accuracy = len(correct) / n
    return {
        "n": n,
        "accuracy": accuracy,
        "accuracy_stderr": math.sqrt(accuracy * (1 - accuracy) / n),
        "format_rate": formatted / n,
        "categories": {"correct": len(correct), "format_only": formatted - len(correct), "neither": n - formatted},
        "response_length": {
            "all": _mean([r["length"] for r in records]),
            "correct": _mean([r["length"] for r in correct]),
            "incorrect": _mean([r["length"] for r in incorrect]),
        },
    }


def evaluate(
    engine: RolloutEngine,
    examples: list[GSM8KExample],
    prompt_name: str,
    config: EvalConfig,
    seed: int | None = None,
) -> EvalResult:
    """Generate ``config.samples_per_question`` answers per question with ``prompt_name`` and grade them with
    that prompt's reward function. ``seed`` makes the sampling repeatable (None: the engine's running stream)."""
    template, reward_fn = load_prompt(prompt_name), REWARD_FNS[prompt_name]
    examples = examples[: config.num_examples]
    prompts = [format_prompt(template, example.question) for example in examples]
    outputs = engine.generate(
        prompts,
        n=config.samples_per_question,
        temperature=config.temperature,
        top_p=config.top_p,
        max_tokens=config.max_tokens,
        min_tokens=config.min_tokens,
        stop=config.stop,
        seed=seed,
    )
    records = []
    for example, prompt, samples in zip(examples, prompts, outputs, strict=True):
        for sample in samples:
            records.append(
                {
                    "question": example.question,
                    "prompt": prompt,
                    "response": sample.text,
                    "ground_truth": example.answer,
                    **reward_fn(sample.text, example.answer),
                    "length": sample.length,
                }
            )
    return EvalResult(metrics=summarize(records), records=records)


def evaluate_checkpoints(
    engine: RolloutEngine,
    model_dirs: Mapping[str, str | Path],
    examples: list[GSM8KExample],
    prompt_names: Mapping[str, str],
    config: EvalConfig,
    seed: int,
) -> dict[str, EvalResult]:
    """Evaluate each model of ``model_dirs`` (same architecture and tokenizer as the engine's) on all of
    ``examples`` with the prompt (and its reward function) it was trained with, ``prompt_names[name]``; one after
    another in the same engine, with identical sampling settings and seed. Each summary records its ``prompt``."""
    import torch
    from transformers import AutoModelForCausalLM

    device = engine.policy_device()  # where the training stages keep their policy: loading there is fastest
    dtype = getattr(torch, engine.config.dtype)  # the weights only pass through, into the engine
    full = dataclasses.replace(config, num_examples=None)
    results = {}
    for name, model_dir in model_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        engine.sync_weights(model)
        del model
        result = evaluate(engine, examples, prompt_names[name], full, seed=seed)
        results[name] = EvalResult({**result.metrics, "prompt": prompt_names[name]}, result.records)
    return results

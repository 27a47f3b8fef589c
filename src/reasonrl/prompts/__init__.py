"""The prompt templates shipped with the package (``<name>.prompt``, with a ``{question}`` placeholder), each with
the reward function that grades answers to it: the one registry of prompt names that params, evaluation and
training read."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from reasonrl.grading import question_only_answer, question_only_reward_fn, r1_zero_answer, r1_zero_reward_fn

RewardFn = Callable[[str, str], dict[str, float]]

REWARD_FNS: dict[str, RewardFn] = {
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
}
"""Each prompt's reward function: ``r1_zero`` wants ``</think> <answer> N </answer>``, ``question_only`` a final
number (the last ``\\boxed{}``, else the last number)."""
PROMPT_NAMES: tuple[str, ...] = tuple(REWARD_FNS)
ANSWER_FNS: dict[str, Callable[[str], str | None]] = {
    "r1_zero": r1_zero_answer,
    "question_only": question_only_answer,
}
"""Each prompt's answer as a canonical number string (the reward function's reading of it), for majority votes."""


def load_prompt(name: str) -> str:
    """The template text of prompt ``name`` (one of :data:`PROMPT_NAMES`)."""
    if name not in PROMPT_NAMES:
        raise ValueError(f"unknown prompt {name!r}; choose one of {', '.join(PROMPT_NAMES)}")
    return resources.files(__package__).joinpath(f"{name}.prompt").read_text(encoding="utf-8")


def format_prompt(template: str, question: str) -> str:
    """Fill the template's ``{question}``; other braces in the question are kept literally."""
    return template.replace("{question}", question)

"""The package's public surface: the eleven core functions, the reward functions, the prompts."""

import pytest

import reasonrl
from reasonrl.prompts import format_prompt, load_prompt

CORE = [
    "tokenize_prompt_and_output",
    "compute_entropy",
    "get_response_log_probs",
    "masked_normalize",
    "sft_microbatch_train_step",
    "compute_group_normalized_rewards",
    "compute_naive_policy_gradient_loss",
    "compute_grpo_clip_loss",
    "compute_policy_gradient_loss",
    "masked_mean",
    "grpo_microbatch_train_step",
]


def test_core_functions_importable_from_top_level():
    for name in CORE:
        assert callable(getattr(reasonrl, name)), name
    assert sorted(reasonrl.__all__) == sorted(CORE)


def test_reward_functions_importable():
    from reasonrl.grading import question_only_reward_fn, r1_zero_reward_fn

    assert callable(r1_zero_reward_fn) and callable(question_only_reward_fn)


def test_r1_zero_prompt_ends_by_opening_the_thought():
    prompt = format_prompt(load_prompt("r1_zero"), "What is 2+3?")
    assert prompt.startswith("A conversation between User and Assistant.")
    assert "\nUser: What is 2+3?\nAssistant: <think>" in prompt
    assert prompt.endswith("Assistant: <think>")


def test_question_only_prompt_is_the_question():
    assert format_prompt(load_prompt("question_only"), "What is {x}?") == "What is {x}?"


def test_unknown_prompt_is_rejected():
    with pytest.raises(ValueError, match="unknown prompt 'cot'"):
        load_prompt("cot")

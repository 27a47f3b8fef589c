"""The package's public surface: the eleven core functions, the reward functions, the prompts."""

import inspect

import pytest
import torch

import reasonrl
from reasonrl.prompts import load_prompt

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
    prompt = load_prompt("r1_zero").render("What is 2+3?", tokenizer=None)  # a plain prompt needs no tokenizer
    assert prompt.startswith("A conversation between User and Assistant.")
    assert "\nUser: What is 2+3?\nAssistant: <think>" in prompt
    assert prompt.endswith("Assistant: <think>")


def test_question_only_prompt_is_the_question():
    assert load_prompt("question_only").render("What is {x}?", tokenizer=None) == "What is {x}?"


def test_unknown_prompt_is_rejected():
    with pytest.raises(ValueError, match="unknown prompt 'cot'"):
        load_prompt("cot")


# CS336 assignment 5's signatures (spring 2025, the adapters its tests call): parameter names in order, and the
# defaults the handout gives. ``REQUIRED`` marks a parameter without a default.
REQUIRED = object()
HANDOUT_SIGNATURES = {
    "tokenize_prompt_and_output": {"prompt_strs": REQUIRED, "output_strs": REQUIRED, "tokenizer": REQUIRED},
    "compute_entropy": {"logits": REQUIRED},
    "get_response_log_probs": {
        "model": REQUIRED, "input_ids": REQUIRED, "labels": REQUIRED, "return_token_entropy": False,
    },
    "masked_normalize": {"tensor": REQUIRED, "mask": REQUIRED, "dim": None, "normalize_constant": 1.0},
    "sft_microbatch_train_step": {
        "policy_log_probs": REQUIRED, "response_mask": REQUIRED, "gradient_accumulation_steps": REQUIRED,
        "normalize_constant": 1.0,
    },
    "compute_group_normalized_rewards": {
        "reward_fn": REQUIRED, "rollout_responses": REQUIRED, "repeated_ground_truths": REQUIRED,
        "group_size": REQUIRED, "advantage_eps": REQUIRED, "normalize_by_std": REQUIRED,
    },
    "compute_naive_policy_gradient_loss": {"raw_rewards_or_advantages": REQUIRED, "policy_log_probs": REQUIRED},
    "compute_grpo_clip_loss": {
        "advantages": REQUIRED, "policy_log_probs": REQUIRED, "old_log_probs": REQUIRED, "cliprange": REQUIRED,
    },
    "compute_policy_gradient_loss": {
        "policy_log_probs": REQUIRED, "loss_type": REQUIRED, "raw_rewards": None, "advantages": None,
        "old_log_probs": None, "cliprange": None,
    },
    "masked_mean": {"tensor": REQUIRED, "mask": REQUIRED, "dim": None},
    "grpo_microbatch_train_step": {
        "policy_log_probs": REQUIRED, "response_mask": REQUIRED, "gradient_accumulation_steps": REQUIRED,
        "loss_type": REQUIRED, "raw_rewards": None, "advantages": None, "old_log_probs": None, "cliprange": None,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", CORE)
def test_core_function_has_the_handout_signature(name):
    """The handout's parameters come first, in its order, with its defaults: a call written for the handout,
    positional or by keyword, means the same here. Parameters beyond the handout's follow, each with a default."""
    parameters = list(inspect.signature(getattr(reasonrl, name)).parameters.values())
    handout = HANDOUT_SIGNATURES[name]
    assert [p.name for p in parameters[: len(handout)]] == list(handout), name
    for parameter in parameters[: len(handout)]:
        expected = inspect.Parameter.empty if handout[parameter.name] is REQUIRED else handout[parameter.name]
        assert parameter.default == expected, f"{name}({parameter.name}=…)"
        assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, f"{name}({parameter.name})"
    assert all(p.default is not inspect.Parameter.empty for p in parameters[len(handout) :]), name


def test_handout_positional_calls_mean_what_the_handout_says():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    assert reasonrl.masked_normalize(values, mask, 1, 2.0).tolist() == [2.0, 5.5]  # dim=1, constant 2
    assert reasonrl.masked_normalize(values, mask).item() == 15.0  # everything, over 1
    log_probs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = reasonrl.sft_microbatch_train_step(log_probs, torch.ones(1, 2), 1, None)  # None: no normalisation
    assert loss.item() == 3.0

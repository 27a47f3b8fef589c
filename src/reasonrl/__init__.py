"""reasonrl: zero-shot, SFT, expert iteration and GRPO on GSM8K, as a reproducible pipeline.

The algorithm core follows CS336 assignment 5's names, signatures and semantics.
"""

from reasonrl.logprobs import compute_entropy, get_response_log_probs
from reasonrl.losses import (
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
    grpo_microbatch_train_step,
    masked_mean,
    masked_normalize,
    sft_microbatch_train_step,
)
from reasonrl.tokenization import tokenize_prompt_and_output

__all__ = [
    "compute_entropy",
    "compute_grpo_clip_loss",
    "compute_group_normalized_rewards",
    "compute_naive_policy_gradient_loss",
    "compute_policy_gradient_loss",
    "get_response_log_probs",
    "grpo_microbatch_train_step",
    "masked_mean",
    "masked_normalize",
    "sft_microbatch_train_step",
    "tokenize_prompt_and_output",
]

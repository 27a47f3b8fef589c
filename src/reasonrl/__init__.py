"""reasonrl: zero-shot, SFT, expert iteration and GRPO on GSM8K, as a reproducible pipeline.

The algorithm core follows CS336 assignment 5's names, signatures and semantics. Its functions are exported here
lazily: importing the package (as every stage does, ``download`` included) loads neither torch nor transformers.
"""

from importlib import import_module

_EXPORTS = {
    "compute_entropy": "reasonrl.logprobs",
    "get_response_log_probs": "reasonrl.logprobs",
    "compute_group_normalized_rewards": "reasonrl.losses",
    "compute_grpo_clip_loss": "reasonrl.losses",
    "compute_naive_policy_gradient_loss": "reasonrl.losses",
    "compute_policy_gradient_loss": "reasonrl.losses",
    "grpo_microbatch_train_step": "reasonrl.losses",
    "masked_mean": "reasonrl.losses",
    "masked_normalize": "reasonrl.losses",
    "sft_microbatch_train_step": "reasonrl.losses",
    "tokenize_prompt_and_output": "reasonrl.tokenization",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'reasonrl' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

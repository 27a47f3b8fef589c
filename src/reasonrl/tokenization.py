"""Prompt/response tokenization for causal-LM training."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase


def tokenize_prompt_and_output(
    prompt_strs: list[str], output_strs: list[str], tokenizer: PreTrainedTokenizerBase
) -> dict[str, torch.Tensor]:
    """Tokenize prompts and outputs separately, concatenate, and build next-token training tensors.

    Tokenizing separately keeps the prompt/response boundary exact (joint tokenization can merge tokens across it).
    Sequences are right-padded with ``tokenizer.pad_token_id`` to the longest prompt+output.

    Returns:
        input_ids: ``[B, L-1]`` the concatenation without its last token.
        labels: ``[B, L-1]`` the concatenation without its first token (the next-token targets).
        response_mask: ``[B, L-1]`` bool, True where ``labels`` is a response token (not prompt, not padding).
    """
    if len(prompt_strs) != len(output_strs):
        raise ValueError(f"got {len(prompt_strs)} prompts but {len(output_strs)} outputs; they must pair up")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad_token_id; set one before tokenizing batches")
    prompts = tokenizer(prompt_strs, add_special_tokens=False)["input_ids"]
    outputs = tokenizer(output_strs, add_special_tokens=False)["input_ids"]
    return batch_from_token_ids(prompts, outputs, tokenizer.pad_token_id)


def batch_from_token_ids(
    prompt_ids: list[list[int]], output_ids: list[list[int]], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """:func:`tokenize_prompt_and_output` for sequences already tokenized, e.g. the exact ids a rollout sampled
    (re-tokenizing its text need not give them back)."""
    length = max(len(p) + len(o) for p, o in zip(prompt_ids, output_ids, strict=True))
    full = torch.full((len(prompt_ids), length), pad_token_id, dtype=torch.long)  # [B, L]
    is_response = torch.zeros((len(prompt_ids), length), dtype=torch.bool)  # [B, L]
    for row, (prompt, output) in enumerate(zip(prompt_ids, output_ids, strict=True)):
        full[row, : len(prompt) + len(output)] = torch.tensor(prompt + output, dtype=torch.long)
        is_response[row, len(prompt) : len(prompt) + len(output)] = True
    return {"input_ids": full[:, :-1], "labels": full[:, 1:], "response_mask": is_response[:, 1:]}

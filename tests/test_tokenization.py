"""tokenize_prompt_and_output: separate tokenization, shift by one, response mask, right padding."""

import pytest
import torch

from reasonrl import tokenize_prompt_and_output


def test_shapes_shift_mask_and_padding(tiny_tokenizer):
    prompts = ["User: 2+3?", "User: what is 48/2 and then some more?"]
    outputs = [" 5 </answer>", " 24"]
    batch = tokenize_prompt_and_output(prompts, outputs, tiny_tokenizer)

    prompt_ids = [tiny_tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    output_ids = [tiny_tokenizer(o, add_special_tokens=False)["input_ids"] for o in outputs]
    full = [p + o for p, o in zip(prompt_ids, output_ids, strict=True)]
    length = max(map(len, full))
    pad = tiny_tokenizer.pad_token_id

    assert batch["input_ids"].shape == batch["labels"].shape == batch["response_mask"].shape == (2, length - 1)
    for row, ids in enumerate(full):
        padded = ids + [pad] * (length - len(ids))
        assert batch["input_ids"][row].tolist() == padded[:-1]
        assert batch["labels"][row].tolist() == padded[1:]
        expected_mask = [len(prompt_ids[row]) - 1 <= t < len(ids) - 1 for t in range(length - 1)]
        assert batch["response_mask"][row].tolist() == expected_mask
    # the masked labels are exactly the output tokens
    for row in range(2):
        assert batch["labels"][row][batch["response_mask"][row]].tolist() == output_ids[row]
    assert batch["response_mask"].dtype == torch.bool


def test_tag_tokens_survive_as_single_tokens(tiny_tokenizer):
    ids = tiny_tokenizer("</think> <answer> 72 </answer>", add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.convert_tokens_to_ids("</answer>") in ids
    assert tiny_tokenizer.decode(ids) == "</think> <answer> 72 </answer>"


def test_mismatched_lengths_are_rejected(tiny_tokenizer):
    with pytest.raises(ValueError, match="2 prompts but 1 outputs"):
        tokenize_prompt_and_output(["a", "b"], ["c"], tiny_tokenizer)

"""Entropy and response log-probs against plain log_softmax on a tiny random Qwen2."""

import math

import pytest
import torch

from reasonrl import compute_entropy, get_response_log_probs, tokenize_prompt_and_output


def test_entropy_of_known_distributions():
    uniform = torch.zeros(3, 8)
    assert torch.allclose(compute_entropy(uniform), torch.full((3,), math.log(8)))
    peaked = torch.tensor([[1000.0, 0.0, 0.0]])  # softmax underflows to one-hot: p·log p would give NaN
    assert compute_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)
    two_way = torch.tensor([[0.0, 0.0, -1e4]])
    assert compute_entropy(two_way).item() == pytest.approx(math.log(2), abs=1e-6)


def test_entropy_matches_definition_on_random_logits():
    logits = torch.randn(2, 5, 17, generator=torch.Generator().manual_seed(0)) * 3
    log_p = torch.log_softmax(logits, dim=-1)
    expected = -(log_p.exp() * log_p).sum(-1)
    assert torch.allclose(compute_entropy(logits), expected, atol=1e-5)


def test_response_log_probs_equal_log_softmax_at_labels(tiny_model, tiny_tokenizer):
    batch = tokenize_prompt_and_output(
        ["User: 48/2?", "User: how many clips in May?"], [" 24 </answer>", " 72"], tiny_tokenizer
    )
    result = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], return_token_entropy=True)
    with torch.no_grad():
        logits = tiny_model(batch["input_ids"]).logits
    expected = torch.log_softmax(logits, dim=-1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    assert result["log_probs"].shape == batch["labels"].shape
    assert torch.allclose(result["log_probs"], expected, atol=1e-5)
    assert torch.allclose(result["token_entropy"], compute_entropy(logits), atol=1e-5)
    assert not result["token_entropy"].requires_grad
    assert result["log_probs"].requires_grad  # training differentiates through it


def test_entropy_is_optional(tiny_model, tiny_tokenizer):
    batch = tokenize_prompt_and_output(["a"], [" b"], tiny_tokenizer)
    assert set(get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"])) == {"log_probs"}

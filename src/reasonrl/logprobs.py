"""Per-token log-probabilities and entropies of a causal LM's responses."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def compute_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position, ``[..., V]`` → ``[...]``.

    Uses ``H = logsumexp(z) - sum(softmax(z) * z)``: no log of a probability that underflows to 0, so the
    result stays finite for extreme logits where ``-sum(p * log p)`` gives NaN.
    """
    log_normalizer = torch.logsumexp(logits, dim=-1)  # [...]
    probs = torch.softmax(logits, dim=-1)  # [..., V]
    return log_normalizer - (probs * logits).sum(dim=-1)


def get_response_log_probs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    return_token_entropy: bool = False,
) -> dict[str, torch.Tensor]:
    """Log-probabilities ``log p(labels[t] | input_ids[:t+1])`` under ``model``, ``[B, T]``.

    The label's logit minus the log-normaliser avoids materialising a full ``[B, T, V]`` ``log_softmax``.
    ``token_entropy`` (``[B, T]``, when asked) is a diagnostic: computed without gradient, so it costs no
    activation memory in the backward pass.
    """
    logits = model(input_ids).logits  # [B, T, V]
    label_logits = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [B, T]
    log_probs = label_logits - torch.logsumexp(logits, dim=-1)  # [B, T]
    result = {"log_probs": log_probs}
    if return_token_entropy:
        with torch.no_grad():
            result["token_entropy"] = compute_entropy(logits)
    return result

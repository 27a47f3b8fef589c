"""How one optimizer step's sequences are cut into microbatches: a memory setting that never changes the gradient.

Fixed microbatches (``microbatch_tokens`` null, the handout's) take ``microbatch_size`` sequences at a time in the
step's order, each padded to its longest member. With a token budget, the step's sequences are sorted longest first
and each microbatch takes sequences while ``rows × its longest length`` stays within the budget: short responses
share a microbatch instead of being padded to a long neighbour, and the GPU gets large matmuls. The longest
microbatch comes first, so a budget that does not fit fails at once. The losses weight each microbatch by its share
of the step (sequences for GRPO, response tokens for SFT), so any split gives the same gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reasonrl.cost import Tokens


def split_microbatches(
    rows: Sequence[int], lengths: Sequence[int], microbatch_size: int, microbatch_tokens: int | None
) -> list[list[int]]:
    """Cut ``rows`` (indices into a batch whose sequence ``i`` has ``lengths[i]`` tokens) into microbatches.

    ``microbatch_tokens`` null: consecutive chunks of ``microbatch_size`` rows in the given order. Otherwise rows
    sorted by length, longest first (ties in the given order), each microbatch as many rows as fit
    ``len(rows) × longest <= microbatch_tokens``; a sequence longer than the budget gets a microbatch of its own.
    """
    if microbatch_tokens is None:
        return chunks(rows, microbatch_size)
    parts: list[list[int]] = []
    for row in sorted(rows, key=lambda index: -lengths[index]):
        # Sorted longest first: the current microbatch's first row is its longest.
        if parts and (len(parts[-1]) + 1) * lengths[parts[-1][0]] <= microbatch_tokens:
            parts[-1].append(row)
        else:
            parts.append([row])
    return parts


def chunks(items: Sequence[int], size: int) -> list[list[int]]:
    """Consecutive slices of ``size`` items (the last one shorter when ``size`` does not divide them)."""
    items = list(items)
    return [items[start : start + size] for start in range(0, len(items), size)]


def sequence_lengths(response_mask: torch.Tensor) -> list[int]:
    """Tokens per row of a right-padded ``[B, T]`` training batch, up to and including its last response token (the
    width a microbatch holding the row is trimmed to)."""
    last = response_mask.shape[1] - response_mask.flip(1).int().argmax(dim=1)  # [B]
    return torch.where(response_mask.any(dim=1), last, 0).tolist()  # a row without response tokens: 0


def trained_tokens(response_mask: torch.Tensor, rows: Sequence[int] | None = None) -> Tokens:
    """The positions a training forward runs over in ``rows`` (None: all) of a right-padded ``[B, T]`` batch,
    padding excluded: each row's response labels, and the prompt positions before them
    (:class:`reasonrl.cost.Tokens`)."""
    mask = response_mask if rows is None else response_mask[list(rows)]
    response = int(mask.sum())
    return Tokens(sum(sequence_lengths(mask)) - response, response)


def trim_to_rows(tensors: dict[str, torch.Tensor], rows: Sequence[int]) -> dict[str, torch.Tensor]:
    """The ``[b, T']`` slices of ``rows``, with the columns that are padding in all of them dropped."""
    mask = tensors["response_mask"][list(rows)]  # [b, T]
    width = int(mask.any(dim=0).nonzero().max()) + 1
    return {name: tensor[list(rows), :width] for name, tensor in tensors.items()}

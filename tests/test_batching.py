"""Microbatch splits: fixed chunks in order, or length-sorted microbatches filled up to a token budget."""

import pytest
import torch

from reasonrl.batching import sequence_lengths, split_microbatches, trim_to_rows

LENGTHS = [5, 30, 12, 30, 7, 100]


def test_fixed_microbatches_keep_the_order():
    assert split_microbatches([3, 1, 4, 0, 5, 2], LENGTHS, 4, None) == [[3, 1, 4, 0], [5, 2]]


def test_token_budget_sorts_longest_first_and_fills_up_to_rows_times_longest():
    parts = split_microbatches(range(6), LENGTHS, 1, 64)
    # 100 exceeds the budget on its own; 2 × 30 = 60 fits, 3 × 30 does not; 3 × 12 = 36 fits, 4 × 12 does not.
    assert parts == [[5], [1, 3], [2, 4, 0]]
    for part in parts[1:]:
        assert len(part) * max(LENGTHS[row] for row in part) <= 64


@pytest.mark.parametrize("budget", [1, 17, 64, 1000])
def test_token_budget_uses_every_row_exactly_once(budget):
    rows = [4, 0, 5, 2]
    parts = split_microbatches(rows, LENGTHS, 1, budget)
    assert sorted(row for part in parts for row in part) == sorted(rows)


def test_sequence_lengths_run_to_the_last_response_token_and_trim_drops_shared_padding():
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    assert sequence_lengths(mask) == [3, 5, 0]
    ids = torch.arange(15).view(3, 5)
    trimmed = trim_to_rows({"input_ids": ids, "response_mask": mask}, [0])
    assert trimmed["input_ids"].tolist() == [[0, 1, 2]]

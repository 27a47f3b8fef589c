"""One rank of the token_mean test over two ranks (``tests/test_loss_menu.py`` starts it under
``torch.distributed.run``): it trains its half of one optimizer step's rows through ``accumulate_gradients`` (DDP,
gloo) with ``loss_aggregation: token_mean`` and writes the step's loss and the reduced gradients.

    python -m torch.distributed.run --nproc-per-node 2 tests/loss_menu_worker.py MODEL_DIR OUT_DIR

No engine: the rows are fixed token ids (:func:`uneven_batch`), so the test runs in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from reasonrl.batching import sequence_lengths
from reasonrl.config import DistributedConfig, GRPOConfig
from reasonrl.distributed import init_ranks, wrap_for_training
from reasonrl.grpo import FixedLogProbs, Forwards, RolloutBatch, accumulate_gradients
from reasonrl.tokenization import batch_from_token_ids
from reasonrl.training.policy import load_policy

# A 10-token budget: rank 0's short rows fill 2 microbatches, rank 1's long ones 4 (it pads rank 0 with empty ones).
CONFIG = GRPOConfig(
    rollout_batch_size=8, group_size=4, train_batch_size=8, gradient_accumulation_steps=1, microbatch_tokens=10,
    loss_aggregation="token_mean", entropy_coef=0.01,
)  # fmt: skip
RANK_ROWS = ([0, 1, 2, 3], [4, 5, 6, 7])
"""Rank 0 trains on 6 response tokens, rank 1 on 22: the mean of the ranks' own token means is not the step's."""


def uneven_batch() -> RolloutBatch:
    """Eight rows, the first four with short responses and the last four with long ones, advantages of both signs."""
    prompt_ids = [[5, 6], [7, 8], [5, 9], [6, 7], [5, 6, 7], [8, 9], [5, 8], [6, 9, 7]]
    response_ids = [[10], [11, 12], [13], [14, 15], [16, 17, 18, 19, 20], [21] * 6, [22, 23, 24, 25, 26], [27] * 6]
    tensors = batch_from_token_ids(prompt_ids, response_ids, pad_token_id=0)
    return RolloutBatch(
        prompts=["p"] * 8,
        responses=["r"] * 8,
        ground_truths=["1"] * 8,
        **tensors,
        engine_log_probs=None,
        raw_rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]),
        advantages=torch.tensor([1.5, -0.5, 0.7, -1.0, -0.8, 1.2, -0.3, 0.4]),
        response_lengths=[len(ids) for ids in response_ids],
        sequence_lengths=sequence_lengths(tensors["response_mask"]),
        truncated=torch.tensor([False] * 8),
    )


def main() -> None:
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    ranks = init_ranks(DistributedConfig(nproc_per_node=2), "cpu")
    policy, _ = load_policy(model_dir, torch.device("cpu"))
    trainer = wrap_for_training(policy, "ddp", ranks)
    batch, rows = uneven_batch(), RANK_ROWS[ranks.rank]
    forwards = Forwards.training(CONFIG)
    metrics = accumulate_gradients(
        trainer, batch, rows, FixedLogProbs(), CONFIG.loss, forwards, CONFIG.sampling.max_tokens, ranks
    )
    gradients = {name: parameter.grad.clone() for name, parameter in policy.named_parameters()}
    microbatches = len(forwards.microbatches(rows, batch.sequence_lengths))
    torch.save(
        {"metrics": metrics, "gradients": gradients, "microbatches": microbatches}, out_dir / f"rank{ranks.rank}.pt"
    )
    torch.distributed.barrier()


if __name__ == "__main__":
    main()

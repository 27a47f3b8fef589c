"""One rank of the tests of what rank 0 does alone (``tests/test_distributed.py`` starts it under
``torch.distributed.run``): a slow write while the other rank waits in a collective, and the gathers of the weights it
saves under FSDP2.

    python -m torch.distributed.run --nproc-per-node 2 tests/rank_zero_worker.py MODEL_DIR OUT_DIR TIMEOUT_MINUTES

The process group is :func:`reasonrl.distributed.init_ranks`'s, with ``distributed.timeout_minutes`` TIMEOUT_MINUTES.
Each rank writes ``OUT_DIR/rank<rank>.json``:

- ``short_write``: rank 0 writes for a third of the timeout while rank 1 waits at a barrier: "ok", or the error.
- ``weights``: under FSDP2, what :func:`reasonrl.training.best.whole_weights` (a kept policy's or the final
  weights' gathering) left this rank holding: the most bytes of whole (gathered) tensors alive at once while it ran,
  the tensors it returned, and the model's and its largest tensor's bytes; rank 0 also whether they equal the model.
- ``long_write``: rank 0 writes for half as long again as the timeout while rank 1 waits at a barrier: the error.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import torch

from reasonrl.config import DistributedConfig
from reasonrl.distributed import Ranks, init_ranks, wrap_for_training
from reasonrl.training.best import whole_weights
from reasonrl.training.policy import load_policy


class WholeTensors:
    """The bytes of the whole tensors FSDP2 gathers (``DTensor.full_tensor``) alive at once in this process, at
    most, while :meth:`watching`: each counted until its memory is freed."""

    def __init__(self) -> None:
        self.alive = self.peak = 0

    def _freed(self, size: int) -> None:
        self.alive -= size

    @contextlib.contextmanager
    def watching(self) -> Iterator[WholeTensors]:
        from torch.distributed.tensor import DTensor

        gather = DTensor.full_tensor

        def counted_gather(tensor, *args, **kwargs):
            whole = gather(tensor, *args, **kwargs)
            storage = whole.untyped_storage()  # outlives the tensor while a view (detach, to) holds it
            self.alive += storage.nbytes()
            self.peak = max(self.peak, self.alive)
            weakref.finalize(storage, self._freed, storage.nbytes())
            return whole

        DTensor.full_tensor = counted_gather
        try:
            yield self
        finally:
            DTensor.full_tensor = gather


def write_beside_a_barrier(ranks: Ranks, seconds: float) -> str:
    """Rank 0 writes for ``seconds`` (a checkpoint on a slow filesystem) while the other rank waits at a barrier."""
    try:
        if ranks.is_main:
            time.sleep(seconds)
        ranks.barrier()
    except RuntimeError as error:
        return str(error)
    return "ok"


def gathered_weights(model_dir: str, ranks: Ranks) -> dict:
    policy, _ = load_policy(model_dir, torch.device("cpu"))
    wrap_for_training(policy, "fsdp2", ranks)
    sizes = [tensor.numel() * tensor.element_size() for tensor in policy.state_dict().values()]  # whole sizes
    with WholeTensors().watching() as whole:
        weights = whole_weights(policy, ranks.is_main)
    report = {"peak_bytes": whole.peak, "returned": len(weights or {}), "model_bytes": sum(sizes),
              "largest_bytes": max(sizes)}  # fmt: skip
    if weights is not None:
        model, _ = load_policy(model_dir, torch.device("cpu"))
        expected = model.state_dict()
        report["equal_to_the_model"] = weights.keys() == expected.keys() and all(
            torch.equal(tensor, expected[name]) for name, tensor in weights.items()
        )
    return report


def main() -> None:
    model_dir, out_dir, timeout_minutes = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    ranks = init_ranks(DistributedConfig(nproc_per_node=2, timeout_minutes=timeout_minutes), "cpu")
    timeout = timeout_minutes * 60
    report = {"short_write": write_beside_a_barrier(ranks, timeout / 3), "weights": gathered_weights(model_dir, ranks)}
    report["long_write"] = write_beside_a_barrier(ranks, timeout * 1.5)  # last: the group is broken afterwards
    (out_dir / f"rank{ranks.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()

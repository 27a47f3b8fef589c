"""One GRPO run over several processes: the ranks, the policy wrapped for DDP or FSDP2, and the few collectives the
loop needs.

A single process is the same code with :data:`SINGLE`: every collective returns its input and the policy trains
through the same :class:`PolicyScorer`, unwrapped. Under torchrun (``python -m reasonrl.launch``) the process
group exists before the rollout engine starts, which then joins it through vLLM's ``external_launcher`` executor,
in-process: an engine per rank, as TRL's colocate mode has it, or one sharded over each group of
``tensor_parallel_size`` consecutive ranks, which then sample together and split the training rows.

Collectives must run on every rank in the same order; the loop keeps them so by giving every rank the same number
of microbatches (padding with zero-weight ones) and by calling the weight gathers of FSDP2 (``full_tensor``) from
code every rank runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from reasonrl.config import ConfigError
from reasonrl.logprobs import get_response_log_probs

if TYPE_CHECKING:
    from reasonrl.config import DistributedConfig

T = TypeVar("T")


@dataclass(frozen=True)
class Mean:
    """A mean kept as its sum and count, so that ranks add both before dividing (:meth:`Ranks.mean_metrics`)."""

    total: float
    count: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Mean:
        values = list(values)
        return cls(float(sum(values)), len(values))


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run, and the collectives over all of them."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    tensor_parallel_size: int = 1
    """Consecutive ranks that share one engine (vLLM's tensor-parallel group): a data-parallel group."""

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, checkpoints and saves."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def data_parallel_rank(self) -> int:
        return self.rank // self.tensor_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.tensor_parallel_size

    @property
    def tensor_parallel_rank(self) -> int:
        return self.rank % self.tensor_parallel_size

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's data-parallel group's contiguous share of ``items`` (the same on the group's ranks: they
        generate together); sizes differ by at most one, group order = item order."""
        return [items[index] for index in self.share_range(len(items))]

    def share_range(self, count: int) -> range:
        """The indices of this rank's data-parallel group's share of ``count`` items."""
        return _contiguous_share(count, self.data_parallel_rank, self.data_parallel_size)

    def rows_to_train(self, count: int) -> list[int]:
        """Of the ``count`` rows its group sampled, those this rank trains on (all of them without tensor
        parallelism; a contiguous share each with it)."""
        return list(_contiguous_share(count, self.tensor_parallel_rank, self.tensor_parallel_size))

    def gather(self, items: list[T]) -> list[T]:
        """Every rank's ``items`` concatenated in rank order, on every rank (picklable objects)."""
        if not self.distributed:
            return items
        gathered: list[list[T] | None] = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, items)
        return [item for part in gathered for item in part]

    def sum(self, value: float) -> float:
        """The sum over ranks; a NaN or Inf on any rank is one on every rank."""
        if not self.distributed:
            return value
        tensor = torch.tensor(float(value), dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(tensor)
        return tensor.item()

    def max(self, value: int) -> int:
        if not self.distributed:
            return value
        tensor = torch.tensor(value, dtype=torch.int64, device=self._device())
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return int(tensor.item())

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def mean_metrics(self, metrics: dict[str, Mean]) -> dict[str, float]:
        """Each metric's mean over every rank's items: sums and counts are added over the ranks, then divided, so a
        mean whose count differs per rank (the length of correct answers) is the one a single process computes over
        the union, whatever the world size. Every rank passes the same names; a metric with no item on any rank
        (count 0) is left out. Ranks that share their items (a tensor-parallel group) add them as often each, which
        leaves every mean as it is."""
        names = sorted(metrics)
        sums = torch.tensor([[metrics[name].total, metrics[name].count] for name in names], dtype=torch.float64)
        if self.distributed:
            sums = sums.to(self._device())
            torch.distributed.all_reduce(sums)
        return {name: total / count for name, (total, count) in zip(names, sums.tolist(), strict=True) if count}

    def _device(self) -> torch.device:
        # NCCL reduces CUDA tensors only; gloo, CPU ones.
        backend = torch.distributed.get_backend()
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


SINGLE = Ranks()


def _contiguous_share(count: int, index: int, parts: int) -> range:
    size, extra = divmod(count, parts)
    start = index * size + min(index, extra)
    return range(start, start + size + (index < extra))


def init_ranks(config: DistributedConfig, device_type: str) -> Ranks:
    """The process group of a torchrun launch (NCCL on GPUs, gloo on CPU), made before the rollout engine starts,
    its collectives waiting ``distributed.timeout_minutes`` for a slow rank; :data:`SINGLE` outside torchrun. The
    world torchrun made must be the one ``distributed`` asks for."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != config.world_size:
        raise ConfigError(
            f"distributed.nproc_per_node × nnodes = {config.world_size}, but this process was launched in a world of "
            f"{world_size}: run the stage through `python -m reasonrl.launch` (dvc repro does), which starts "
            f"torchrun with the params' values"
        )
    if world_size == 1:
        return SINGLE
    ranks = Ranks(int(os.environ["RANK"]), world_size, int(os.environ["LOCAL_RANK"]), config.tensor_parallel_size)
    if device_type == "cuda":
        torch.cuda.set_device(ranks.local_rank)
    if not torch.distributed.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend, timeout=timedelta(minutes=config.timeout_minutes))
    return ranks


def process_group_timeout() -> timedelta:
    """How long a collective of the default process group waits for every rank (``distributed.timeout_minutes``
    where :func:`init_ranks` made the group)."""
    from torch.distributed.distributed_c10d import _get_default_group

    device = torch.device("cuda" if torch.distributed.get_backend() == "nccl" else "cpu")
    return _get_default_group()._get_backend(device).options._timeout


class PolicyScorer(torch.nn.Module):
    """The training forward as a module: log-probs (and entropy) of ``labels`` under the policy.

    DDP prepares its gradient reduction, and FSDP2 gathers the root's parameters (embeddings, final norm, output
    layer), in the forward of the module they wrap; the log-prob path calls the decoder and the output layer directly,
    so this module is what they wrap.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        return_token_entropy: bool = False,
        temperature: float = 1.0,
        entropy_grad: bool = False,
    ) -> dict[str, torch.Tensor]:
        return get_response_log_probs(
            self.policy,
            input_ids,
            labels,
            return_token_entropy=return_token_entropy,
            temperature=temperature,
            entropy_grad=entropy_grad,
        )


def as_scorer(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` if it is already a (wrapped) scorer, else a scorer over the plain policy."""
    from torch.nn.parallel import DistributedDataParallel

    return model if isinstance(model, PolicyScorer | DistributedDataParallel) else PolicyScorer(model)


def wrap_for_training(policy: torch.nn.Module, strategy: str, ranks: Ranks) -> torch.nn.Module:
    """The scorer the loop trains through: plain in a single process, else under DDP or FSDP2. FSDP2 shards
    ``policy``'s parameters in place (each decoder layer a unit, the rest with the root), so build the optimizer
    after this."""
    scorer = PolicyScorer(policy)
    if not ranks.distributed:
        return scorer
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [ranks.local_rank] if next(policy.parameters()).is_cuda else None
        return DistributedDataParallel(scorer, device_ids=device_ids)
    from torch.distributed.fsdp import fully_shard

    for layer in policy.get_decoder().layers:
        fully_shard(layer)
    return fully_shard(scorer)


@contextlib.contextmanager
def gradient_sync(trainer: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Reduce gradients across ranks in this backward (the step's last microbatch) or not (the others)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(trainer, DistributedDataParallel) and not enabled:
        with trainer.no_sync():
            yield
        return
    if isinstance(trainer, FSDPModule):
        trainer.set_requires_gradient_sync(enabled)
    yield


def inference_context(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """``inference_mode`` for a gradient-free pass, but ``no_grad`` under FSDP2: the buffers it gathers parameters
    into are reused by the next training forward, which may not write into inference tensors."""
    from torch.distributed.fsdp import FSDPModule

    return torch.no_grad() if isinstance(model, FSDPModule) else torch.inference_mode()


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (a collective: every rank must ask), or ``tensor`` itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def training_state(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, ranks: Ranks
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full (unsharded) state dicts of the policy and its optimizer, on CPU, for a checkpoint; collective under
    FSDP2. A single process keeps PyTorch's own formats."""
    if not ranks.distributed:
        return policy.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(policy, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_training_state(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any],
    ranks: Ranks,
) -> None:
    """The inverse of :func:`training_state`, on every rank (each reads the same checkpoint file)."""
    if not ranks.distributed:
        policy.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(
        policy,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=optimizer_state,
        options=StateDictOptions(full_state_dict=True),
    )


class NullLive:
    """What ranks other than 0 log to: nothing (rank 0 logs the run's metrics, averaged over ranks)."""

    step = 0

    def log_metric(self, name: str, value: Any) -> None:
        pass

    def sync(self) -> None:
        pass

    def next_step(self) -> None:
        pass

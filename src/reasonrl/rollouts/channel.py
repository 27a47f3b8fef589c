"""The weight stream from the trainer's process into the rollout engine's own (:mod:`reasonrl.rollouts.process`).

Weights cross through a process group of two ranks, {trainer: 0, engine: 1}, made for this pair alone (not
``torch.distributed``'s default group, which torchrun runs own): gloo on the CPU, NCCL between two GPUs. They are
the trainer's merged weights in the engine's dtype (:func:`reasonrl.rollouts.engine.engine_weights`), packed in order
into flat buckets of at most ``BUCKET_BYTES`` and streamed bucket by bucket: the engine loads each bucket's tensors
while the next one is in transit. A stream starts only when the engine has reached its
:class:`reasonrl.rollouts.process.LoadWeights` (it says so through the store), so the channel's timeout bounds
transfers, never the engine's draws.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from reasonrl.memory import BUCKET_BYTES

CHANNEL_TIMEOUT = datetime.timedelta(minutes=5)
"""How long the channel's set-up or one bucket's transfer may take once both ends are at it."""

POLL_SECONDS = 0.01
"""How often a waiting end looks at its peer (a reply ends the trainer's wait at once)."""

TRAINER, ENGINE = 0, 1


@dataclass(frozen=True)
class WeightLayout:
    """The names and shapes of the tensors a weight stream carries, in order, and their dtype: what the engine
    needs to receive them."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    bucket_bytes: int = BUCKET_BYTES

    @classmethod
    def of(
        cls, weights: Iterable[tuple[str, torch.Tensor]], dtype: str, bucket_bytes: int = BUCKET_BYTES
    ) -> WeightLayout:
        pairs = [(name, tuple(tensor.shape)) for name, tensor in weights]
        return cls(tuple(name for name, _ in pairs), tuple(shape for _, shape in pairs), dtype, bucket_bytes)

    def buckets(self) -> list[range]:
        """Consecutive tensor indices, each range filling a bucket up to ``bucket_bytes`` (a larger tensor alone)."""
        element = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        buckets, start, size = [], 0, 0
        for index, shape in enumerate(self.shapes):
            nbytes = element * _numel(shape)
            if index > start and size + nbytes > self.bucket_bytes:
                buckets.append(range(start, index))
                start, size = index, 0
            size += nbytes
        if start < len(self.shapes):
            buckets.append(range(start, len(self.shapes)))
        return buckets

    def sizes(self, bucket: range) -> list[int]:
        return [_numel(self.shapes[index]) for index in bucket]


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def pack(
    weights: Iterable[tuple[str, torch.Tensor]], layout: WeightLayout, device: torch.device
) -> Iterator[torch.Tensor]:
    """``weights`` (in ``layout``'s order and shapes) as ``layout``'s flat buckets on ``device``, one at a time: at
    most a bucket and the tensors being copied into it exist beside the weights (the memory plan's packing)."""
    weights = iter(weights)
    for bucket in layout.buckets():
        buffer = _packed(weights, layout, bucket, device)
        yield buffer
        del buffer  # before the next bucket is allocated (the consumer drops its reference too)


def _packed(
    weights: Iterator[tuple[str, torch.Tensor]], layout: WeightLayout, bucket: range, device: torch.device
) -> torch.Tensor:
    sizes = layout.sizes(bucket)
    buffer = torch.empty(sum(sizes), dtype=getattr(torch, layout.dtype), device=device)
    for index, part in zip(bucket, buffer.split(sizes), strict=True):
        name, tensor = next(weights)
        if name != layout.names[index] or tuple(tensor.shape) != layout.shapes[index]:
            raise RuntimeError(f"weight {index} is {name} {tuple(tensor.shape)}, not as the layout says")
        part.copy_(tensor.reshape(-1))
    return buffer


class WeightChannel:
    """One end of the {trainer, engine} weight stream: a process group of two ranks over a ``torch.distributed``
    store the trainer hosts (gloo, or NCCL when ``device`` is a GPU). The constructor returns once both ends are
    connected; each call blocks the calling thread (see :class:`reasonrl.rollouts.process.RolloutProcess` for who
    watches it)."""

    def __init__(self, store: torch.distributed.Store, rank: int, device: torch.device) -> None:
        self._store, self._device, self._aborted = store, device, False  # the store serves while this lives
        if device.type == "cpu":  # gloo connects both ends in its constructor
            self._group = torch.distributed.ProcessGroupGloo(store, rank, 2, CHANNEL_TIMEOUT)
        else:  # GPU-only: NCCL connects at its first operation unless told to now
            options = torch.distributed.ProcessGroupNCCL.Options()
            options._timeout = CHANNEL_TIMEOUT  # how torch.distributed itself sets an NCCL group's timeout
            self._group = torch.distributed.ProcessGroupNCCL(store, rank, 2, options)
            self._group.eager_connect_single_device(device)

    @staticmethod
    def host() -> torch.distributed.TCPStore:
        """The trainer's store, on a free port of this machine (its ``port`` tells the engine where)."""
        return torch.distributed.TCPStore(
            "127.0.0.1", 0, 2, is_master=True, timeout=CHANNEL_TIMEOUT, wait_for_workers=False
        )

    @staticmethod
    def join(port: int) -> torch.distributed.TCPStore:
        return torch.distributed.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=CHANNEL_TIMEOUT)

    def send(self, buckets: Iterable[torch.Tensor], version: int) -> None:
        """Stream the packed buckets of policy ``version`` (:func:`pack`) once the engine asks for them."""
        key = f"receiving/{version}"
        while not self._store.check([key]):
            self._raise_if_aborted()
            time.sleep(POLL_SECONDS)
        self._store.delete_key(key)
        for buffer in buckets:
            self._finish(self._group.send([buffer], ENGINE, 0))
            del buffer  # before the next bucket is packed

    def receive(self, layout: WeightLayout, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        """The trainer's stream of policy ``version``, tensor by tensor, each a view of its bucket's buffer."""
        self._store.set(f"receiving/{version}", "")
        for bucket in layout.buckets():
            sizes = layout.sizes(bucket)
            buffer = torch.empty(sum(sizes), dtype=getattr(torch, layout.dtype), device=self._device)
            self._finish(self._group.recv([buffer], TRAINER, 0))
            for index, part in zip(bucket, buffer.split(sizes), strict=True):
                yield layout.names[index], part.view(layout.shapes[index])

    def _finish(self, work) -> None:
        """Block this thread until a bucket crossed; raise if the peer's connection closed or :meth:`abort` ran."""
        if self._device.type == "cpu":
            work.wait()  # gloo: returns when the bucket crossed, raises when the peer's connection closed
            return
        # GPU-only: NCCL's wait() only makes the CUDA stream wait; is_completed() asks from the host
        while not work.is_completed():
            self._raise_if_aborted()
            time.sleep(POLL_SECONDS)

    def _raise_if_aborted(self) -> None:
        if self._aborted:
            raise RuntimeError("the weight channel was aborted")

    def abort(self) -> None:
        """Tear the group down: a transfer still waiting on the peer (NCCL's, forever) ends with an error."""
        if not self._aborted:
            self._aborted = True
            self._group.abort()

"""The rollout engine in a process of its own, for asynchronous GRPO (``grpo.max_staleness`` ≥ 1).

:class:`RolloutProcess` starts a child process that owns a :class:`reasonrl.rollout.RolloutEngine` (on
``rollout.engine_device`` in the ``split`` layout, on the CPU in ``cpu``) and serves requests from a queue, in the
order they were sent: load the weights of a policy version, draw a step's rollouts, validate. Replies come back on a
second queue. The trainer's process never waits for the engine except when it needs a reply, so the engine samples
the next steps' batches while the policy trains.

Weights cross through a process group of two ranks, {trainer: 0, engine: 1}, made for this pair alone (not
``torch.distributed``'s default group, which torchrun runs own): gloo on the CPU, NCCL between two GPUs. They are
the trainer's merged weights in the engine's dtype (:func:`reasonrl.rollout.engine_weights`), packed in order into
flat buckets of at most ``BUCKET_BYTES`` and streamed bucket by bucket: the engine loads each bucket's tensors while
the next one is in transit, and neither side ever holds a second whole copy of the model. Apart from the backend
and the devices the buffers live on, the CPU and the GPU run the same code, which the CPU tests cover.

Requests and replies are pickled by :mod:`multiprocessing`; both ends are this package in processes it started.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from reasonrl.errors import UserError

if TYPE_CHECKING:
    from reasonrl.config import EngineConfig
    from reasonrl.evaluation import EvalResult
    from reasonrl.grpo import DrawnRollouts

BUCKET_BYTES = 256 * 2**20
"""The most one transfer of the weight stream carries (vLLM's and TRL's weight-update examples bucket similarly)."""

CHANNEL_TIMEOUT = datetime.timedelta(minutes=30)
"""How long either end of the weight channel waits for the other (the engine can be busy generating)."""

TRAINER, ENGINE = 0, 1


class EngineProcessError(UserError, RuntimeError):
    """The engine's process failed or died; the message carries its traceback or exit code."""


# ---------------------------------------------------------------------------------------------------- weight channel
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


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


class WeightChannel:
    """One end of the {trainer, engine} weight stream: a process group of two ranks over a ``torch.distributed``
    store the trainer hosts (gloo, or NCCL when ``device`` is a GPU)."""

    def __init__(self, store: torch.distributed.Store, rank: int, device: torch.device) -> None:
        # Each constructor blocks until the other end has made its half (a rendezvous through the store).
        if device.type == "cpu":
            self._group = torch.distributed.ProcessGroupGloo(store, rank, 2, CHANNEL_TIMEOUT)
        else:  # GPU-only
            options = torch.distributed.ProcessGroupNCCL.Options()
            options._timeout = CHANNEL_TIMEOUT  # how torch.distributed itself sets an NCCL group's timeout
            self._group = torch.distributed.ProcessGroupNCCL(store, rank, 2, options)
        self._store, self._device = store, device  # the trainer's store serves only while this reference lives

    @staticmethod
    def host() -> torch.distributed.TCPStore:
        """The trainer's store, on a free port of this machine (its ``port`` tells the engine where)."""
        return torch.distributed.TCPStore(
            "127.0.0.1", 0, 2, is_master=True, timeout=CHANNEL_TIMEOUT, wait_for_workers=False
        )

    @staticmethod
    def join(port: int) -> torch.distributed.TCPStore:
        return torch.distributed.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=CHANNEL_TIMEOUT)

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], layout: WeightLayout) -> None:
        """Stream ``weights`` (in ``layout``'s order, dtype and shapes) to the engine, bucket by bucket."""
        weights = iter(weights)
        dtype = getattr(torch, layout.dtype)
        for bucket in layout.buckets():
            parts = []
            for index in bucket:
                name, tensor = next(weights)
                if name != layout.names[index] or tuple(tensor.shape) != layout.shapes[index]:
                    raise RuntimeError(f"weight {index} is {name} {tuple(tensor.shape)}, not as the layout says")
                parts.append(tensor.to(self._device, dtype).reshape(-1))
            self._group.send([torch.cat(parts)], ENGINE, 0).wait()

    def receive(self, layout: WeightLayout) -> Iterator[tuple[str, torch.Tensor]]:
        """The trainer's stream, tensor by tensor, each a view of its bucket's buffer."""
        dtype = getattr(torch, layout.dtype)
        for bucket in layout.buckets():
            sizes = [_numel(layout.shapes[index]) for index in bucket]
            buffer = torch.empty(sum(sizes), dtype=dtype, device=self._device)
            self._group.recv([buffer], TRAINER, 0).wait()
            for index, part in zip(bucket, buffer.split(sizes), strict=True):
                yield layout.names[index], part.view(layout.shapes[index])


# ---------------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Setup:
    """What the engine does for a :class:`Draw` and a :class:`Validate`; sent once, first. Picklable callables
    (module functions, or ``functools.partial`` of them with picklable arguments), so this module needs to know
    nothing of GRPO: the trainer's loop sends its own."""

    draw: Callable[..., DrawnRollouts]
    """``draw(engine, step_seed=...)``: a step's rollouts (:func:`reasonrl.grpo.draw_rollouts`)."""
    validate: Callable[..., EvalResult]
    """``validate(engine, None)``: validation of the loaded weights (:func:`reasonrl.sft.validate`)."""


@dataclass(frozen=True)
class LoadWeights:
    """The next bucketed stream on the channel holds the weights of policy ``version``."""

    version: int
    layout: WeightLayout


@dataclass(frozen=True)
class Draw:
    """Draw GRPO step ``step``'s rollouts (:func:`reasonrl.grpo.draw_rollouts`) with the weights loaded last."""

    step: int
    step_seed: int


@dataclass(frozen=True)
class Validate:
    """Validate the weights loaded last (:func:`reasonrl.sft.validate` on ``config.eval_examples`` questions)."""


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Drawn:
    step: int
    version: int
    """The policy version whose weights sampled every one of these rollouts."""
    rollouts: DrawnRollouts
    seconds: float
    """The engine's time on the draw."""


@dataclass(frozen=True)
class Validated:
    version: int
    result: EvalResult


@dataclass(frozen=True)
class Failed:
    traceback: str


# ------------------------------------------------------------------------------------------------- the engine's side
def serve(model_dir: str, config: EngineConfig, port: int, threads: int | None, requests, replies) -> None:
    """The engine process: join the weight channel, start the engine, then answer requests in order until
    :class:`Stop`. A failure is sent back as :class:`Failed` with its traceback, and ends the process."""
    try:
        # First, so that the trainer, waiting at the rendezvous, hears of any later failure as a reply.
        device = torch.device("cpu" if config.layout == "cpu" else config.engine_device)
        channel = WeightChannel(WeightChannel.join(port), ENGINE, device)
        if threads is not None:
            torch.set_num_threads(threads)
        from reasonrl.rollout import RolloutEngine

        engine = RolloutEngine(model_dir, config)
        setup, version = None, None
        while True:
            request = _next_request(requests)
            if request is None or isinstance(request, Stop):
                return
            if isinstance(request, Setup):
                setup = request
            elif isinstance(request, LoadWeights):
                with engine.serving():  # each request is one generation phase (validate's own included)
                    engine.load_weights(channel.receive(request.layout))
                version = request.version
            elif isinstance(request, Draw):
                started = time.perf_counter()
                with engine.serving():
                    rollouts = setup.draw(engine, step_seed=request.step_seed)
                replies.put(Drawn(request.step, version, rollouts, time.perf_counter() - started))
            elif isinstance(request, Validate):
                replies.put(Validated(version, setup.validate(engine, None)))
            else:
                raise TypeError(f"unknown request {request!r}")
    except BaseException:
        replies.put(Failed(traceback.format_exc()))
        raise


def _next_request(requests) -> Setup | LoadWeights | Draw | Validate | Stop | None:
    """The next request, or None once the trainer's process is gone (killed: it sent no :class:`Stop`)."""
    parent = multiprocessing.parent_process()
    while True:
        try:
            return requests.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None


# ------------------------------------------------------------------------------------------------ the trainer's side
def share_cpu_threads(config: EngineConfig) -> int | None:
    """``cpu`` layout: the engine's process gets half of this process's CPU threads (at least one) and the trainer
    keeps the rest, so the two work side by side without oversubscribing the cores. Returns the engine's share
    (None on a GPU layout, where each has its own device)."""
    if config.layout != "cpu":
        return None
    threads = torch.get_num_threads()
    engine = max(1, threads // 2)
    torch.set_num_threads(max(1, threads - engine))
    return engine


@dataclass
class RolloutProcess:
    """The trainer's handle on the engine process: the same ``config`` and ``policy_device()`` as an in-process
    :class:`reasonrl.rollout.RolloutEngine`, requests instead of calls. Close it (or use it as a context manager)
    to stop the process."""

    model_dir: str | Path
    config: EngineConfig
    engine_threads: int | None = None
    """The engine process's CPU threads (``cpu`` layout); None: torch's default."""
    _process: Any = field(init=False, repr=False)
    _requests: Any = field(init=False, repr=False)
    _replies: Any = field(init=False, repr=False)
    _channel: WeightChannel = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from reasonrl.memory import check_gpus
        from reasonrl.rollout import RolloutEngine

        check_gpus(self.config, torch.cuda.device_count())
        # The trainer's PyTorch as an in-process engine would set it (rollout.deterministic); the engine's process
        # sets its own when its engine starts.
        RolloutEngine.configure_environment(self.config)
        # spawn, not fork: the trainer's process may already hold threads, a CUDA context or an engine.
        context = multiprocessing.get_context("spawn")
        self._requests, self._replies = context.Queue(), context.Queue()
        store = WeightChannel.host()
        self._process = context.Process(
            target=serve,
            args=(str(self.model_dir), self.config, store.port, self.engine_threads, self._requests, self._replies),
            name="reasonrl-engine",
            daemon=True,
        )
        self._process.start()
        self._channel = self._wait_for(lambda: WeightChannel(store, TRAINER, self.policy_device()))

    @property
    def pid(self) -> int:
        """The engine process's id (e.g. to pin it to cores)."""
        return self._process.pid

    def policy_device(self) -> torch.device:
        """The policy's device: the CPU, or cuda:0 beside the engine's GPU (``split``)."""
        return torch.device("cpu" if self.config.layout == "cpu" else "cuda:0")

    def setup(self, request: Setup) -> None:
        self._requests.put(request)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], layout: WeightLayout, version: int) -> None:
        """Send a policy's weights (returns once they are streamed: the engine loads them while the trainer goes
        on)."""
        self._requests.put(LoadWeights(version, layout))
        self._wait_for(lambda: self._channel.send(weights, layout))

    def request(self, request: Draw | Validate) -> None:
        self._requests.put(request)

    def reply(self) -> Drawn | Validated:
        """The next reply, in request order; raises :class:`EngineProcessError` if the engine failed or died."""
        while True:
            try:
                reply = self._replies.get(timeout=1.0)
            except queue.Empty:
                if not self._process.is_alive():
                    raise EngineProcessError(
                        f"the rollout engine's process died (exit code {self._process.exitcode}) without a reply"
                    ) from None
                continue
            if isinstance(reply, Failed):
                raise EngineProcessError(f"the rollout engine's process failed:\n{reply.traceback}")
            return reply

    def _wait_for(self, transfer):
        """Run a channel operation; a dead engine is reported with its traceback rather than as a channel timeout."""
        try:
            return transfer()
        except RuntimeError as error:
            with contextlib.suppress(queue.Empty):
                failed = self._replies.get(timeout=5.0)
                if isinstance(failed, Failed):
                    raise EngineProcessError(f"the rollout engine's process failed:\n{failed.traceback}") from error
            raise

    def close(self) -> None:
        if self._process.is_alive():
            self._requests.put(Stop())
            self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def __enter__(self) -> RolloutProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

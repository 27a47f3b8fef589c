"""Atomic outputs: write beside the target, then rename, so a killed stage never leaves a half-written output.

A killed writer leaves its temporary (``.<name>.<random>.tmp``) behind; the next atomic write of the same target
removes it. That is safe because nothing else writes the same target at the same time: DVC runs a repository's stages
one at a time, Snakemake gives each output one job, and a GRPO run holds :func:`exclusive_lock` on its checkpoints.

Outputs get the permissions an ordinary ``mkdir`` or ``open`` gives (``0o777``/``0o666`` less the umask), not the
owner-only ones of :mod:`tempfile`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reasonrl.errors import UserError

# The random part: 8 hex digits here; 8 of [a-z0-9_] in the temporaries of earlier versions (tempfile's names).
_RANDOM_PART = r"[a-z0-9_]{8}"


class LockedError(UserError):
    """Another process holds the lock on a path: a second run would write the same files."""


def _temporary_name(name: str) -> str:
    return f".{name}.{secrets.token_hex(4)}.tmp"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_temporaries(directory: str | Path, name: str | None = None) -> None:
    """Remove what killed atomic writes left in ``directory``: the temporaries of the target ``name``, or of every
    target when ``name`` is None. Only for a caller that no live writer can be writing beside (see the module)."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    target = re.escape(name) if name is not None else r".+"
    pattern = re.compile(rf"\.{target}\.{_RANDOM_PART}\.tmp")
    for entry in directory.iterdir():
        if pattern.fullmatch(entry.name):
            _remove(entry)


def _new_temporary(target: Path, create: Callable[[Path], None]) -> Path:
    """A fresh temporary beside ``target`` made by ``create``, once the ones killed writers left are gone."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_temporaries(target.parent, target.name)
    while True:
        staging = target.parent / _temporary_name(target.name)
        try:
            create(staging)
        except FileExistsError:  # 2^32 names: another writer's temporary of this target, by chance
            continue
        return staging


@contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on success it replaces ``target`` whole.

    On an exception the temporary directory is removed and ``target`` is left as it was.
    """
    target = Path(target)
    staging = _new_temporary(target, lambda path: path.mkdir(0o777))  # the umask applies, as to any mkdir
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)


def _create_file(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies, as to any open


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory."""
    path = Path(path)
    staging = _new_temporary(path, _create_file)
    try:
        staging.write_text(text, encoding="utf-8")
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def atomic_write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))


@contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the ``with`` block: the lock file ``.<name>.lock`` beside it, with this
    process's PID in it. Another holder → :class:`LockedError` naming its PID. The kernel drops the lock when the
    holder exits, killed or not; the file stays (removing it would let a third process lock a new file while the
    second still waits on the old one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_file = path.parent / f".{path.name}.lock"
    descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip()
            raise LockedError(
                f"{path}: in use by another run (PID {holder or 'unknown'}; lock {lock_file}); wait for it to end "
                f"or stop it"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def fsync_path(path: str | Path) -> None:
    """Flush one file, or one directory's entries (the names of its files, a rename), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(path: str | Path) -> None:
    """Flush every file under ``path``, then every directory bottom-up, ``path`` last: called before the rename that
    publishes ``path``, a crash then leaves either no ``path`` or all of it, never its names without their data."""
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)

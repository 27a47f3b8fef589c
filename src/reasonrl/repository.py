"""What git says about the repository a stage runs in. Light on purpose: the report stage imports it, and it
starts no torch."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit(directory: Path = Path(".")) -> str:
    """``git rev-parse HEAD`` in ``directory`` (a stage runs in its repository: a queued DVC experiment's too, a
    temporary repository with a commit of its own), or ``unknown`` outside a repository or without git."""
    try:
        shown = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return shown.stdout.strip() if shown.returncode == 0 else "unknown"

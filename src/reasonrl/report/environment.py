"""Where and when the report was rendered: the date, the git commit and the machine (CPU, GPUs), for the page's run
details. The report stage reads them as it runs (:func:`capture_environment`); the rest of the report is a function
of its inputs alone.

The training stages write their wall clock but not their machine: the machine here is the one the report stage ran
on, which ``make demo`` (one ``dvc repro`` on one machine) makes the one every stage ran on.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from reasonrl.repository import git_commit


@dataclass(frozen=True)
class RunEnvironment:
    rendered_at: str
    """UTC, to the minute: ``2025-06-01 14:03 UTC``."""
    commit: str
    """``git rev-parse HEAD`` where the stage ran, or ``unknown``."""
    cpu: str
    cpu_count: int
    """Logical CPUs this process may run on."""
    gpus: tuple[str, ...]
    """Each NVIDIA GPU's name, as ``nvidia-smi`` lists them; empty without one."""

    def machine(self) -> str:
        """``"AMD EPYC 7763 (16 logical CPUs); GPUs: 8 × NVIDIA H100 80GB HBM3"``."""
        counts = Counter(self.gpus)
        gpus = ", ".join(f"{count} × {name}" for name, count in counts.items()) or "none found (nvidia-smi)"
        return f"{self.cpu} ({self.cpu_count} logical CPUs); GPUs: {gpus}"


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``), else what :mod:`platform` knows of it."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def gpu_names() -> tuple[str, ...]:
    """Each NVIDIA GPU's name (``nvidia-smi``); none without the tool or a GPU."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if listed.returncode != 0:
        return ()
    return tuple(line.strip() for line in listed.stdout.splitlines() if line.strip())


def capture_environment(directory: Path = Path(".")) -> RunEnvironment:
    """The date (now), the commit of the repository at ``directory`` and this machine."""
    now = datetime.datetime.now(datetime.UTC)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return RunEnvironment(now.strftime("%Y-%m-%d %H:%M UTC"), git_commit(directory), cpu_name(), cpus, gpu_names())

"""Stage runs side by side: a test that compares a killed and resumed run with an uninterrupted one runs the latter
alongside, instead of before, the former. Most of each run is start-up (imports, the engine), one core's work, so two
runs share the machine's two cores instead of taking turns; each keeps to one thread, so that their training phases do
not oversubscribe the cores (an OpenMP barrier waiting on a thread the other run has displaced stalls every kernel)."""

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
"""The environment of every run a test compares: one thread each (runs compared bit for bit must also share their
thread count, which splits CPU kernels' sums)."""


@contextlib.contextmanager
def alongside(command: list[str], log: Path) -> Iterator[None]:
    """Run ``command`` (with :data:`ONE_THREAD`, its output in ``log``) while the block runs; on leaving, wait for it
    and check that it succeeded."""
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=ONE_THREAD)
        try:
            yield
        finally:
            returncode = process.wait()
    assert returncode == 0, f"{' '.join(command)} failed:\n{log.read_text()[-3000:]}"


def started_to_be_killed(command: list[str]) -> subprocess.Popen:
    """``command`` started with :data:`ONE_THREAD`, its output dropped: the run a test kills and resumes."""
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ONE_THREAD)

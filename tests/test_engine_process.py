"""The engine's own process fails loudly: a kill of either side, while the engine starts, while weights stream and
while it draws, ends both within seconds, with a one-line error naming what died, and no process outlives its
parent; an engine that fails (vLLM refusing to start, a reward that never returns) ends the trainer with its error.
The error is the trainer's last line. Each scenario's trainer is a process of its own
(``tests/engine_process_scenarios.py``), killed or watched with a time limit, so that a hang fails the test instead
of blocking the suite."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).with_name("engine_process_scenarios.py")
ENDS_WITHIN = 15.0
"""Seconds a survivor may take to end after its peer was killed (Python's exit included)."""
BOOTSTRAP = 90.0
"""Seconds an engine whose trainer was killed 0.3 s after it appeared may take to end: its first instruction
(``die_with_parent``) runs once its process has imported the trainer's main module and torch, 33 s after its
trainer's death on this shared 2-core machine (a few seconds on an idle one); today's engine lived on for minutes."""


class Trainer:
    """A scenario's trainer process, its output lines as they come."""

    def __init__(self, phase: str, model_dir: Path) -> None:
        stand_in = "0" if phase in ("start", "unstartable") else "1"
        environ = {**os.environ, "SCENARIO_STAND_IN": stand_in, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, str(SCENARIOS), phase, str(model_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def wait_for_line(self, expected: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.lines.get(timeout=max(0.0, deadline - time.monotonic())) != expected:
            pass

    def engine_pid(self, timeout: float = 60.0) -> int:
        """The engine's process: the trainer's child started by multiprocessing's spawn (its other child is
        multiprocessing's resource tracker)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid in _children(self.process.pid):
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            time.sleep(0.05)
        raise AssertionError(f"no engine process appeared in {timeout} s")


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    """Running, not a zombie (a dead child its parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _kill_survivors(*pids: int) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _reach(trainer: Trainer, phase: str) -> int:
    """Bring the scenario to ``phase`` and return the engine's PID; ``start``: 0.3 s after the engine appeared."""
    engine = trainer.engine_pid()
    if phase == "start":
        time.sleep(0.3)
    else:
        trainer.wait_for_line(phase)
        time.sleep(1.5)  # inside the transfer (5 s) or the draw (2 min)
    return engine


# "start": 0.3 s after the engine's process appeared; "joined": once the channel is joined, while the engine starts
# vLLM (the real one, on the tiny model) and the trainer waits to send the first weights, the Setup (the size of the
# CPU preset's train set) still in the request queue's pipe: the trainer used to print its error and never exit,
# Python's exit waiting for the queue's thread, blocked writing to an engine that would never read. "transfer" and
# "draw": the stand-in engine holds a semaphore, as vLLM's does; the warning of the trainer's resource tracker about
# it, at the trainer's exit, used to come after the error.
PHASES = [
    pytest.param("start", marks=pytest.mark.slow),
    pytest.param("joined", marks=pytest.mark.slow),
    "transfer",
    "draw",
]


@pytest.mark.parametrize("phase", PHASES)
def test_killing_the_engine_ends_the_trainer_with_one_line_naming_it(phase, tiny_model_dir):
    trainer = Trainer("start" if phase in ("start", "joined") else phase, tiny_model_dir)
    engine = _reach(trainer, phase)
    try:
        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        try:
            trainer.process.wait(timeout=ENDS_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{phase}: the trainer was still running {ENDS_WITHIN} s after its engine was killed")
        print(f"{phase}: the trainer ended {time.monotonic() - killed:.1f} s after its engine was killed")
        last = trainer.process.stderr.read().strip().splitlines()[-1]
        assert trainer.process.returncode != 0
        assert re.fullmatch(
            rf"reasonrl\.rollouts\.process\.EngineProcessError: the rollout engine's process \(PID {engine}\) died "
            r"\(killed by SIGKILL\) while .+",
            last,
        ), last
    finally:
        _kill_survivors(trainer.process.pid, engine)


@pytest.mark.parametrize("phase", PHASES)
def test_killing_the_trainer_ends_the_engine(phase, tiny_model_dir):
    trainer = Trainer("start" if phase in ("start", "joined") else phase, tiny_model_dir)
    engine = _reach(trainer, phase)
    try:
        trainer.process.kill()
        trainer.process.wait()
        killed, limit = time.monotonic(), BOOTSTRAP if phase == "start" else ENDS_WITHIN
        while _alive(engine) and time.monotonic() - killed < limit:
            time.sleep(0.1)
        assert not _alive(engine), f"{phase}: the engine outlived its trainer by {limit} s"
        print(f"{phase}: the engine ended {time.monotonic() - killed:.1f} s after its trainer was killed")
    finally:
        _kill_survivors(engine)


HANGS_ON_LONG = """
import time


def hangs_on_long(response, ground_truth):
    if len(response) > 200:
        time.sleep(3600)
    return {"format_reward": 1.0, "answer_reward": 1.0, "reward": 1.0}
"""


def _error_at_the_end(stderr: str) -> str:
    """The engine's failure as the trainer's error reports it, from its first line to the end of ``stderr``."""
    header = "reasonrl.rollouts.process.EngineProcessError: the rollout engine's process failed:\n"
    assert header in stderr, stderr[-3000:]
    reported = stderr.rsplit(header, 1)[1].rstrip()
    # Nothing after it: not the engine's own print of its traceback, nor a resource tracker's warning.
    assert reported.count("Traceback (most recent call last):") == 1 and "resource_tracker" not in reported, reported
    return reported


@pytest.mark.slow
def test_an_engine_that_cannot_start_ends_the_trainer_with_its_error_last(tiny_model_dir):
    """vLLM refuses the engine's config as it starts, the Setup still in the request queue's pipe: the trainer ends
    with the engine's traceback, vLLM's error last (it used to print it and never exit)."""
    trainer = Trainer("unstartable", tiny_model_dir)
    engine = trainer.engine_pid()
    try:
        trainer.process.wait(timeout=BOOTSTRAP)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the trainer was still running {BOOTSTRAP} s after its engine appeared")
    finally:
        _kill_survivors(trainer.process.pid, engine)
    assert trainer.process.returncode != 0
    reported = _error_at_the_end(trainer.process.stderr.read())
    assert "User-specified max_model_len (4096) is greater than the derived max_model_len" in reported


def test_a_reward_that_never_returns_in_the_engine_ends_the_trainer_naming_it(tmp_path):
    """At lag ≥ 1 the engine's process grades the rollouts it draws: a user's reward that never returns on a response
    is stopped there within its bound (on the engine's main thread, as in the trainer's), and the trainer ends with
    the error naming the function and the response, where it used to wait for the reply forever."""
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards/__init__.py").write_text("")
    (tmp_path / "rewards/mine.py").write_text(HANGS_ON_LONG)
    environ = {**os.environ, "SCENARIO_STAND_IN": "1", "SCENARIO_TENSOR_SECONDS": "0", "SCENARIO_REWARD_SECONDS": "1"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(SCENARIOS), "grading", str(tmp_path)], capture_output=True, text=True, env=environ,
        timeout=120,
    )  # fmt: skip
    print(f"the trainer ended {time.monotonic() - started:.1f} s after it started")
    assert result.returncode != 0
    last = _error_at_the_end(result.stderr).splitlines()[-1]
    assert re.fullmatch(
        r"reasonrl\.rewards\.RewardError: rewards\.r1_zero \(rewards\.mine:hangs_on_long\) did not return within 1 s "
        r"on the response 'Let me think step by step\. .*' … '.*</answer>' \(569 characters\) with ground truth '4'",
        last,
    ), last


def test_weights_for_a_lag_of_two_are_handed_off_while_the_engine_draws():
    """``max_staleness`` 2: after step 0 the engine still has the draws of steps 1 and 2 to do (3 s each) before it
    takes version 1's weights; the trainer hands them off and goes on (it needs only step 1's draw next)."""
    environ = {**os.environ, "SCENARIO_STAND_IN": "1", "SCENARIO_TENSOR_SECONDS": "0"}
    result = subprocess.run(
        [sys.executable, str(SCENARIOS), "handoff"], capture_output=True, text=True, env=environ, timeout=300
    )
    assert result.returncode == 0, result.stderr
    seconds = float(re.search(r"handoff: ([\d.]+) s", result.stdout)[1])
    print(f"load_weights took {seconds} s")
    assert seconds < 1.0

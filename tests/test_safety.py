"""What a run must not do to the machine or to another run, on real processes: run a param's value in a shell (DVC
and Snakemake hand stage commands to one), let two GRPO runs write the same checkpoints, leave the ranks running
after their launcher is killed, keep a killed writer's temporaries, or write owner-only outputs."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pipeline_repo import make_pipeline_repo

from reasonrl.atomic import atomic_directory, atomic_write_text, exclusive_lock, remove_temporaries
from reasonrl.config import ConfigError
from reasonrl.launch import parse_args
from reasonrl.synthetic import arithmetic_lines

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = "r1_zero; echo INJECTED > {marker}; #"
"""Issue 20's ``grpo.prompt``, which ran its ``echo`` on ``dvc repro -s final_eval``; the marker is the test's own."""


# ------------------------------------------------------------------------------------------- params never reach a shell
@pytest.fixture(scope="module")
def injected_repo(tmp_path_factory):
    """A pipeline repository whose ``grpo.prompt`` is the payload, with final_eval's inputs present (empty), so that
    final_eval is the one stage either runner runs."""
    root = tmp_path_factory.mktemp("injected")
    marker = root / "INJECTED"
    payload = PAYLOAD.format(marker=marker)
    clone, env = make_pipeline_repo(root / "repo", {"grpo.prompt": payload})
    for inputs in ("data/gsm8k", "models/base", "models/sft", "models/ei", "models/grpo"):
        (clone / inputs).mkdir(parents=True)
    return clone, env, marker, payload


def assert_stopped_on_the_prompt(output: str, payload: str) -> None:
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: params.yaml: grpo.prompt: must be one of"), output
    assert repr(payload) in errors[0]


@pytest.mark.slow
def test_a_shell_payload_in_a_param_never_runs_under_dvc(injected_repo):
    clone, env, marker, payload = injected_repo
    marker.unlink(missing_ok=True)  # each runner on its own
    result = subprocess.run(["dvc", "repro", "-s", "final_eval"], cwd=clone, env=env, capture_output=True, text=True)
    assert result.returncode != 0 and not marker.exists(), result.stdout + result.stderr
    # DVC stops before the command: the value only reaches the path of the template dep it names
    # (src/reasonrl/prompts/${grpo.prompt}.prompt), which does not exist.
    template = clone / "src/reasonrl/prompts" / f"{payload}.prompt"
    assert f"failed to reproduce 'final_eval': [Errno 2] No such file or directory: '{template}'" in result.stderr


@pytest.mark.slow
def test_a_shell_payload_in_a_param_never_runs_under_snakemake(injected_repo):
    clone, env, marker, payload = injected_repo
    marker.unlink(missing_ok=True)  # each runner on its own
    command = [sys.executable, "-m", "snakemake", "--cores", "1", "final_eval"]
    result = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True)
    assert result.returncode != 0 and not marker.exists(), result.stdout + result.stderr
    assert not (clone / "logs/final_eval.log").exists()  # the Snakefile refused the params: no rule ran
    assert_stopped_on_the_prompt(result.stderr, payload)


def test_the_launcher_reads_its_counts_from_the_params_file(params_file):
    params = yaml.safe_load(params_file.read_text())
    params["distributed"]["nproc_per_node"], params["rollout"]["layout"] = 4, "colocate"
    params_file.write_text(yaml.safe_dump(params))
    args = parse_args(["--params", str(params_file), "stages/grpo.py", "--params", str(params_file)])
    assert (args.nproc_per_node, args.nnodes, args.script_args) == (4, 1, ["--params", str(params_file)])
    with pytest.raises(ConfigError, match=r"--params .*drop --nproc-per-node and --nnodes"):
        parse_args(["--params", str(params_file), "--nnodes", "2", "stages/grpo.py"])
    params["distributed"]["nproc_per_node"] = "1; echo INJECTED; #"
    params_file.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"distributed.nproc_per_node"):
        parse_args(["--params", str(params_file), "stages/grpo.py"])


# ----------------------------------------------------------------------------------------------- one GRPO run at a time
HOLD_LOCK = """
import sys, time
from reasonrl.atomic import exclusive_lock
with exclusive_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_second_grpo_run_stops_naming_the_pid_of_the_first(tmp_path, params_file):
    checkpoints = tmp_path / "models/grpo_checkpoints"
    first = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(checkpoints)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "locked\n"
        data = tmp_path / "data"
        data.mkdir()
        for split, seed in (("train", 0), ("val", 1)):
            (data / f"{split}.jsonl").write_text("\n".join(arithmetic_lines(4, seed, 1, 9)) + "\n")
        # No model: the lock comes before anything loads, reads or deletes.
        second = subprocess.run(
            [sys.executable, str(REPO / "stages/grpo.py"), "--params", str(params_file), "--models",
             str(tmp_path / "models"), "--data", str(data), "--out", str(tmp_path / "models/grpo"),
             "--checkpoints", str(checkpoints), "--metrics", str(tmp_path / "metrics.json"),
             "--cost", str(tmp_path / "cost.json"),
             "--live", str(tmp_path / "live"), "--kept", str(tmp_path / "models/kept/grpo")],
            capture_output=True, text=True,
        )  # fmt: skip
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 2, second.stderr
    assert second.stderr.splitlines() == [
        f"error: {checkpoints}: in use by another run (PID {first.pid}; lock {checkpoints.parent}/"
        f".grpo_checkpoints.lock); wait for it to end or stop it"
    ]
    with exclusive_lock(checkpoints):  # the kernel released the killed holder's lock
        assert (checkpoints.parent / ".grpo_checkpoints.lock").read_text() == f"{os.getpid()}\n"


# -------------------------------------------------------------------------------------- the ranks die with the launcher
SLEEPING_RANK = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(600)
"""


def is_running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_the_ranks_die_with_a_killed_launcher(tmp_path):
    script, ranks = tmp_path / "rank.py", tmp_path / "ranks"
    script.write_text(SLEEPING_RANK)
    ranks.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "reasonrl.launch", "--nproc-per-node", "2", str(script), str(ranks)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while len(list(ranks.iterdir())) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.1)
        time.sleep(0.2)  # both PIDs written
        pids = [int(path.read_text()) for path in ranks.iterdir()]
        assert len(pids) == 2 and all(map(is_running, pids))
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while any(map(is_running, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(is_running, pids)), "a rank outlived its launcher"
    finally:
        launcher.kill()
        for pid in filter(is_running, pids):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------------------- atomic outputs
def test_the_next_write_of_a_target_removes_the_temporaries_a_killed_writer_left(tmp_path):
    (tmp_path / ".sft.abcd_123.tmp").mkdir()  # a half-written model (tempfile's names, before)
    (tmp_path / ".sft.abcd_123.tmp/model.safetensors").write_bytes(b"half")
    (tmp_path / ".metrics.json.0f3a9c1b.tmp").write_text("{")
    others = [".sft.json.0f3a9c1b.tmp", ".sft.notes", "sft.abcd1234.tmp", ".metrics.0f3a9c1b.tmp"]
    for name in others:  # another target's temporary, or not a temporary at all
        (tmp_path / name).write_text("")
    with atomic_directory(tmp_path / "sft") as staging:
        (staging / "config.json").write_text("{}")
    atomic_write_text(tmp_path / "metrics.json", "{}")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([*others, "sft", "metrics.json"])


def test_a_stage_start_removes_every_temporary_in_a_directory_it_owns(tmp_path):
    (tmp_path / ".step-000002.0f3a9c1b.tmp").mkdir()
    (tmp_path / "step-000004").mkdir()
    (tmp_path / ".keep").write_text("")
    remove_temporaries(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == [".keep", "step-000004"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_get_the_permissions_the_umask_gives(tmp_path, umask):
    previous = os.umask(umask)
    try:
        with atomic_directory(tmp_path / "model") as staging:
            (staging / "config.json").write_text("{}")
        atomic_write_text(tmp_path / "metrics.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((tmp_path / "metrics.json").stat().st_mode) == 0o666 & ~umask

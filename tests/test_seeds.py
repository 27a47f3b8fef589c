"""``python -m reasonrl.seeds``: one DVC experiment per seed of a setting, queued in a real git + DVC repository
whose one stage reads the seed params (the whole pipeline per seed would take minutes), then run by ``--run``; and
the checks that stop it before anything is queued."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reasonrl.compare import CompareError, setting_names
from reasonrl.report.inputs import flatten
from reasonrl.seeds import (
    SEED_PARAMS,
    SeedsError,
    checked_plan,
    default_setting_name,
    experiment_name,
    main,
    parse_assignment,
    parse_experiment_name,
)

SRC = Path(__file__).resolve().parents[1] / "src"

# A stage that reads every seed param and the setting's loss, as the pipeline's stages read theirs, and writes them
# as its metrics.
ECHO_STAGE = """\
stages:
  echo:
    cmd: python echo.py
    deps: [echo.py]
    params: [model.seed, sft.seed, ei.seed, grpo.seed, grpo.loss_type]
    metrics:
      - echo.json:
          cache: false
"""
ECHO_SCRIPT = """\
import json, yaml
p = yaml.safe_load(open("params.yaml"))
seeds = {section: p[section]["seed"] for section in ("model", "sft", "ei", "grpo")}
json.dump({**seeds, "loss": p["grpo"]["loss_type"]}, open("echo.json", "w"))
"""


def run(command: list[str], cwd: Path, env: dict[str, str], ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert (result.returncode == 0) == ok, f"{' '.join(command)}: {result.returncode}\n{result.stdout}{result.stderr}"
    return result


def seeds_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "reasonrl.seeds", *args]


@pytest.fixture(scope="module")
def repo(tmp_path_factory, full_scale_params):
    tmp_path = tmp_path_factory.mktemp("seeds")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(SRC),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    (tmp_path / "params.yaml").write_text(full_scale_params, encoding="utf-8")
    (tmp_path / "dvc.yaml").write_text(ECHO_STAGE, encoding="utf-8")
    (tmp_path / "echo.py").write_text(ECHO_SCRIPT, encoding="utf-8")
    run(["git", "init", "-q"], tmp_path, env)
    run([sys.executable, "-m", "dvc", "init", "-q"], tmp_path, env)
    run(["git", "add", "-A"], tmp_path, env)
    run(["git", "commit", "-qm", "echo"], tmp_path, env)
    return tmp_path, env


def shown_experiments(clone: Path, env: dict[str, str]) -> dict[str, dict]:
    """Each experiment of ``dvc exp show --json`` by name: its params.yaml and its echo.json (None until run)."""
    shown = json.loads(run([sys.executable, "-m", "dvc", "exp", "show", "--json"], clone, env).stdout)
    experiments = {}
    for commit in shown:
        for experiment in commit.get("experiments") or []:
            for rev in experiment["revs"]:
                data = rev.get("data") or {}
                params = data.get("params", {}).get("params.yaml", {}).get("data")
                metrics = data.get("metrics", {}).get("echo.json", {}).get("data")
                experiments[rev["name"]] = {"params": params, "metrics": metrics}
    return experiments


@pytest.mark.slow
def test_queues_one_named_experiment_per_seed_then_runs_them(repo):
    """The queue as DVC keeps it, then ``--run`` through DVC's queue workers (a minute here: two real experiments,
    what the command exists to start; the pipeline itself is not run)."""
    clone, env = repo
    queued = run(seeds_command("0", "1", "2", "-S", "grpo.loss_type=grpo_clip", "--name", "clip"), clone, env)
    names = ["clip-seed0", "clip-seed1", "clip-seed2"]
    assert (
        "$ dvc exp run --queue --name clip-seed1 -Sgrpo.loss_type=grpo_clip -Smodel.seed=1 -Ssft.seed=1 -Sei.seed=1 "
        "-Sgrpo.seed=1" in queued.stdout
    )
    status = run([sys.executable, "-m", "dvc", "queue", "status"], clone, env).stdout
    for name in names:
        assert any(name in line and "Queued" in line for line in status.splitlines()), status
    shown = shown_experiments(clone, env)
    for seed, name in enumerate(names):  # the setting's override and the seed, in each queued experiment's params
        params = shown[name]["params"]
        assert [params[section]["seed"] for section in ("model", "sft", "ei", "grpo")] == [seed] * 4
        assert params["grpo"]["loss_type"] == "grpo_clip" and params["rollout"]["seed"] == 0
    # The same names again: refused before anything is queued, naming them.
    again = run(seeds_command("2", "3", "-S", "grpo.loss_type=grpo_clip", "--name", "clip"), clone, env, ok=False)
    assert "experiment names already taken: clip-seed2" in again.stderr
    assert "clip-seed3" not in run([sys.executable, "-m", "dvc", "queue", "status"], clone, env).stdout

    # --run (the queue run to its end) on another setting only, named from its override: 2 runs instead of 5.
    run([sys.executable, "-m", "dvc", "queue", "remove", "--queued"], clone, env)
    ran = run(seeds_command("0", "1", "-Sgrpo.loss_type=no_baseline", "--run", "-j", "2"), clone, env)
    assert "seeds: ran loss_type-no_baseline-seed0, loss_type-no_baseline-seed1" in ran.stdout
    shown = shown_experiments(clone, env)
    for seed in (0, 1):
        echoed = shown[experiment_name("loss_type-no_baseline", seed)]["metrics"]
        assert echoed == {"model": seed, "sft": seed, "ei": seed, "grpo": seed, "loss": "no_baseline"}
    # What compare --settings groups by: the names, by seed; clip's seeds never ran (removed from the queue).
    setting = "loss_type-no_baseline"
    assert setting_names([setting], repo=str(clone)) == {setting: [f"{setting}-seed0", f"{setting}-seed1"]}
    with pytest.raises(CompareError, match=r"setting 'clip': 0 experiment\(s\) named clip-seed<k>"):
        setting_names(["clip"], repo=str(clone))


BAD_INPUT = [
    (["0", "-S", "grpo.no_such=1"], "params.yaml has no parameter grpo.no_such"),
    (["0", "--vary", "grpo.sed"], "--vary grpo.sed: not a training seed"),
    (["0", "--vary", "rollout.seed"], "--vary rollout.seed: not a training seed"),
    (["0", "-S", "grpo.learning_rate=-1"], "and seed 0: grpo.learning_rate"),
    (["0", "-S", "grpo.seed=3"], "-S grpo.seed: a seed param the command sets per seed"),
    (["0", "-S", "grpo.loss_type"], "-S 'grpo.loss_type': not an override DVC reads"),
    (["0", "0"], "each seed once"),
    (["-1"], "seeds must be non-negative integers, got [-1]"),
    (["0", "--name", "no/slash"], "setting name 'no/slash'"),
]


def test_bad_input_is_refused_before_anything_is_queued(repo, monkeypatch):
    clone, env = repo
    monkeypatch.chdir(clone)
    for args, message in BAD_INPUT:
        with pytest.raises(SeedsError) as refused:
            main(args)
        assert message in str(refused.value), args
    assert "Queued" not in run([sys.executable, "-m", "dvc", "queue", "status"], clone, env).stdout
    refused = run(seeds_command("0", "-S", "grpo.no_such=1"), clone, env, ok=False)  # as a user sees it
    assert refused.returncode == 2 and refused.stderr.startswith("error: params.yaml has no parameter grpo.no_such")


def test_vary_sets_only_the_seed_params_named(repo, monkeypatch, capsys):
    clone, env = repo
    monkeypatch.chdir(clone)
    main(["4", "--vary", "grpo.seed", "--name", "grpo-only"])
    assert "$ dvc exp run --queue --name grpo-only-seed4 -Sgrpo.seed=4\n" in capsys.readouterr().out
    run([sys.executable, "-m", "dvc", "queue", "remove", "grpo-only-seed4"], clone, env)


def test_the_plan_sets_every_seed_param_to_the_seed(full_scale_params):
    plan = checked_plan(full_scale_params, [0, 7], ["grpo.loss_type=grpo_clip", "grpo.learning_rate=3e-5"], SEED_PARAMS)
    assert plan[7] == {"grpo.loss_type": "grpo_clip", "grpo.learning_rate": 3e-5, **dict.fromkeys(SEED_PARAMS, 7)}
    # Every seed param the stages read is one of them or a data or evaluation seed, which stay fixed (same questions).
    seed_keys = {key for key in flatten(yaml.safe_load(full_scale_params)) if key.endswith("seed")}
    assert seed_keys - set(SEED_PARAMS) == {"data.split_seed", "data.arithmetic.seed", "rollout.seed"}
    with pytest.raises(SeedsError, match="--vary: name one seed param"):
        checked_plan(full_scale_params, [0], [], [])


def test_values_read_as_dvc_reads_them():
    assert parse_assignment("grpo.learning_rate=3e-5") == ("grpo.learning_rate", 3e-5)
    assert parse_assignment("baseline.prompts=[r1_zero]") == ("baseline.prompts", ["r1_zero"])
    assert parse_assignment("grpo.rollout_is_cap=null") == ("grpo.rollout_is_cap", None)
    assert parse_assignment("rollout.engine_device=cuda:1") == ("rollout.engine_device", "cuda:1")
    assert parse_assignment("++eval.protocols={greedy:{temperature:0}}") == (
        "eval.protocols",
        {"greedy": {"temperature": 0}},
    )


def test_names():
    assert default_setting_name([]) == "default"
    assert default_setting_name(["grpo.loss_type=grpo_clip", "baseline.prompts=[r1_zero]"]) == (
        "loss_type-grpo_clip_prompts-_r1_zero"
    )
    assert parse_experiment_name(experiment_name("lr-3e-5", 12)) == ("lr-3e-5", 12)
    assert parse_experiment_name("no-baseline") is None and parse_experiment_name("a-seedx") is None

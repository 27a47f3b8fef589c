"""The real DVC pipeline on the CPU preset, in a temporary git repository holding this working tree."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.presets import apply_to_file, load_preset

REPO = Path(__file__).resolve().parents[1]
# Even smaller than the CPU preset: this checks the plumbing, not the accuracy.
TEST_OVERRIDES = {"eval.num_examples": 12, "eval.max_tokens": 24, "data.val_size": 50}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def pipeline_repo(tmp_path_factory, gsm8k_mirror):
    """This working tree (tracked and untracked-but-not-ignored files) committed into a fresh git repo."""
    clone = tmp_path_factory.mktemp("repo")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GSM8K_MIRROR": str(gsm8k_mirror),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    apply_to_file({**load_preset("cpu"), **TEST_OVERRIDES}, clone / "params.yaml")
    run(["git", "init", "-q"], clone, env)
    run(["git", "add", "-A"], clone, env)
    run(["git", "commit", "-qm", "pipeline under test"], clone, env)
    return clone, env


@pytest.mark.slow
def test_dvc_repro_baseline_on_cpu_preset(pipeline_repo):
    clone, env = pipeline_repo
    run(["dvc", "repro", "baseline"], clone, env)

    metrics = json.loads((clone / "reports/baseline/metrics.json").read_text())
    assert set(metrics) == {"r1_zero", "question_only"}
    for prompt, summary in metrics.items():
        assert summary["n"] == 12
        assert sum(summary["categories"].values()) == 12
        assert 0.0 <= summary["accuracy"] <= summary["format_rate"] <= 1.0
        records = [json.loads(line) for line in (clone / f"reports/baseline/generations/{prompt}.jsonl").open()]
        assert len(records) == 12
        assert {"question", "prompt", "response", "ground_truth", "reward", "length"} <= set(records[0])
        assert all(record["length"] <= 24 for record in records)
    splits = {name: len((clone / f"data/gsm8k/{name}.jsonl").read_text().splitlines()) for name in ("train", "val")}
    assert splits == {"train": 7473 - 50, "val": 50}

    assert "Data and pipelines are up to date" in run(["dvc", "status"], clone, env)
    shown = json.loads(run(["dvc", "metrics", "show", "--json"], clone, env))
    assert shown  # DVC itself finds the declared metrics
    # git sees only DVC's bookkeeping; the data, model and reports themselves are git-ignored DVC outputs
    status = run(["git", "status", "--porcelain", "--untracked-files=all"], clone, env).splitlines()
    assert sorted(line[3:] for line in status) == [
        "data/.gitignore",
        "dvc.lock",
        "models/.gitignore",
        "reports/baseline/.gitignore",
    ]

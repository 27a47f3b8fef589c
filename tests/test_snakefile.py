"""The Snakefile declares the same graph as dvc.yaml: its DAG, built through Snakemake's API (dry run), is compared
stage by stage with dvc.yaml; the comparison is shown to catch a divergence; `snakemake --lint` is clean."""

import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from snakemake.api import SnakemakeApi
from snakemake.exceptions import WorkflowError
from snakemake.io import is_flagged
from snakemake.settings.types import (
    ConfigSettings,
    DAGSettings,
    ExecutionSettings,
    OutputSettings,
    Quietness,
    ResourceSettings,
)

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
MODEL_STAGES = {"baseline", "sft", "expert_iteration", "grpo", "final_eval"}


@dataclass(frozen=True)
class Stage:
    """One stage as either tool declares it, reduced to what both must agree on."""

    cmd: str  # whitespace-normalised command line
    deps: frozenset[str]
    outs: frozenset[str]
    directories: frozenset[str]  # outs that are folders
    params: frozenset[str]  # params.yaml sections the stage reruns on
    kept: frozenset[str]  # paths the stage keeps across failed runs (resumable state), never outputs


def normalise(cmd: str) -> str:
    return " ".join(cmd.split())


def dvc_stages(dvc: dict) -> dict[str, Stage]:
    stages = {}
    for name, stage in dvc["stages"].items():
        outs, kept = set(), set()
        for out in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []):
            path, options = next(iter(out.items())) if isinstance(out, dict) else (out, {})
            (kept if options.get("persist") else outs).add(path)
        stages[name] = Stage(
            cmd=normalise(stage["cmd"]),
            deps=frozenset(stage.get("deps", [])),
            outs=frozenset(outs),
            # dvc.yaml does not say which outs are folders; every file out of this pipeline has an extension.
            directories=frozenset(path for path in outs if not Path(path).suffix),
            params=frozenset(stage.get("params", [])),
            kept=frozenset(kept),
        )
    return stages


def snakemake_jobs(snakefile: Path, workdir: Path = REPO, config: dict | None = None) -> dict:
    """The jobs of a dry run of target `all` from scratch, by rule name."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(config=config or {}),
            snakefile=snakefile,
            workdir=workdir,
        )
        dag = workflow.dag(DAGSettings(targets={"all"}, forceall=True))
        # lock=False: a dry run must not block (or be blocked by) a real run in the same directory.
        dag.execute_workflow(executor="dryrun", execution_settings=ExecutionSettings(lock=False))
        # The API has no public accessor for the jobs of a built DAG.
        return {job.rule.name: job for job in workflow._workflow.dag.jobs}


def snakemake_stages(jobs: dict, sections: set[str]) -> dict[str, Stage]:
    stages = {}
    for name, job in jobs.items():
        if name == "all":
            continue
        cmd = normalise(job.shellcmd or "")
        # Rules send their output to their log; dvc.yaml leaves it on the terminal.
        for log in job.log:
            cmd = cmd.removesuffix(f" > {log} 2>&1")
        params = dict(job.params.items())
        stages[name] = Stage(
            cmd=cmd,
            deps=frozenset(map(str, job.input)),
            outs=frozenset(map(str, job.output)),
            directories=frozenset(str(out) for out in job.output if is_flagged(out, "directory")),
            params=frozenset(key for key in params if key in sections),
            kept=frozenset(value for key, value in params.items() if key not in sections and isinstance(value, str)),
        )
    return stages


def divergences(dvc: dict[str, Stage], snake: dict[str, Stage]) -> list[str]:
    """Every difference between the two declarations, one readable line each (empty when they agree)."""
    found = [f"stage {name} only in dvc.yaml" for name in sorted(dvc.keys() - snake.keys())]
    found += [f"rule {name} only in the Snakefile" for name in sorted(snake.keys() - dvc.keys())]
    for name in sorted(dvc.keys() & snake.keys()):
        for field in dataclasses.fields(Stage):
            ours, theirs = getattr(dvc[name], field.name), getattr(snake[name], field.name)
            if ours == theirs:
                continue
            if isinstance(ours, str):
                found.append(f"{name}.{field.name}: dvc.yaml {ours!r} != Snakefile {theirs!r}")
            else:
                found.append(
                    f"{name}.{field.name}: only in dvc.yaml {sorted(ours - theirs)}, "
                    f"only in the Snakefile {sorted(theirs - ours)}"
                )
    return found


@pytest.fixture(scope="module")
def params() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def dvc() -> dict[str, Stage]:
    return dvc_stages(yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def jobs() -> dict:
    return snakemake_jobs(SNAKEFILE)


def test_snakefile_declares_the_dvc_graph(dvc, jobs, params):
    found = divergences(dvc, snakemake_stages(jobs, set(params)))
    assert not found, "dvc.yaml and the Snakefile diverge:\n" + "\n".join(found)


def test_all_targets_the_report(dvc, jobs):
    assert set(map(str, jobs["all"].input)) == dvc["report"].outs


def test_model_stages_request_gpus_from_the_rollout_layout(jobs, params):
    expected = {"cpu": 0, "colocate": 1, "split": 2}[params["rollout"]["layout"]]
    gpus = {name: job.resources.get("gpu") for name, job in jobs.items()}
    assert {name: gpus[name] for name in MODEL_STAGES} == dict.fromkeys(MODEL_STAGES, expected)
    assert not any(gpus[name] for name in gpus.keys() - MODEL_STAGES)


def test_divergent_dvc_yaml_is_reported(jobs, params):
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
    dvc["stages"]["sft"]["outs"].append("reports/sft/extra.json")
    del dvc["stages"]["report"]
    found = divergences(dvc_stages(dvc), snakemake_stages(jobs, set(params)))
    assert found == [
        "rule report only in the Snakefile",
        "sft.outs: only in dvc.yaml ['reports/sft/extra.json'], only in the Snakefile []",
    ]


def test_divergent_snakefile_is_reported(dvc, params, tmp_path):
    text = SNAKEFILE.read_text(encoding="utf-8")
    original = 'stats="reports/filter_cots/stats.json"'
    assert text.count(original) == 1  # the edit below must still hit the Snakefile
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(text.replace(original, 'stats="reports/filter_cots/summary.json"'), encoding="utf-8")
    found = divergences(dvc, snakemake_stages(snakemake_jobs(snakefile), set(params)))
    assert [line.split(":")[0] for line in found] == ["filter_cots.cmd", "filter_cots.outs"]


def test_config_overrides_are_refused():
    # The stage scripts read params.yaml, so an override would change Snakemake's rerun decisions but not the run.
    with pytest.raises(WorkflowError, match="params.yaml is the only config"):
        snakemake_jobs(SNAKEFILE, config={"eval": {"temperature": 0.5}})


def test_lint_is_clean():
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint", "--snakefile", str(SNAKEFILE), "--directory", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Lints for" not in output, output

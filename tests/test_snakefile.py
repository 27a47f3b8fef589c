"""One declaration, two runners: the Snakefile's rules are dvc.yaml's stages as DVC itself resolves them (commands,
inputs, outputs, params, templated init models); `snakemake --lint` is clean; a real `snakemake --cores 2` runs
the tiny pipeline end to end and then has nothing left to do."""

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dvc.dependency.param import ParamsDependency
from dvc.repo import Repo
from pipeline_repo import TINY_PIPELINE_OVERRIDES, make_pipeline_repo, run
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

from reasonrl.config import LAYOUT_GPUS
from reasonrl.pipeline import PipelineError, read_pipeline
from reasonrl.presets import apply_to_file
from reasonrl.routes import ROUTES

REPO = Path(__file__).resolve().parents[1]
MODEL_STAGES = {"baseline", "sft", "expert_iteration", "grpo", "final_eval"}


@pytest.fixture(scope="module", autouse=True)
def snakemake_globals_restored():
    """A Snakemake workflow built in this process writes its Snakefile's globals into ``snakemake.workflow``'s own,
    ``storage`` among them, an object whose every attribute (``__dict__`` too) is a storage proxy. vLLM's start-up
    scans each module's namespace and reads ``vars(value).get``: a later in-process engine in this worker then fails
    to start (test_lora did, under pytest-xdist). The workflow's globals go when this module's tests are done."""
    import snakemake.workflow

    before = dict(vars(snakemake.workflow))
    yield
    for name in set(vars(snakemake.workflow)) - set(before):
        delattr(snakemake.workflow, name)
    for name, value in before.items():
        setattr(snakemake.workflow, name, value)


@pytest.fixture
def workflow_copy(tmp_path: Path, full_scale_params: str):
    """Makes the Snakefile, dvc.yaml and the committed params.yaml (with overrides; ``make demo`` rewrites the
    workspace's) a directory of their own, beside links to the code the stages depend on."""

    def make(overrides: dict | None = None) -> Path:
        for name in ("Snakefile", "dvc.yaml", ".dvcignore"):
            shutil.copy2(REPO / name, tmp_path / name)
        (tmp_path / "params.yaml").write_text(full_scale_params, encoding="utf-8")
        apply_to_file(overrides or {}, tmp_path / "params.yaml")
        for name in ("src", "stages", "profiles", "rewards"):
            (tmp_path / name).symlink_to(REPO / name)
        return tmp_path

    return make


def snakemake_jobs(workdir: Path, config: dict | None = None) -> dict:
    """The jobs of a dry run of target `all` from scratch, by rule name."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(config=config or {}),
            snakefile=workdir / "Snakefile",
            workdir=workdir,
        )
        dag = workflow.dag(DAGSettings(targets={"all"}, forceall=True))
        # lock=False: a dry run must not block (or be blocked by) a real run in the same directory.
        dag.execute_workflow(executor="dryrun", execution_settings=ExecutionSettings(lock=False))
        # The API has no public accessor for the jobs of a built DAG.
        return {job.rule.name: job for job in workflow._workflow.dag.jobs}


def dvc_resolved(workdir: Path) -> dict[str, dict]:
    """Each stage as DVC itself resolves dvc.yaml (templating included): command, file deps, outs, params. A
    directory of the source tree (a dep no stage outputs) counts as the files DVC hashes in it (.dvcignore
    applied)."""
    with Repo(str(workdir), uninitialized=True) as repo:
        produced = {out.def_path for stage in repo.index.stages for out in stage.outs}

        def files(dep: str) -> set[str]:
            if dep in produced or not (workdir / dep).is_dir():
                return {dep}
            return {str(Path(path).relative_to(workdir)) for path in repo.dvcignore.find(repo.fs, str(workdir / dep))}

        return {
            stage.name: {
                "cmd": " ".join(stage.cmd.split()),
                "deps": {f for d in stage.deps if not isinstance(d, ParamsDependency) for f in files(d.def_path)},
                "outs": {o.def_path for o in stage.outs},
                "params": {key for d in stage.deps if isinstance(d, ParamsDependency) for key in d.params},
            }
            for stage in repo.index.stages
        }


def rule_view(job) -> dict:
    cmd = " ".join((job.shellcmd or "").split())
    for log in job.log:  # rules send their output to their log; dvc.yaml leaves it on the terminal
        cmd = cmd.removesuffix(f" > {log} 2>&1")
    return {
        "cmd": cmd,
        "deps": set(map(str, job.input)),
        "outs": set(map(str, job.output)),
        "params": set(job.params.keys()) - {"cmd"},
    }


@pytest.mark.parametrize(
    "overrides",
    [{}, {"grpo.init_model": "sft", "ei.init_model": "sft", "grpo.prompt": "question_only"}],
    ids=["committed params", "templated choices changed"],
)
def test_snakemake_runs_the_stages_dvc_resolves(workflow_copy, overrides):
    workdir = workflow_copy(overrides)
    dvc = dvc_resolved(workdir)
    jobs = snakemake_jobs(workdir)
    ours = read_pipeline(workdir / "dvc.yaml", yaml.safe_load((workdir / "params.yaml").read_text()))
    assert set(jobs) - {"all"} == set(dvc)
    for name, stage in dvc.items():
        # Snakemake params are keyword names (dots → underscores); a whole-file dep is one DVC lists without keys.
        whole_file = {"params_yaml"} if "params.yaml" in ours[name].params else set()
        expected_params = {key.replace(".", "_") for key in stage["params"]} | whole_file
        assert rule_view(jobs[name]) == {**stage, "params": expected_params}, name
    init = overrides.get("grpo.init_model", "base")
    assert f"models/{init}" in dvc["grpo"]["deps"] and "--models models" in dvc["grpo"]["cmd"]
    other = {"models/base", "models/sft", "models/ei"} - {f"models/{init}"}
    assert not other & dvc["grpo"]["deps"], "grpo must depend on its init model only"


def test_directories_are_directory_outputs(workflow_copy):
    jobs = snakemake_jobs(workflow_copy())
    directories = {str(out) for job in jobs.values() for out in job.output if is_flagged(out, "directory")}
    assert {"data/gsm8k", "models/base", "models/grpo", "reports/grpo/live", "reports/figures"} <= directories
    assert not {out for out in directories if Path(out).suffix}


def test_all_targets_the_report(workflow_copy):
    jobs = snakemake_jobs(workflow_copy())
    assert set(map(str, jobs["all"].input)) == {
        "reports/report.md",
        "reports/report.html",
        "reports/figures",
        "reports/headline.json",
    }


@pytest.mark.parametrize("layout", list(LAYOUT_GPUS))
def test_model_stages_request_gpus_from_the_rollout_layout(workflow_copy, layout):
    jobs = snakemake_jobs(workflow_copy({"rollout.layout": layout}))
    gpus = {name: job.resources.get("gpu") for name, job in jobs.items() if name != "all"}
    assert gpus == {name: LAYOUT_GPUS[layout] if name in MODEL_STAGES else 0 for name in gpus}


@pytest.mark.parametrize(
    ("layout", "nproc_per_node", "nnodes", "grpo_resources", "sbatch"),
    [
        ("colocate", 4, 1, {"gpu": 4, "nodes": None}, " --gpus=4"),
        ("colocate", 8, 2, {"gpu": None, "nodes": 2, "gres": "gpu:8"}, " --gres=gpu:8"),
        ("cpu", 2, 2, {"gpu": None, "nodes": 2, "gres": None}, ""),
    ],
)
def test_a_distributed_grpo_asks_for_a_gpu_per_rank_on_each_node(
    workflow_copy, layout, nproc_per_node, nnodes, grpo_resources, sbatch
):
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    overrides = {"distributed.nproc_per_node": nproc_per_node, "distributed.nnodes": nnodes, "rollout.layout": layout}
    jobs = snakemake_jobs(workflow_copy(overrides))
    assert {name: jobs["grpo"].resources.get(name) for name in grpo_resources} == grpo_resources
    assert set_gres_string(jobs["grpo"]) == sbatch  # what the SLURM plugin adds to sbatch (--nodes comes apart)
    assert jobs["sft"].resources.get("gpu") == LAYOUT_GPUS[layout] and jobs["sft"].resources.get("nodes") is None


def test_grpo_checkpoints_are_no_output(workflow_copy):
    # Snakemake deletes a failed job's outputs: a retried or rerun grpo must find its checkpoints to resume from.
    jobs = snakemake_jobs(workflow_copy())
    assert "--checkpoints models/grpo_checkpoints" in jobs["grpo"].params.cmd
    assert not [out for job in jobs.values() for out in job.output if str(out).startswith("models/grpo_checkpoints")]


def test_source_directories_are_inputs_file_by_file(workflow_copy):
    workdir = workflow_copy()
    (workdir / "src").unlink()
    shutil.copytree(REPO / "src", workdir / "src", ignore=shutil.ignore_patterns("__pycache__"))
    # What Python writes as a stage imports the package: no input, for Snakemake as for DVC.
    (workdir / "src/reasonrl/report/__pycache__").mkdir()
    (workdir / "src/reasonrl/report/__pycache__/tables.cpython-311.pyc").write_bytes(b"bytecode")
    report_inputs = set(map(str, snakemake_jobs(workdir)["report"].input))
    assert report_inputs == dvc_resolved(workdir)["report"]["deps"]
    package = {str(path.relative_to(workdir)) for path in (workdir / "src/reasonrl/report").glob("*.py")}
    assert package <= report_inputs and "src/reasonrl/report" not in report_inputs
    assert not {path for path in report_inputs if "__pycache__" in path}
    assert "reports/grpo/live" in report_inputs  # another stage's directory output stays one input


def test_an_unknown_templated_param_is_an_error(tmp_path):
    (tmp_path / "dvc.yaml").write_text(
        yaml.safe_dump({"stages": {"x": {"cmd": "echo x", "outs": ["${grpo.no_such_param}.txt"]}}})
    )
    with pytest.raises(PipelineError, match=r"\$\{grpo.no_such_param\} is not a param"):
        read_pipeline(tmp_path / "dvc.yaml", yaml.safe_load((REPO / "params.yaml").read_text()))


def test_no_command_templates_a_param():
    # A templated value reaches the shell that DVC and Snakemake run the command in before any script validates it.
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert {name: stage["cmd"] for name, stage in stages.items() if "${" in stage["cmd"]} == {}


def test_a_command_that_templates_a_param_is_refused(tmp_path):
    (tmp_path / "dvc.yaml").write_text(
        yaml.safe_dump({"stages": {"x": {"cmd": "python x.py --prompt ${grpo.prompt}", "outs": ["x.txt"]}}})
    )
    with pytest.raises(PipelineError, match=r"stage x's cmd interpolates \$\{grpo.prompt\}, which a shell would run"):
        read_pipeline(tmp_path / "dvc.yaml", {"grpo": {"prompt": "r1_zero; echo INJECTED > /tmp/x; #"}})


def test_a_persisted_output_is_refused(tmp_path):
    """Resumable state (GRPO's checkpoints) is no output: Snakemake would delete it with a failed job's outputs."""
    stage = {"cmd": "PYTHONPATH=src python x.py", "outs": [{"state": {"persist": True}}]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"x": stage}}))
    with pytest.raises(PipelineError, match="stage x persists state; keep resumable state out of outs"):
        read_pipeline(tmp_path / "dvc.yaml", {})


def test_config_overrides_are_refused_by_name(workflow_copy):
    # The stage scripts read params.yaml, so an override would change Snakemake's rerun decisions but not the run.
    workdir = workflow_copy()
    with pytest.raises(WorkflowError, match=r"set eval.temperature, grpo.loss_type, which the stages would not see"):
        snakemake_jobs(workdir, config={"grpo": {"loss_type": "no_baseline"}, "eval": {"temperature": 0.5}})
    assert snakemake_jobs(workdir, config={"eval": {"temperature": 1.0}})  # params.yaml's own value


def test_lint_is_clean():
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint", "--snakefile", str(REPO / "Snakefile"), "--directory", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Lints for" not in output, output


@pytest.mark.slow
def test_snakemake_runs_the_tiny_pipeline_to_the_report(tmp_path):
    clone, env = make_pipeline_repo(tmp_path, TINY_PIPELINE_OVERRIDES)
    run([sys.executable, "-m", "snakemake", "--cores", "2"], clone, env)
    final = json.loads((clone / "reports/final/metrics.json").read_text())
    assert set(final) == set(ROUTES)
    assert (clone / "reports/report.html").is_file() and (clone / "logs/grpo.log").is_file()
    # The grader cross-check ran in the stage's process (math-verify's timeouts need its main thread).
    crosscheck = json.loads((clone / "reports/final/grader_crosscheck.json").read_text())
    for route, summary in final.items():
        assert summary["grader_disagreements"] == len(crosscheck[route])
        assert summary["grader_agreement"] == (summary["n"] - len(crosscheck[route])) / summary["n"]
    headline = json.loads((clone / "reports/headline.json").read_text())
    assert headline["test_accuracy"] == {route: final[route]["accuracy"] for route in ROUTES}
    assert not list((clone / "models/grpo_checkpoints").glob("step-*"))  # a completed run keeps none
    assert planned_rules(clone, env) == set()

    # An in-place edit of a file in a source directory reruns the rules that read it, and only those.
    tables = clone / "src/reasonrl/report/tables.py"
    tables_text = tables.read_text()
    tables.write_text(tables_text + "# edited in place\n")
    assert planned_rules(clone, env) == {"report", "all"}
    params = clone / "params.yaml"
    params_text = params.read_text()
    apply_to_file({"grpo.eval_every": 2}, params)
    assert planned_rules(clone, env) == {"grpo", "final_eval", "report", "all"}
    tables.write_text(tables_text)
    params.write_text(params_text)

    # DVC takes over what Snakemake ran: `dvc commit -f` writes the dvc.lock a Snakemake run leaves absent...
    assert not (clone / "dvc.lock").exists()
    run([sys.executable, "-m", "dvc", "commit", "-f"], clone, env)
    assert "Data and pipelines are up to date." in run([sys.executable, "-m", "dvc", "status"], clone, env)
    # ... with the hashes of the outputs alone, as `dvc repro` records them: Snakemake's markers are not hashed.
    markers = [path for path in clone.rglob(".snakemake_timestamp") if ".snakemake" not in path.parent.parts]
    assert clone / "data/gsm8k/.snakemake_timestamp" in markers
    for marker in markers:
        marker.unlink()
    assert "Data and pipelines are up to date." in run([sys.executable, "-m", "dvc", "status"], clone, env)


def planned_rules(workdir: Path, env: dict[str, str]) -> set[str]:
    """The rules a dry run of `snakemake` would run, from its job stats table."""
    output = run([sys.executable, "-m", "snakemake", "--cores", "2", "-n"], workdir, env)
    if "Nothing to be done" in output:
        return set()
    table = output.split("Job stats:", 1)[1].splitlines()[3:]  # after the header and its rule
    return {line.split()[0] for line in itertools.takewhile(lambda line: not line.startswith("total"), table)}

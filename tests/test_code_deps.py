"""The code a stage runs is the code dvc.yaml says it depends on, and the package's layers import downwards only.

Each stage script's import closure inside ``reasonrl`` (every ``import`` at any depth, function-level ones included;
``if TYPE_CHECKING:`` blocks excluded, they never run) must be covered by the stage's deps, which list exactly what
``python -m reasonrl.code_deps`` prints for the stage's command, in its order; and its prompt template deps are the
templates it reads, no more (a template edit reruns exactly those stages). Every command imports the
package from the tree it runs in. The import graph has no cycle, and the params schema, the CLI's error handling and
the ``download`` stage load neither torch, transformers nor vLLM. The closure is :mod:`reasonrl.code_deps`'s, which
a GRPO checkpoint's fingerprint hashes: an edit to that code, and only to it, changes the digest."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reasonrl.code_deps import (
    SOURCE,
    STAGES,
    code_digest,
    code_files,
    command_entries,
    declared_imports,
    import_closure,
    listed_code_deps,
    runtime_imports,
    source_file,
    stage_code_deps,
    stale_stages,
    yaml_lines,
)
from reasonrl.pipeline import CODE_FROM_TREE, PipelineError, read_pipeline
from reasonrl.presets import apply_to_file
from reasonrl.prompts import PROMPT_NAMES
from reasonrl.routes import ROUTE, ROUTES

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "vllm")
TEMPLATES = SOURCE / "reasonrl/prompts"


def uncovered(deps: tuple[str, ...], script: Path) -> list[str]:
    needed = {source_file(module).relative_to(REPO).as_posix() for module in import_closure(script)}
    return sorted(path for path in needed if not any(path == d or path.startswith(f"{d}/") for d in deps))


def templates_read(stage: str, params: dict) -> set[str]:
    """The prompt templates a stage reads by name at run time, which no import shows: baseline all of
    ``baseline.prompts`` (a list DVC cannot template into deps, so it depends on every template), the tiny tokenizer
    of prepare_model every template (reasonrl.models.tokenizer_corpus), filter_cots and sft (its validation) the
    ``sft.prompt``, expert iteration its ``ei.prompt``, GRPO its ``grpo.prompt``, and the final evaluation all three
    (base with ``sft.prompt``)."""
    sft, ei, grpo = (params[section]["prompt"] for section in ("sft", "ei", "grpo"))
    return {
        "prepare_model": set(PROMPT_NAMES),
        "baseline": set(PROMPT_NAMES),
        "filter_cots": {sft},
        "sft": {sft},
        "expert_iteration": {ei},
        "grpo": {grpo},
        "final_eval": {params[ROUTE[route].prompt_section]["prompt"] for route in ROUTES},
    }.get(stage, set())


@pytest.fixture(scope="module")
def stages(full_scale_params):
    return read_pipeline(REPO / "dvc.yaml", yaml.safe_load(full_scale_params))


def test_every_stage_depends_on_the_code_it_imports(stages):
    gaps = {}
    for name, stage in stages.items():
        script = REPO / next(word for word in stage.cmd.split() if word.startswith("stages/"))
        assert script.relative_to(REPO).as_posix() in stage.deps, f"{name} does not depend on its own script"
        if missing := uncovered(stage.deps, script):
            gaps[name] = missing
    assert not gaps, f"dvc.yaml stages miss code they import: {gaps}"


def test_each_stage_lists_exactly_the_code_its_command_runs(stages):
    assert stale_stages(REPO / "dvc.yaml") == {}
    for name, stage in stages.items():  # the scripts first, then the package's paths sorted
        listed = listed_code_deps(stage.deps)
        scripts, _ = command_entries(stage.cmd)
        assert listed[: len(scripts)] == scripts and listed[len(scripts) :] == sorted(listed[len(scripts) :]), name


def code_deps_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}
    command = [sys.executable, "-m", "reasonrl.code_deps", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)


def test_the_printed_deps_are_dvc_yamls(stages):
    printed = code_deps_cli("stages/grpo.py", "reasonrl.launch")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == yaml_lines(listed_code_deps(stages["grpo"].deps))
    assert printed.stdout.startswith("      - stages/grpo.py\n")
    assert "      - src/reasonrl/launch.py\n" in printed.stdout  # the module the command runs with -m
    assert code_deps_cli("--check").returncode == 0


@pytest.mark.parametrize(
    ("listed", "edited"),
    [
        (["config.py"], []),  # a module missing
        (["rewards.py"], ["rewards.py", "lora.py"]),  # one more
        (["errors.py", "evaluation.py"], ["evaluation.py", "errors.py"]),  # out of order
    ],
)
def test_the_check_names_a_stage_whose_code_deps_differ(stages, tmp_path, listed, edited):
    text = (REPO / "dvc.yaml").read_text(encoding="utf-8")
    before, after = (yaml_lines(f"src/reasonrl/{name}" for name in names) for names in (listed, edited))
    # in the first stage that lists them: report
    (tmp_path / "dvc.yaml").write_text(text.replace(before, after, 1), encoding="utf-8")
    assert list(stale_stages(tmp_path / "dvc.yaml")) == ["report"]
    checked = code_deps_cli("--check", str(tmp_path / "dvc.yaml"))
    assert checked.returncode == 1
    expected = yaml_lines(listed_code_deps(stages["report"].deps))
    assert checked.stdout == f"{tmp_path / 'dvc.yaml'}: stage report's code deps should be, in this order:\n{expected}"
    written = code_deps_cli("--write", str(tmp_path / "dvc.yaml"))
    assert written.returncode == 0 and written.stdout == f"{tmp_path / 'dvc.yaml'}: rewrote stage report's code deps\n"
    assert (tmp_path / "dvc.yaml").read_text(encoding="utf-8") == text  # comments and other deps as they were


def test_a_package_the_stage_imports_whole_is_listed_as_its_directory(tree):
    source = tree / "src"
    deps = stage_code_deps(["stages/report.py"], source=source)
    assert "src/reasonrl/report" in deps and not [dep for dep in deps if dep.startswith("src/reasonrl/report/")]
    assert "src/reasonrl/prompts/__init__.py" in deps  # the package's templates are no module: listed one by one
    (tree / "src/reasonrl/report/unused.py").write_text('"""A module the report stage does not import."""\n')
    deps = stage_code_deps(["stages/report.py"], source=source)
    assert "src/reasonrl/report" not in deps and "src/reasonrl/report/unused.py" not in deps
    assert [dep for dep in deps if dep.startswith("src/reasonrl/report/")] == sorted(
        f"src/reasonrl/report/{path.name}" for path in (SOURCE / "reasonrl/report").glob("*.py")
    )


def test_a_missing_module_is_found(stages):
    grpo = stages["grpo"]
    script = REPO / "stages/grpo.py"
    assert uncovered(grpo.deps, script) == []
    without = tuple(d for d in grpo.deps if d not in ("src/reasonrl/config.py", "src/reasonrl/prompts/__init__.py"))
    assert uncovered(without, script) == ["src/reasonrl/config.py", "src/reasonrl/prompts/__init__.py"]


@pytest.mark.parametrize(
    "prompts",
    [{"grpo.prompt": name} for name in PROMPT_NAMES] + [{"sft.prompt": "r1_zero_chat", "ei.prompt": "question_only"}],
)
def test_each_stage_depends_on_the_templates_it_reads_only(tmp_path, full_scale_params, prompts):
    params_file = tmp_path / "params.yaml"
    params_file.write_text(full_scale_params)
    apply_to_file(prompts, params_file)
    params = yaml.safe_load(params_file.read_text())
    for name, stage in read_pipeline(REPO / "dvc.yaml", params).items():
        templates = {Path(dep).stem for dep in stage.deps if dep.endswith(".prompt")}
        assert templates == templates_read(name, params), name
        for dep in stage.deps:  # a directory would bring every template (the whole prompts package) back
            assert not (REPO / dep).is_dir() or not list((REPO / dep).rglob("*.prompt")), (name, dep)
        for template in templates:
            assert (TEMPLATES / f"{template}.prompt").is_file(), (name, template)


def test_a_command_that_imports_the_installed_package_is_refused(tmp_path):
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"x": {"cmd": "python x.py", "outs": ["x.txt"]}}}))
    with pytest.raises(PipelineError, match=r"dvc.yaml: stage x's cmd must start with 'PYTHONPATH=src '"):
        read_pipeline(tmp_path / "dvc.yaml", {})


PROBE = """
import os, sys
from pathlib import Path
import reasonrl.code_deps
Path(sys.argv[1], os.environ.get("RANK", "alone")).write_text(f"{reasonrl.code_deps.SOURCE}\\n{reasonrl.__file__}")
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_stage_command_imports_the_package_of_the_tree_it_runs_in(tree, tmp_path_factory, ranks):
    """As DVC runs a queued experiment in a copy of the repository: the launcher, each torchrun rank and the script
    import the copy's reasonrl, whose code_deps.SOURCE (the code GRPO's checkpoint fingerprint hashes) is the
    copy's src/ too; not the package installed from this checkout."""
    (tree / "probe.py").write_text(PROBE)
    seen = tmp_path_factory.mktemp("seen")
    command = f"{CODE_FROM_TREE}{sys.executable} -m reasonrl.launch --nproc-per-node {ranks} probe.py {seen}"
    subprocess.run(command, shell=True, cwd=tree, check=True, capture_output=True)
    expected = f"{tree / 'src'}\n{tree / 'src/reasonrl/__init__.py'}"
    assert {path.name: path.read_text() for path in seen.iterdir()} == (
        {"alone": expected} if ranks == 1 else {"0": expected, "1": expected}
    )


@pytest.fixture
def tree(tmp_path):
    """A copy of the stage scripts and the package, to edit (the checkout is shared)."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(STAGES, tmp_path / "stages", ignore=ignore)
    shutil.copytree(SOURCE / "reasonrl", tmp_path / "src/reasonrl", ignore=ignore)
    return tmp_path


@pytest.mark.parametrize(
    ("edited", "counts"),
    [
        ("stages/grpo.py", True),
        ("src/reasonrl/prompts/question_only.prompt", True),  # a template, not a module: read at run time
        ("src/reasonrl/grading.py", True),  # imported through reasonrl.prompts only
        ("src/reasonrl/report/__init__.py", False),  # the report stage's, never imported by grpo
        ("stages/sft.py", False),
    ],
)
def test_the_grpo_code_digest_changes_with_the_code_the_stage_runs_only(tree, edited, counts):
    script, source = tree / "stages/grpo.py", tree / "src"
    before = code_digest(script, source)
    with (tree / edited).open("a", encoding="utf-8") as stream:
        stream.write("\n# an edit\n")
    assert (code_digest(script, source) != before) == counts
    assert (tree / edited in code_files(script, source)) == counts


def test_the_code_digest_is_the_same_for_the_same_code_anywhere(tree, tmp_path_factory):
    copy = tmp_path_factory.mktemp("elsewhere")
    shutil.copytree(tree, copy, dirs_exist_ok=True)
    assert code_digest(tree / "stages/grpo.py", tree / "src") == code_digest(copy / "stages/grpo.py", copy / "src")


def test_the_package_import_graph_has_no_cycle():
    modules = {
        ".".join(path.relative_to(SOURCE).with_suffix("").parts).removesuffix(".__init__")
        for path in (SOURCE / "reasonrl").rglob("*.py")
    }
    graph = {module: runtime_imports(source_file(module)) - {module} for module in modules}
    # A package's __init__ importing its own submodules is not a cycle of concerns; reasonrl's is lazy anyway.
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                pytest.fail("import cycle: " + " → ".join([*path[path.index(imported) :], imported]))
            if imported not in state:
                visit(imported, [*path, imported])
        state[module] = "done"

    for module in sorted(modules):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize(
    "code",
    [
        "import reasonrl.config",  # the params schema
        "import reasonrl.cli",  # every stage's error handling
        "import reasonrl",  # the package itself (its handout functions load on first use)
        "import runpy; runpy.run_path('stages/download.py', run_name='not_main')",
    ],
)
def test_light_layers_load_no_training_stack(code):
    probe = f"{code}; import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"{code} loads {result.stdout.strip()}"


def test_the_download_stage_imports_no_training_loop():
    loaded = import_closure(REPO / "stages/download.py")
    assert not loaded & {
        "reasonrl.grpo",
        "reasonrl.sft",
        "reasonrl.training",
        "reasonrl.rollouts.engine",
        "reasonrl.models",
        "reasonrl.losses",
    }


LAYERS = [
    # base: no params, no torch
    ["reasonrl.errors", "reasonrl.atomic", "reasonrl.cli", "reasonrl.code_deps", "reasonrl.markdown",
     "reasonrl.repository", "reasonrl.statistics", "reasonrl.schedules", "reasonrl.loss_types",
     "reasonrl.loss_registry", "reasonrl.grading", "reasonrl.synthetic", "reasonrl.symbolic", "reasonrl.contamination"],
    # the task: examples, prompt templates, rewards, benchmarks
    ["reasonrl.data", "reasonrl.prompts", "reasonrl.rewards", "reasonrl.benchmarks"],
    # the params (whose schema checks names against the task's registries) and the routes they configure
    ["reasonrl.config", "reasonrl.presets", "reasonrl.routes"],
    # models and the computations on them
    ["reasonrl.models", "reasonrl.tiny_model", "reasonrl.cot_filter", "reasonrl.tokenization", "reasonrl.batching",
     "reasonrl.logprobs", "reasonrl.losses", "reasonrl.distributed", "reasonrl.lora", "reasonrl.memory",
     "reasonrl.cost", "reasonrl.launch"],
    # sampling: the engine, its process, and evaluating with it (whose results the process hands back)
    ["reasonrl.rollouts", "reasonrl.evaluation", "reasonrl.protocols"],
    # the run harness: checkpoints, resuming, the trained models' cards
    ["reasonrl.training", "reasonrl.model_card"],
    # the algorithms
    ["reasonrl.sft", "reasonrl.expert_iteration", "reasonrl.grpo", "reasonrl.crosscheck"],
    # what reads the runs' outputs and drives the pipeline (make demo, the seeds of a setting)
    ["reasonrl.report", "reasonrl.compare", "reasonrl.pipeline", "reasonrl.demo", "reasonrl.seeds"],
]  # fmt: skip
"""The package's layers, lowest first: a module imports (at run time or for its annotations) from its own layer or
lower ones only. Each entry names a module or a package, whose submodules it covers."""
UPWARD_IMPORTS: dict[tuple[str, str], str] = {}
"""The imports known to go up a layer, each with the change that removes it: the coordinator empties this as they
merge. Strict: an exception the code no longer needs fails too."""


def layer_of(module: str) -> int:
    found = [
        i for i, layer in enumerate(LAYERS) for prefix in layer if module == prefix or module.startswith(f"{prefix}.")
    ]
    assert len(found) == 1, f"{module} is in {len(found)} layers of LAYERS: declare it in one"
    return found[0]


def test_the_package_layers_import_downwards_only():
    """The package's own ``__init__`` (a lazy façade of the handout's functions that every import passes through) is
    no layer's."""
    modules = sorted(
        ".".join(path.relative_to(SOURCE).with_suffix("").parts).removesuffix(".__init__")
        for path in (SOURCE / "reasonrl").rglob("*.py")
    )
    upward = {
        (module, imported)
        for module in modules
        if module != "reasonrl"
        for imported in declared_imports(source_file(module))
        if imported != "reasonrl" and layer_of(imported) > layer_of(module)
    }
    assert upward == set(UPWARD_IMPORTS), (
        f"imports up a layer: {sorted(upward - set(UPWARD_IMPORTS))}; no longer: "
        + str(sorted(set(UPWARD_IMPORTS) - upward))
    )

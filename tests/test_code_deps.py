"""The code a stage runs is the code dvc.yaml says it depends on, and the package's layers import downwards only.

Each stage script's import closure inside ``reasonrl`` (every ``import`` at any depth, function-level ones included;
``if TYPE_CHECKING:`` blocks excluded, they never run) must be covered by the stage's deps, a package with data files
(the prompt templates) by its whole directory. The import graph has no cycle, and the params schema, the CLI's error
handling and the ``download`` stage load neither torch, transformers nor vLLM. The closure is
:mod:`reasonrl.code_deps`'s, which a GRPO checkpoint's fingerprint hashes: an edit to that code, and only to it,
changes the digest."""

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
    import_closure,
    module_path,
    runtime_imports,
    source_file,
)
from reasonrl.pipeline import read_pipeline

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "vllm")


def required_deps(module: str) -> str:
    """The dep that covers ``module``: its file, or for a package that ships data files, its directory."""
    path = module_path(module)
    if path.is_dir() and any(p.suffix != ".py" for p in path.iterdir() if p.is_file()):
        return path.relative_to(REPO).as_posix()
    return source_file(module).relative_to(REPO).as_posix()


def uncovered(deps: tuple[str, ...], script: Path) -> list[str]:
    needed = {required_deps(module) for module in import_closure(script)}
    return sorted(path for path in needed if not any(path == d or path.startswith(f"{d}/") for d in deps))


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


def test_a_missing_module_or_prompt_dir_is_found(stages):
    grpo = stages["grpo"]
    script = REPO / "stages/grpo.py"
    assert uncovered(grpo.deps, script) == []
    without = tuple(d for d in grpo.deps if d not in ("src/reasonrl/config.py", "src/reasonrl/prompts"))
    assert uncovered(without, script) == ["src/reasonrl/config.py", "src/reasonrl/prompts"]


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
    assert not loaded & {"reasonrl.grpo", "reasonrl.sft", "reasonrl.rollout", "reasonrl.models", "reasonrl.losses"}

"""The code a stage runs: its script, the ``reasonrl`` modules it imports at any depth (function-level imports
included; ``if TYPE_CHECKING:`` blocks excluded, they never run) and the data files of the packages among them (the
prompt templates). A GRPO checkpoint's fingerprint hashes all of it, every template included (the one GRPO reads is a
param; an edit to another only forgoes a resume), so a code or prompt edit is never resumed from a checkpoint the old
code made. Users' reward modules (``rewards/`` at the repository root) are no part of it: the grading stages depend
on that package whole, and GRPO's fingerprint hashes it when a user's reward grades
(:func:`reasonrl.rewards.user_code_digest`).

dvc.yaml lists each stage's code deps as :func:`stage_code_deps` derives them from the stage's command, exactly and
in its order: the scripts the command runs (``stages/….py``), then the package's modules they and the modules the
command runs (``python -m reasonrl.…``) import, sorted by path. A package whose every file the stage imports is listed
as its directory (``src/reasonrl/report``); any other package module by module, so that a package's data files (the
prompt templates, which dvc.yaml lists one by one: those the stage reads by name) and its modules the stage does not
import rerun nothing. Print a stage's lines, to paste into dvc.yaml, or check dvc.yaml (tests/test_code_deps.py
does)::

    python -m reasonrl.code_deps stages/grpo.py reasonrl.launch    # the script, then each module run with -m
    python -m reasonrl.code_deps --check                            # exit 1 naming each stage that differs
    python -m reasonrl.code_deps --write                            # rewrite the stages that differ, in place
"""

from __future__ import annotations

import argparse
import ast
import hashlib
from collections.abc import Iterable, Sequence
from itertools import pairwise
from pathlib import Path

import yaml

from reasonrl.atomic import atomic_write_text

SOURCE = Path(__file__).resolve().parents[1]
"""The directory that holds the ``reasonrl`` package the running process imported: a stage's own ``src/`` (its
command starts with ``PYTHONPATH=src``, reasonrl.pipeline.CODE_FROM_TREE)."""
STAGES = SOURCE.parent / "stages"


def module_path(module: str, source: Path = SOURCE) -> Path | None:
    """The file (or, for a package, the directory) that holds ``module``; None outside this package."""
    path = source.joinpath(*module.split("."))
    if path.is_dir():
        return path
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def source_file(module: str, source: Path = SOURCE) -> Path:
    path = module_path(module, source)
    return path / "__init__.py" if path.is_dir() else path


def _imports(file: Path, source: Path, type_checking: bool) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in (node.body if type_checking else []) + node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(file.read_text(encoding="utf-8")))
    return {name for name in found if name.split(".")[0] == "reasonrl" and module_path(name, source) is not None}


def runtime_imports(file: Path, source: Path = SOURCE) -> set[str]:
    """The ``reasonrl`` modules ``file`` imports when it runs (``from a import b`` may name module ``a.b``)."""
    return _imports(file, source, type_checking=False)


def declared_imports(file: Path, source: Path = SOURCE) -> set[str]:
    """:func:`runtime_imports` and those of ``if TYPE_CHECKING:`` blocks: every module ``file`` depends on, for its
    annotations too (the package's layering)."""
    return _imports(file, source, type_checking=True)


def module_closure(modules: Iterable[str], source: Path = SOURCE) -> set[str]:
    """``modules`` and every ``reasonrl`` module they import at any depth, parent packages included."""
    seen: set[str] = set()
    pending = list(modules)
    while pending:
        parts = pending.pop().split(".")
        for depth in range(1, len(parts) + 1):
            module = ".".join(parts[:depth])
            if module not in seen:
                seen.add(module)
                pending.extend(runtime_imports(source_file(module, source), source))
    return seen


def import_closure(script: Path, source: Path = SOURCE) -> set[str]:
    """Every ``reasonrl`` module that running ``script`` imports, parent packages included."""
    return module_closure(runtime_imports(script, source), source)


def code_files(script: Path, source: Path = SOURCE) -> list[Path]:
    """``script``, the source file of each module in its import closure and, beside a package's ``__init__.py``, the
    data files it ships (its other files but submodules, which count only when imported)."""
    files = {script}
    for module in import_closure(script, source):
        path = module_path(module, source)
        files.add(source_file(module, source))
        if path.is_dir():
            files.update(p for p in path.iterdir() if p.is_file() and p.suffix != ".py")
    return sorted(files)


def code_digest(script: Path, source: Path = SOURCE) -> str:
    """SHA-256 over :func:`code_files` by name (relative to ``source``; the script by its own name) and content: the
    same code anywhere gives the same digest."""
    digest = hashlib.sha256()
    for file in code_files(script, source):
        name = file.name if file == script else file.relative_to(source).as_posix()
        content = file.read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode() + content)
    return digest.hexdigest()


def _whole_package(directory: Path, files: set[Path]) -> bool:
    """Whether every file under ``directory`` is one of ``files`` (bytecode caches aside: Python writes them)."""
    return all(
        path in files
        for path in directory.rglob("*")
        if path.is_file() and "__pycache__" not in path.relative_to(directory).parts
    )


def package_deps(modules: Iterable[str], source: Path = SOURCE) -> list[str]:
    """The source files of ``modules`` relative to the repository, sorted, each whole package as its directory (the
    outermost one)."""
    files = {source_file(module, source) for module in modules}
    root = source / "reasonrl"
    listed = set()
    for file in files:
        wholes = [d for d in file.parents if d.is_relative_to(root) and _whole_package(d, files)]
        listed.add(wholes[-1] if wholes else file)
    return sorted(path.relative_to(source.parent).as_posix() for path in listed)


def stage_code_deps(scripts: Sequence[str], modules: Sequence[str] = (), source: Path = SOURCE) -> list[str]:
    """dvc.yaml's code deps of a stage whose command runs ``scripts`` (paths relative to the repository) and
    ``modules`` (``python -m``): the scripts in their order, then :func:`package_deps` of all they import."""
    imported = [*modules, *(m for script in scripts for m in runtime_imports(source.parent / script, source))]
    return [*scripts, *package_deps(module_closure(imported, source), source)]


def command_entries(cmd: str) -> tuple[list[str], list[str]]:
    """The scripts (``stages/….py``) a stage command runs, and the ``reasonrl`` modules it runs with ``-m``."""
    words = cmd.split()
    scripts = [word for word in words if word.startswith("stages/") and word.endswith(".py")]
    modules = [after for word, after in pairwise(words) if word == "-m" and after.startswith("reasonrl")]
    return scripts, modules


def listed_code_deps(deps: Iterable[str]) -> list[str]:
    """The code among a stage's deps: its scripts and package paths, the prompt templates aside."""
    return [dep for dep in deps if dep.startswith(("stages/", "src/")) and not dep.endswith(".prompt")]


def stale_stages(dvc_yaml: Path, source: Path = SOURCE) -> dict[str, list[str]]:
    """Each stage of ``dvc_yaml`` whose code deps are not exactly :func:`stage_code_deps` of its command, in that
    order, with the deps it should list."""
    declared = yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8"))
    stale = {}
    for name, stage in declared["stages"].items():
        expected = stage_code_deps(*command_entries(stage["cmd"]), source=source)
        if listed_code_deps(stage.get("deps", [])) != expected:
            stale[name] = expected
    return stale


def rewrite_code_deps(dvc_yaml: Path, source: Path = SOURCE) -> list[str]:
    """Rewrite each stale stage's code deps in ``dvc_yaml`` in place (where its first code dep stands; comments and
    the other deps stay as they are); returns the stages rewritten."""
    stale = stale_stages(dvc_yaml, source)
    lines = Path(dvc_yaml).read_text(encoding="utf-8").splitlines(keepends=True)
    stage, out = None, []
    for line in lines:
        if line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            stage = line.strip().removesuffix(":")
        item = line.strip().removeprefix("- ") if line.lstrip().startswith("- ") else None
        if stage in stale and item is not None and listed_code_deps([item]):
            out.append(yaml_lines(stale[stage]) if stale[stage] else "")
            stale[stage] = []  # written once, where the first code dep stood
            continue
        out.append(line)
    atomic_write_text(dvc_yaml, "".join(out))
    return [name for name, deps in stale.items() if not deps]


def yaml_lines(deps: Iterable[str]) -> str:
    """Deps as dvc.yaml's list lines."""
    return "".join(f"      - {dep}\n" for dep in deps)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.code_deps",
        description="Print the code deps, as dvc.yaml lists them, of a stage that runs the given scripts and modules; "
        "or check that dvc.yaml lists exactly those of each stage's command.",
    )
    parser.add_argument(
        "entries",
        nargs="*",
        metavar="SCRIPT|MODULE",
        help="a script the stage runs (stages/grpo.py) or a module it runs with -m (reasonrl.launch)",
    )
    parser.add_argument(
        "--check",
        type=Path,
        nargs="?",
        const=Path("dvc.yaml"),
        metavar="DVC_YAML",
        help="instead, check each stage of DVC_YAML (dvc.yaml); exit 1 with the lines of each stage that differs",
    )
    parser.add_argument(
        "--write",
        type=Path,
        nargs="?",
        const=Path("dvc.yaml"),
        metavar="DVC_YAML",
        help="instead, rewrite the code deps of each stage of DVC_YAML (dvc.yaml) that differs, in place",
    )
    args = parser.parse_args(argv)
    if args.write is not None:
        for name in rewrite_code_deps(args.write):
            print(f"{args.write}: rewrote stage {name}'s code deps")
        return
    if args.check is None:
        if not args.entries:
            parser.error("give a stage's scripts and modules, or --check")
        scripts = [Path(e).resolve().relative_to(SOURCE.parent).as_posix() for e in args.entries if e.endswith(".py")]
        print(yaml_lines(stage_code_deps(scripts, [e for e in args.entries if not e.endswith(".py")])), end="")
        return
    stale = stale_stages(args.check)
    for name, deps in stale.items():
        print(f"{args.check}: stage {name}'s code deps should be, in this order:\n{yaml_lines(deps)}", end="")
    if stale:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

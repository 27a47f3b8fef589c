"""The code a stage runs: its script, the ``reasonrl`` modules it imports at any depth (function-level imports
included; ``if TYPE_CHECKING:`` blocks excluded, they never run) and the data files of the packages among them (the
prompt templates). dvc.yaml's deps must cover the modules, and list the templates the stage reads by name
(tests/test_code_deps.py). A GRPO checkpoint's fingerprint hashes all of it, every template included (the one GRPO
reads is a param; an edit to another only forgoes a resume), so a code or prompt edit is never resumed from a
checkpoint the old code made. Users' reward modules (``rewards/`` at the repository root) are no part of it: the
grading stages depend on that package whole, and GRPO's fingerprint hashes it when a user's reward grades
(:func:`reasonrl.rewards.user_code_digest`)."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

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


def runtime_imports(file: Path, source: Path = SOURCE) -> set[str]:
    """The ``reasonrl`` modules ``file`` imports when it runs (``from a import b`` may name module ``a.b``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
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


def import_closure(script: Path, source: Path = SOURCE) -> set[str]:
    """Every ``reasonrl`` module that running ``script`` imports, parent packages included."""
    seen: set[str] = set()
    pending = list(runtime_imports(script, source))
    while pending:
        parts = pending.pop().split(".")
        for depth in range(1, len(parts) + 1):
            module = ".".join(parts[:depth])
            if module not in seen:
                seen.add(module)
                pending.extend(runtime_imports(source_file(module, source), source))
    return seen


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

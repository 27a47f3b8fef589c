"""``dvc.yaml`` read as data: the one declaration of the pipeline, for the tools that run it besides DVC.

The Snakefile builds one rule per stage from :func:`read_pipeline`, so both runners execute the same commands on
the same inputs and outputs and cannot drift apart. Only the subset of DVC's syntax this project uses is read: a
stage's ``cmd``, ``deps``, ``params``, ``outs`` and ``metrics``, and ``${dotted.param}``
interpolation from ``params.yaml`` (DVC's templating) in the paths. A ``cmd`` that interpolates is refused: both runners
hand the command to a shell, which would run a param's value (``r1_zero; rm -rf ~``) before any stage validates it.
So is a ``cmd`` that does not start with :data:`CODE_FROM_TREE`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_INTERPOLATION = re.compile(r"\$\{\s*([A-Za-z0-9_.]+)\s*\}")
CODE_FROM_TREE = "PYTHONPATH=src "
"""How every stage command starts: Python then imports ``reasonrl`` from the ``src/`` of the tree the runner runs the
command in (a queued or ``--temp`` DVC experiment's copy), ahead of the installed package, which under an editable
install is the live checkout's and may hold other code than the experiment records. Set in the command, it reaches
every process the stage starts (the launcher's torchrun ranks)."""


class PipelineError(ValueError):
    """``dvc.yaml`` uses something this reader does not understand or allow, or names a param ``params.yaml``
    lacks."""


@dataclass(frozen=True)
class Stage:
    """One stage of ``dvc.yaml``, templating resolved."""

    cmd: str
    deps: tuple[str, ...]
    outs: tuple[str, ...]
    """Outputs, metrics included; a path without a file extension is a directory (true of every output here)."""
    params: dict[str, Any]
    """Each declared param (a section, a dotted key, or ``params.yaml`` for the whole file) → its value."""

    @property
    def directories(self) -> tuple[str, ...]:
        return tuple(out for out in self.outs if not Path(out).suffix)


def lookup(params: dict[str, Any], dotted: str) -> Any:
    value: Any = params
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise PipelineError(f"dvc.yaml: ${{{dotted}}} is not a param in params.yaml")
        value = value[key]
    return value


def interpolate(text: str, params: dict[str, Any]) -> str:
    """``${a.b}`` → the value of ``a.b`` in ``params``, as DVC's templating substitutes it."""
    return _INTERPOLATION.sub(lambda match: str(lookup(params, match.group(1))), text)


def _path_and_options(entry: str | dict) -> tuple[str, dict]:
    if isinstance(entry, str):
        return entry, {}
    ((path, options),) = entry.items()
    return path, options or {}


def read_pipeline(dvc_yaml: str | Path, params: dict[str, Any]) -> dict[str, Stage]:
    """The stages of ``dvc_yaml`` in declaration order, with ``params`` (``params.yaml`` as a mapping) substituted."""
    declared = yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8"))
    unknown = set(declared) - {"stages", "plots"}
    if unknown:
        raise PipelineError(f"{dvc_yaml}: top-level keys {sorted(unknown)} are not supported here")
    stages = {}
    for name, stage in declared["stages"].items():
        unsupported = set(stage) - {"cmd", "deps", "params", "outs", "metrics"}
        if unsupported:
            raise PipelineError(f"{dvc_yaml}: stage {name} uses {sorted(unsupported)}, which this reader ignores")
        templated = _INTERPOLATION.search(stage["cmd"])
        if templated:
            raise PipelineError(
                f"{dvc_yaml}: stage {name}'s cmd interpolates {templated.group(0)}, which a shell would run; let the "
                f"script read it from params.yaml"
            )
        outs = []
        for entry in stage.get("outs", []) + stage.get("metrics", []):
            path, options = _path_and_options(entry)
            if options.get("persist"):
                # Snakemake deletes a failed job's outputs: resumable state must be no output of either runner.
                raise PipelineError(f"{dvc_yaml}: stage {name} persists {path}; keep resumable state out of outs")
            outs.append(interpolate(path, params))
        declared_params = {}
        for entry in stage.get("params", []):
            key, _ = _path_and_options(entry)
            declared_params[key] = params if key == "params.yaml" else lookup(params, key)
        if not stage["cmd"].startswith(CODE_FROM_TREE):
            raise PipelineError(
                f"{dvc_yaml}: stage {name}'s cmd must start with {CODE_FROM_TREE!r}, else it imports reasonrl from "
                f"the installed package (the live checkout, under an editable install) instead of the tree it runs in"
            )
        stages[name] = Stage(
            cmd=" ".join(stage["cmd"].split()),
            deps=tuple(interpolate(dep, params) for dep in stage.get("deps", [])),
            outs=tuple(outs),
            params=declared_params,
        )
    return stages

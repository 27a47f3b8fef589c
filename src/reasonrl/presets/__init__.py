"""Parameter presets: flat ``dotted.key: value`` overrides of ``params.yaml``, shipped as ``<name>.yaml`` here.

A preset becomes DVC ``-S`` overrides (``dvc exp run $(python -m reasonrl.presets cpu)``), or is written into
``params.yaml`` in place (``python -m reasonrl.presets cpu --apply params.yaml``) for a plain ``dvc repro``.
Both are checked against ``params.yaml`` first, so a preset cannot name a parameter that does not exist.
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from reasonrl.config import ConfigError, Params, from_dict, parse_yaml


def available() -> list[str]:
    files = resources.files(__package__).iterdir()
    return sorted(p.name.removesuffix(".yaml") for p in files if p.name.endswith(".yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """The overrides of preset ``name``."""
    if name not in available():
        raise ConfigError(f"unknown preset {name!r}; available: {available()}")
    return parse_yaml(resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")) or {}


def apply_overrides(tree: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Set each ``dotted.key`` in the nested mapping ``tree``; the key's parent must already exist."""
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = tree
        for part in parents:
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"preset sets {dotted}, but params.yaml has no section {part!r}")
            node = node[part]
        if leaf not in node:
            raise ConfigError(f"preset sets {dotted}, but params.yaml has no parameter {leaf!r} there")
        node[leaf] = value


def checked_overrides(name: str, params_path: str | Path) -> dict[str, Any]:
    """The preset's overrides, after checking that params.yaml with them applied is valid."""
    overrides = load_preset(name)
    tree = parse_yaml(Path(params_path).read_text(encoding="utf-8"))
    apply_overrides(tree, overrides)
    from_dict(Params, tree)
    return overrides


def as_set_params(overrides: dict[str, Any]) -> str:
    """``-S key=value`` arguments for ``dvc exp run``, shell-quoted; values in JSON, which DVC's override
    grammar reads back with their types (strings quoted, so ``cuda:1`` or ``1.0`` stay strings)."""
    return " ".join(shlex.quote(f"-S{key}={json.dumps(value)}") for key, value in overrides.items())


def apply_to_file(overrides: dict[str, Any], params_path: str | Path) -> None:
    """Write the overrides into ``params_path``, keeping its comments and order."""
    round_trip = YAML()
    path = Path(params_path)
    tree = round_trip.load(path.read_text(encoding="utf-8"))
    apply_overrides(tree, overrides)
    with path.open("w", encoding="utf-8") as stream:
        round_trip.dump(tree, stream)

"""Parameter presets: flat ``dotted.key: value`` overrides of ``params.yaml``, shipped as ``<name>.yaml`` here.

A preset becomes DVC ``-S`` overrides, printed as words a shell's ``$(…)`` passes on intact
(``dvc exp run $(python -m reasonrl.presets cpu)``), or is written into ``params.yaml`` in place
(``python -m reasonrl.presets cpu --apply``) for a plain ``dvc repro``, changing only the preset's values.
Both are checked against ``params.yaml`` first, so a preset cannot name a parameter that does not exist.

``cpu`` sets a scale (the demo's model, data and budgets). The recipes ``dapo``, ``dr_grpo`` and ``gspo`` set the
``grpo`` section's loss and reward settings of a paper's algorithm, each the same keys and no budget, so that one
applies over a scale preset (``cpu --apply``, then ``dapo --apply``) and replaces another recipe whole.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from reasonrl.config import ConfigError, Params, from_dict, parse_yaml

# What a shell does to an unquoted $(…) result besides splitting it at whitespace: pathname expansion of words with
# these characters (no quote removal, no further expansion).
_GLOB_CHARACTERS = frozenset("*?[")


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


def override_value(value: Any) -> str:
    """``value`` in DVC's override grammar (Hydra's): JSON, which it reads back with its types (strings
    double-quoted, so ``cuda:1`` or ``1.0`` stay strings), but a mapping as ``{key:value,...}`` with bare keys,
    since the grammar refuses JSON's quoted ones (``grpo.overlong_penalty``)."""
    if not isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for key in value:
        if not (isinstance(key, str) and key.isidentifier()):
            raise ConfigError(f"a mapping's key {key!r} is not a bare word DVC's override grammar reads")
    return "{" + ",".join(f"{key}:{override_value(item)}" for key, item in value.items()) + "}"


def set_params_words(overrides: dict[str, Any]) -> list[str]:
    """``-Skey=value`` arguments for ``dvc exp run``, as words that need no quoting: an unquoted ``$(…)`` splits
    them at whitespace and removes no quotes, so quoting them would hand DVC the quotes. Values as
    :func:`override_value` writes them. A value the shell would split or glob is refused: ``--apply`` writes any
    value."""
    words = []
    for key, value in overrides.items():
        assignment = f"{key}={override_value(value)}"
        unsafe = sorted({c for c in assignment if c.isspace() or c in _GLOB_CHARACTERS})
        if unsafe:
            raise ConfigError(
                f"{key}: its value {value!r} holds {unsafe}, which a shell's $(…) would split or glob; "
                "write the preset into params.yaml with --apply instead"
            )
        words.append(f"-S{assignment}")
    return words


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def _value_node(document: yaml.Node, dotted: str) -> yaml.Node | None:
    """The node that holds ``dotted``'s value in the text, or None where a merge key (``<<``) supplies it."""
    node: yaml.Node | None = document
    for part in dotted.split("."):
        node = next((value for key, value in node.value if key.value == part), None)
        if node is None:
            return None
    return node


def _flow_yaml(value: Any) -> str:
    """``value`` as one line of YAML."""
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf"), allow_unicode=True)
    return text.removesuffix("\n...\n").removesuffix("\n")


def apply_to_file(overrides: dict[str, Any], params_path: str | Path) -> None:
    """Write the overrides into ``params_path`` by replacing the text of each overridden value only: every other
    byte (comments and their columns, ``null``, quoting, flow lists, line breaks) stays, so ``git diff`` shows the
    preset and nothing else."""
    path = Path(params_path)
    text = path.read_text(encoding="utf-8")
    original, expected = parse_yaml(text), parse_yaml(text)
    apply_overrides(expected, overrides)  # the key checks, with their errors, before any text is touched
    document = yaml.compose(text, Loader=yaml.SafeLoader)
    cannot = ConfigError(
        f"{path}: the preset cannot be written in place (a value it sets comes through a YAML anchor, alias or "
        "merge key); set its values by hand"
    )
    edits = []
    for dotted, value in overrides.items():
        current = _lookup(original, dotted)
        if type(current) is type(value) and current == value:
            continue  # left as written: `~` stays `~`, `2.0e-5` stays `2.0e-5`
        node = _value_node(document, dotted)
        if node is None:
            raise cannot
        start, end, new = node.start_mark.index, node.end_mark.index, _flow_yaml(value)
        rest = text[end:]
        gap = len(rest) - len(rest.lstrip(" "))
        if gap and rest[gap : gap + 1] == "#":
            # Keep a trailing comment in its column where the new value leaves room.
            width = end - start + gap
            new += " " * max(1, width - len(new))
            end += gap
        edits.append((start, end, new))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    try:
        written = parse_yaml(text)
    except yaml.YAMLError:
        written = None  # an alias whose anchor the edit replaced
    if written != expected:
        raise cannot
    path.write_text(text, encoding="utf-8")

"""The model card (``README.md``) a training stage saves beside its model: what it is, where it came from, how it
did on validation, and what to rerun it from.

It records the git commit, which changes with every commit; :func:`reasonrl.models.model_digest` leaves the card out,
so a GRPO checkpoint made from a model stays resumable when only its card differs.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reasonrl.config import Params, flat_dict
from reasonrl.markdown import code, md_inline
from reasonrl.routes import ROUTE, start_model

if TYPE_CHECKING:
    from reasonrl.training.best import BestCheckpoint


def route_sections(params: Params, route: str) -> list[str]:
    """The params sections that shaped a model of trained ``route``: its own, then those of the model it started
    from."""
    start = start_model(params, route)
    return [route] + ([] if start == "base" else route_sections(params, start))


def _flatten(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    flat = {}
    for key, value in values.items():
        name = f"{prefix}.{key}"
        flat |= _flatten(value, name) if isinstance(value, dict) else {name: value}
    return flat


def changed_params(params: Params, sections: list[str]) -> list[tuple[str, Any, Any]]:
    """``(dotted name, value, default)`` of each param of ``sections`` that differs from the code's default; a
    mapping set where the default is null (``grpo.overlong_penalty``) by its keys, each with the default None."""
    defaults = Params()
    changed = []
    for section in sections:
        ran = _flatten(flat_dict(getattr(params, section)), section)
        default = _flatten(flat_dict(getattr(defaults, section)), section)
        changed += [(name, value, default.get(name)) for name, value in ran.items() if value != default.get(name)]
    return changed


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def git_commit(directory: Path = Path(".")) -> str:
    """``git rev-parse HEAD`` in ``directory`` (a stage runs in its repository: a queued DVC experiment's too, a
    temporary repository with a commit of its own), or ``unknown`` outside a repository or without git."""
    try:
        shown = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return shown.stdout.strip() if shown.returncode == 0 else "unknown"


def validation_line(best: BestCheckpoint, unit: str) -> str:
    """The best validation accuracy, its 95% interval where the evaluation gave one, and when it was reached."""
    if best.step is None:
        return "no validation evaluation"
    line = f"{best.accuracy:.4f}"
    if best.interval is not None:
        interval = best.interval
        line += f" (95% interval [{interval['low']:.4f}, {interval['high']:.4f}], {interval['method']})"
    return f"{line} at {unit} {best.step}"


def _row(*cells: str) -> str:
    """A table row of code spans, escaped as the report escapes its tables (a param value may hold any text)."""
    return "| " + " | ".join(md_inline(code(cell), in_table=True) for cell in cells) + " |"


def render_card(
    params: Params,
    route: str,
    checkpoint: str,
    best: BestCheckpoint,
    unit: str,
    data_files: list[Path],
    commit: str,
) -> str:
    """The card's Markdown. ``checkpoint`` says which of the run's policies this is (e.g. "the step with the best
    validation accuracy"); ``unit`` names what ``best.step`` counts (step, round)."""
    sections = route_sections(params, route)
    starts = " → ".join(["base", *reversed(sections)])
    lines = [
        f"# reasonrl {route} model",
        "",
        f"Trained by the reasonrl pipeline: {ROUTE[route].method}; this directory holds {checkpoint}.",
        "",
        f"- **Base model:** {code(params.model.name)}",
        f"- **Route:** {starts}",
        f"- **Best validation accuracy:** {validation_line(best, unit)}",
        "- **Test accuracy:** not known when the model was saved; the `final_eval` stage measures it later "
        "(`reports/final/metrics.json`).",
        f"- **Git commit:** `{commit}` (HEAD when the stage ran: the params below are those it ran with, uncommitted "
        "changes such as `dvc exp run -S` included)",
        "",
        "## Params that differ from the defaults",
        "",
    ]
    changed = changed_params(params, ["data", "model", "rollout", "eval", "rewards", *sections])
    if changed:
        lines += ["| param | value | default |", "|---|---|---|"]
        lines += [_row(name, repr(value), repr(default)) for name, value, default in changed]
    else:
        lines.append("None.")
    lines += ["", "## Data (sha256)", "", "| file | sha256 |", "|---|---|"]
    lines += [_row(path.as_posix(), file_sha256(path)) for path in data_files]
    return "\n".join(lines) + "\n"

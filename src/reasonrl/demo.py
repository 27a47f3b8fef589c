"""What ``make demo`` runs before and after DVC (the Makefile's demo target):

    python -m reasonrl.demo params --preset cpu   # params.yaml: the committed params with the preset written in
    dvc repro                                     # every stage
    dvc exp save --name demo --force              # recorded as the DVC experiment `demo`, the baseline of compare
    python -m reasonrl.demo headline              # the headline table

``params`` refuses a params.yaml that differs from the committed one beyond the preset's params: an experiment run
in the workspace (``dvc exp run -S key=value``) leaves its values there, and the demo would record them as its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reasonrl.cli import run_stage
from reasonrl.config import parse_yaml
from reasonrl.errors import UserError
from reasonrl.presets import apply_to_file, checked_overrides, load_preset
from reasonrl.report.inputs import flatten, load_json, load_summaries
from reasonrl.report.tables import format_accuracy, interval_name
from reasonrl.routes import ROUTE, ROUTES

DEMO = "demo"
"""The DVC experiment ``make demo`` records: what ``python -m reasonrl.compare EXP`` compares EXP with."""

NEXT_STEPS = f"""\
report: reports/report.html (Markdown: reports/report.md); recorded as the DVC experiment `{DEMO}`
next, an ablation (reruns the GRPO stages) and its comparison with the demo:
  source .venv/bin/activate
  dvc exp run --name no-baseline -S grpo.loss_type=no_baseline
  python -m reasonrl.compare no-baseline"""


class DemoError(UserError):
    """params.yaml cannot become the demo's params; the message names the params and what to run."""


def committed_text(params_path: Path) -> str:
    """``params_path`` as the current git commit holds it."""
    shown = subprocess.run(
        ["git", "show", f"HEAD:./{params_path.as_posix()}"], capture_output=True, text=True, cwd=Path.cwd()
    )
    if shown.returncode != 0:
        raise DemoError(
            f"{params_path}: not in a git commit ({shown.stderr.strip()}); the demo is a DVC experiment, which needs "
            "the git repository (a clone) with params.yaml committed"
        )
    return shown.stdout


def _encoded(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def leftover_params(workspace: Mapping[str, Any], committed: Mapping[str, Any], preset: Sequence[str]) -> list[str]:
    """The dotted params, outside ``preset``, whose value (or presence) differs between the two params trees."""
    ours, theirs = flatten(workspace), flatten(committed)
    changed = {key for key in ours.keys() | theirs.keys() if _encoded(ours.get(key)) != _encoded(theirs.get(key))}
    return sorted(key for key in changed if key not in preset)


def prepare_params(params_path: Path, preset: str | None) -> None:
    """Check that ``params_path`` holds the committed params (the preset's aside), then write the preset in."""
    preset_keys = list(load_preset(preset)) if preset else []
    workspace = parse_yaml(params_path.read_text(encoding="utf-8"))
    leftovers = leftover_params(workspace, parse_yaml(committed_text(params_path)), preset_keys)
    if leftovers:
        values = flatten(workspace)
        shown = ", ".join(f"{key}: {_encoded(values.get(key))}" for key in leftovers)
        demo = f"the committed params with the {preset} preset" if preset else "the committed params as they are"
        raise DemoError(
            f"{params_path} sets {shown}, unlike {demo}, which the demo runs: an experiment run here (`dvc exp run "
            f"-S`) leaves its values in {params_path}. `git checkout {params_path}` restores the committed params, "
            f"then `make demo` again (`dvc exp apply {DEMO}` brings back the recorded demo instead)"
        )
    if preset:
        apply_to_file(checked_overrides(preset, params_path), params_path)


def format_p(p_value: float) -> str:
    """A p-value in two significant digits, small ones in scientific notation (``3.5e-07``), never rounded to 0."""
    return f"{p_value:.2g}"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart: a table for the terminal."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [headers, *rows]]
    return "\n".join(line.rstrip() for line in lines)


HEADLINE_HEADERS = ["route", "test accuracy [95% CI]", "paired test against", "p", "training wall clock"]


def headline_rows(final: Mapping[str, Mapping[str, Any]], seconds: Mapping[str, float | None]) -> list[list[str]]:
    """Per route: accuracy with its interval, the route it is paired against (the model its training started from)
    with the p-value, and its training stage's wall clock."""
    rows = []
    for route in ROUTES:
        summary, paired = final[route], final[route].get("paired")
        against = ["—", "—"] if paired is None else [paired["reference"], format_p(paired["p_value"])]
        rows.append([route, format_accuracy(summary), *against, format_duration(seconds.get(route))])
    return rows


def stage_seconds(reports_dir: Path) -> dict[str, float | None]:
    """Each trained route's training wall clock (``wall_clock_seconds`` of its stage's metrics.json), if written."""
    seconds: dict[str, float | None] = {}
    for route, spec in ROUTE.items():
        path = reports_dir / spec.reports_dir / "metrics.json" if spec.reports_dir else None
        metrics = load_json(path) if path and path.is_file() else {}
        seconds[route] = metrics.get("wall_clock_seconds") if isinstance(metrics, dict) else None
    return seconds


def headline_table(reports_dir: Path) -> str:
    """The table ``make demo`` ends with, from the workspace's reports, with a line on what it shows."""
    final = load_summaries(reports_dir / "final" / "metrics.json", required=ROUTES)
    first = final[ROUTES[0]]
    caption = (
        f"Test accuracy on {first['n']} answers to {first.get('questions', first['n'])} test questions, with its "
        f"{interval_name(final)}; p: the paired exact test against the model the route's training started from."
    )
    return f"{caption}\n\n{text_table(HEADLINE_HEADERS, headline_rows(final, stage_seconds(reports_dir)))}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.demo",
        description="The steps of `make demo` around DVC: check params.yaml and write the preset in (before `dvc "
        "repro`); print the headline table (after `dvc exp save --name demo`).",
    )
    steps = parser.add_subparsers(dest="step", required=True)
    params = steps.add_parser("params", help="check params.yaml, then write the preset into it")
    params.add_argument("--params", type=Path, default=Path("params.yaml"), help="default: %(default)s")
    params.add_argument("--preset", help="the preset to write in (make demo: cpu); none: the committed params")
    headline = steps.add_parser("headline", help="print the headline table of the workspace's reports")
    headline.add_argument("--reports", type=Path, default=Path("reports"), help="default: %(default)s")
    headline.add_argument("--since", type=float, help="when make demo started (seconds since the epoch)")
    args = parser.parse_args(argv)
    if args.step == "params":
        prepare_params(args.params, args.preset)
        return
    print(headline_table(args.reports))
    if args.since is not None:
        print(f"\nmake demo: {format_duration(time.time() - args.since)} wall clock (DVC reruns only what changed)")
    print(f"\n{NEXT_STEPS}")


if __name__ == "__main__":
    run_stage(main)

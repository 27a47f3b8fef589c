"""The headline metrics (``reports/headline.json``): the few numbers ``dvc metrics show`` and ``dvc exp show`` list,
read from what the other stages wrote.

It is the one metrics file dvc.yaml declares (the comment above the report stage says why). ``dvc exp show`` orders
its columns in the file's key order, so the keys are written in reading order, not sorted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reasonrl.atomic import atomic_write_text
from reasonrl.report.inputs import ReportInputError, load_json, load_summaries, test_set_summaries
from reasonrl.routes import ROUTE, ROUTES, TRAINED_ROUTES


def headline_metrics(reports_dir: Path) -> dict[str, Any]:
    """Each route's test accuracy (``final/metrics.json``) and, with ``eval.test_sets``, its accuracy on each of them;
    GRPO's best validation accuracy and the wall-clock seconds of each trained route's stage (its
    ``<reports_dir>/metrics.json``, :mod:`reasonrl.routes`: the run that completed the stage). A missing
    training-stage input gives null."""
    reports = Path(reports_dir)
    final_path = reports / "final" / "metrics.json"
    final = load_summaries(final_path, required=ROUTES)
    trained = {route: stage_metrics(reports / ROUTE[route].reports_dir / "metrics.json") for route in TRAINED_ROUTES}
    sets = test_set_summaries({route: final[route] for route in ROUTES}, final_path)
    headline: dict[str, Any] = {"test_accuracy": {route: final[route]["accuracy"] for route in ROUTES}}
    if sets:
        headline["test_set_accuracy"] = {
            name: {r: s["accuracy"] for r, s in by_route.items()} for name, by_route in sets.items()
        }
    headline["grpo_best_val_accuracy"] = trained["grpo"].get("best_val_accuracy")
    headline["wall_clock_seconds"] = {route: trained[route].get("wall_clock_seconds") for route in TRAINED_ROUTES}
    return headline


def stage_metrics(path: Path) -> dict[str, Any]:
    """A training stage's ``metrics.json`` (best validation accuracy, wall clock, …); empty when absent."""
    metrics = load_json(path) if path.is_file() else {}
    if not isinstance(metrics, dict):
        raise ReportInputError(f"{path}: expected a mapping of the stage's metrics")
    return metrics


def write_headline(reports_dir: Path, path: Path) -> dict[str, Any]:
    """Write :func:`headline_metrics` to ``path`` with its keys in reading order; return them."""
    headline = headline_metrics(reports_dir)
    atomic_write_text(path, json.dumps(headline, indent=2) + "\n")
    return headline

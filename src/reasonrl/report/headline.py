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
from reasonrl.protocols import BENCHMARK_SETS, PROTOCOLS, TEST, TEST_SETS, slot_summaries
from reasonrl.report.inputs import ReportInputError, load_json, load_summaries
from reasonrl.routes import ROUTE, ROUTES, TRAINED_ROUTES

ACCURACY_KEYS = {TEST: "test_accuracy", TEST_SETS: "test_set_accuracy", BENCHMARK_SETS: "benchmark_accuracy"}
"""The headline's key of each kind of held-out set's accuracies."""


def headline_metrics(reports_dir: Path) -> dict[str, Any]:
    """Each route's test accuracy (``final/metrics.json``) and, with ``eval.test_sets`` and ``eval.benchmarks``, its
    accuracy on each of them (``test_set_accuracy``, ``benchmark_accuracy``); the same for each of
    ``eval.protocols`` under ``protocols.<name>``; GRPO's best validation accuracy and the wall-clock seconds of each
    trained route's stage (its ``<reports_dir>/metrics.json``, :mod:`reasonrl.routes`: the run that completed the
    stage); and what each trained route's stage cost (:func:`route_costs`). A missing training-stage input gives
    null. Accuracies and costs only: their intervals and paired tests are the report's and ``reasonrl.compare``'s
    tables (``dvc exp show`` lists a column per number)."""
    reports = Path(reports_dir)
    final_path = reports / "final" / "metrics.json"
    final = load_summaries(final_path, required=ROUTES)
    trained = {route: stage_metrics(reports / ROUTE[route].reports_dir / "metrics.json") for route in TRAINED_ROUTES}
    try:
        slots = slot_summaries({route: final[route] for route in ROUTES})
    except ValueError as error:
        raise ReportInputError(f"{final_path}: {error}") from None
    headline: dict[str, Any] = {}
    for slot, by_route in slots.items():
        owner = headline if slot.protocol is None else headline.setdefault(PROTOCOLS, {}).setdefault(slot.protocol, {})
        accuracies = {route: summary["accuracy"] for route, summary in by_route.items()}
        if slot.kind == TEST:
            owner[ACCURACY_KEYS[TEST]] = accuracies
        else:
            owner.setdefault(ACCURACY_KEYS[slot.kind], {})[slot.name] = accuracies
    headline["grpo_best_val_accuracy"] = trained["grpo"].get("best_val_accuracy")
    headline["wall_clock_seconds"] = {route: trained[route].get("wall_clock_seconds") for route in TRAINED_ROUTES}
    headline["cost"] = route_costs(reports, final)
    return headline


def route_costs(reports: Path, final: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each trained route's training stage's cost (its ``cost.json``, :mod:`reasonrl.cost`): device-hours, tokens
    generated and trained, price (null where ``cost.device_hour_price`` was not set), and the test accuracy it gained
    over the model it started from (final_eval's paired reference) per device-hour. A missing ``cost.json`` gives
    nulls."""
    costs = {route: stage_metrics(reports / ROUTE[route].reports_dir / "cost.json") for route in TRAINED_ROUTES}
    hours = {route: cost.get("device_hours") for route, cost in costs.items()}
    gains: dict[str, float | None] = {}
    for route in TRAINED_ROUTES:
        reference = (final[route].get("paired") or {}).get("reference")
        gained = None if reference is None else final[route]["accuracy"] - final[reference]["accuracy"]
        gains[route] = None if gained is None or not hours[route] else gained / hours[route]
    return {
        "device_hours": hours,
        "tokens": {route: stage_tokens(cost) for route, cost in costs.items()},
        "price": {route: cost.get("price") for route, cost in costs.items()},
        "accuracy_gain_per_device_hour": gains,
    }


def stage_tokens(cost: dict[str, Any]) -> int | None:
    """The tokens a stage generated and trained on, all told; None without its ``cost.json``."""
    if not cost:
        return None
    return cost["tokens_generated"]["total"] + cost["tokens_trained"]["total"]


def stage_metrics(path: Path) -> dict[str, Any]:
    """A training stage's ``metrics.json`` (best validation accuracy, wall clock, …) or ``cost.json``; empty when
    absent."""
    metrics = load_json(path) if path.is_file() else {}
    if not isinstance(metrics, dict):
        raise ReportInputError(f"{path}: expected a mapping of the stage's metrics")
    return metrics


def write_headline(reports_dir: Path, path: Path) -> dict[str, Any]:
    """Write :func:`headline_metrics` to ``path`` with its keys in reading order; return them."""
    headline = headline_metrics(reports_dir)
    atomic_write_text(path, json.dumps(headline, indent=2) + "\n")
    return headline

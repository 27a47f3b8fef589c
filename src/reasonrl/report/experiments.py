"""The ablation table: the commit's DVC experiments (``dvc exp show --json``), each with the params it changed,
GRPO's test accuracy and best validation accuracy, plus the current run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.report.document import Table
from reasonrl.report.inputs import flatten
from reasonrl.report.tables import percent


class ExperimentsUnavailable(RuntimeError):
    """``dvc exp show`` could not list the experiments; the message says why."""


@dataclass(frozen=True)
class Experiment:
    name: str
    rev: str
    state: str
    """``baseline`` (the commit the experiments derive from), ``done``, ``running``, ``queued`` or ``failed``."""
    params: dict[str, Any]
    """Flattened (dotted) params of the params file."""
    baseline_params: dict[str, Any]
    test_accuracy: float | None
    best_val_accuracy: float | None


def run_exp_show(repo_root: Path, timeout: float = 300) -> list[dict[str, Any]]:
    """``dvc exp show --json`` in ``repo_root`` (the experiments of its HEAD commit), parsed.

    It works from inside a stage that ``dvc repro`` or ``dvc exp run`` is running: ``exp show`` only reads. DVC is
    run as ``python -m dvc`` with this interpreter, the same environment as the stage.
    """
    command = [sys.executable, "-m", "dvc", "exp", "show", "--json"]
    try:
        done = subprocess.run(command, cwd=repo_root, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ExperimentsUnavailable(f"`dvc exp show --json` in {repo_root} failed: {error}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        cause = lines[-1] if lines else f"exit status {done.returncode}"
        raise ExperimentsUnavailable(f"`dvc exp show --json` in {repo_root} failed: {cause}")
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError as error:
        raise ExperimentsUnavailable(f"`dvc exp show --json` printed no JSON: {error}") from None
    if not isinstance(data, list):
        raise ExperimentsUnavailable("`dvc exp show --json`: expected a list of commits")
    return data


def _metric(data: Mapping[str, Any] | None, path: str, *keys: str) -> float | None:
    """A number from ``data.metrics[path].data[keys...]`` of a ``dvc exp show`` revision, else None."""
    value: Any = (((data or {}).get("metrics") or {}).get(path) or {}).get("data")
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _params(data: Mapping[str, Any] | None, params_file: str) -> dict[str, Any]:
    return flatten(((((data or {}).get("params") or {}).get(params_file)) or {}).get("data") or {})


def _state(experiment: Mapping[str, Any], revision: Mapping[str, Any]) -> str:
    if revision.get("error"):
        return "failed"
    executor = experiment.get("executor")
    if not executor:
        return "done"
    return {"success": "done"}.get(executor.get("state"), executor.get("state") or "unknown")


def parse_exp_show(
    data: list[dict[str, Any]], params_file: str, final_metrics: str, grpo_metrics: str
) -> list[Experiment]:
    """The baseline commit(s) and their experiments from ``dvc exp show --json`` output.

    The top-level ``workspace`` entry is skipped (the current run is read from its files instead). Each commit
    entry lists its experiments under ``experiments[].revs``; an experiment running in the workspace has rev
    ``workspace``, one running in a temporary copy has executor state ``running``. ``final_metrics`` and
    ``grpo_metrics`` are the metric files' paths relative to the repository root, as ``dvc exp show`` keys them.
    """

    def entry(revision_data: Mapping[str, Any], name: str, rev: str, state: str, baseline_params: dict) -> Experiment:
        return Experiment(
            name=name,
            rev=rev,
            state=state,
            params=_params(revision_data, params_file),
            baseline_params=baseline_params,
            test_accuracy=_metric(revision_data, final_metrics, "grpo", "accuracy"),
            best_val_accuracy=_metric(revision_data, grpo_metrics, "best_val_accuracy"),
        )

    found = []
    for commit in data:
        if commit.get("rev") == "workspace":
            continue
        base_data = commit.get("data") or {}
        baseline_params = _params(base_data, params_file)
        rev = str(commit.get("rev", ""))
        found.append(entry(base_data, commit.get("name") or rev[:7], rev, "baseline", baseline_params))
        for experiment in commit.get("experiments") or []:
            for revision in experiment.get("revs") or []:
                rev = str(revision.get("rev", ""))
                name = revision.get("name") or experiment.get("name") or rev[:7]
                state = _state(experiment, revision)
                found.append(entry(revision.get("data") or {}, name, rev, state, baseline_params))
    return found


@dataclass(frozen=True)
class CurrentRun:
    """The run this report is generated for, read from the params file and the metric files on disk."""

    name: str | None
    """``DVC_EXP_NAME`` when DVC runs the stage as part of an experiment, else None."""
    params: dict[str, Any]
    test_accuracy: float | None
    best_val_accuracy: float | None


@dataclass(frozen=True)
class AblationRow:
    name: str
    state: str
    changes: dict[str, tuple[Any, Any]]
    """Dotted param → (baseline value, this run's value), for the params that differ."""
    test_accuracy: float | None
    best_val_accuracy: float | None
    current: bool


_UNSET = "<unset>"


def param_changes(baseline: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    keys = sorted(set(baseline) | set(params))
    return {
        k: (baseline.get(k, _UNSET), params.get(k, _UNSET))
        for k in keys
        if baseline.get(k, _UNSET) != params.get(k, _UNSET)
    }


def _is_current(experiment: Experiment, current: CurrentRun) -> bool:
    if current.name is not None:  # an experiment run: DVC named it
        return experiment.name == current.name and experiment.state != "baseline"
    if experiment.rev == "workspace":  # running in the workspace, i.e. this very run
        return True
    # `dvc repro` of an applied experiment (or of the baseline): same params and same results.
    return (
        experiment.state in ("baseline", "done")
        and experiment.params == current.params
        and experiment.test_accuracy == current.test_accuracy
        and experiment.best_val_accuracy == current.best_val_accuracy
    )


def ablation_rows(experiments: list[Experiment], current: CurrentRun) -> list[AblationRow]:
    """One row per experiment (params changed against its baseline commit, GRPO test and best val accuracy), plus
    the current run: merged into the experiment it is (first match), else appended as its own row."""
    rows, matched = [], False
    for experiment in experiments:
        is_current = not matched and _is_current(experiment, current)
        matched |= is_current
        source = current if is_current else experiment
        rows.append(
            AblationRow(
                name=experiment.name,
                state=experiment.state,
                changes=param_changes(experiment.baseline_params, source.params),
                test_accuracy=source.test_accuracy,
                best_val_accuracy=source.best_val_accuracy,
                current=is_current,
            )
        )
    if not matched:
        baseline = next((e.baseline_params for e in experiments), current.params)
        rows.append(
            AblationRow(
                name=current.name or "workspace",
                state="workspace",
                changes=param_changes(baseline, current.params),
                test_accuracy=current.test_accuracy,
                best_val_accuracy=current.best_val_accuracy,
                current=True,
            )
        )
    return rows


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def ablation_table(rows: list[AblationRow]) -> Table:
    body = []
    for row in rows:
        changes = ", ".join(f"`{k}={_value(new)}`" for k, (_, new) in row.changes.items()) or "—"
        name = f"{row.name} (this run)" if row.current else row.name
        body.append([name, row.state, changes, percent(row.test_accuracy), percent(row.best_val_accuracy)])
    return Table(
        ["experiment", "state", "params changed vs baseline commit", "GRPO test acc.", "GRPO best val acc."], body
    )

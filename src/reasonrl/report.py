"""The ``report`` stage's logic: read what the other stages wrote, draw the figures, render Markdown and HTML.

Inputs, under the reports directory: ``final/metrics.json`` (required: the four routes on the test set),
``baseline/metrics.json`` (zero-shot, one summary per prompt), the DVCLive directories ``{sft,ei,grpo}/live``,
GRPO's example rollouts ``grpo/live/examples/step_*.json`` and ``grpo/metrics.json``; the ablation table comes
from ``dvc exp show --json``. A missing optional input turns its figure or section into a line saying what is
missing; a missing required one raises :class:`ReportInputError` naming the file.

The document is built once as a list of blocks (:func:`build_report`) and rendered twice: Markdown that links the
PNG files (:func:`render_markdown`) and a self-contained HTML page with the PNGs inline (:func:`render_html`).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonrl.config import parse_yaml
from reasonrl.data import DataFormatError

ROUTES = ("base", "sft", "ei", "grpo")
CATEGORIES = ("correct", "format_only", "neither")
EXAMPLES_PER_FILE = 2
Z_95 = 1.959963984540054  # two-sided 95% normal quantile


class ReportInputError(DataFormatError):
    """A required report input is missing or malformed; the message names the file."""


# ------------------------------------------------------------------------------------------------- document blocks
@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str
    """Plain text; `backticks` mark code in both renderings."""


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Figure:
    name: str
    """File name of the PNG in :attr:`Report.figures` (and in the figures directory)."""
    caption: str


@dataclass(frozen=True)
class Code:
    text: str


Block = Heading | Paragraph | Table | Figure | Code


@dataclass
class Report:
    blocks: list[Block] = field(default_factory=list)
    figures: dict[str, bytes] = field(default_factory=dict)
    """PNG bytes by file name."""
    warnings: list[str] = field(default_factory=list)
    """Problems the stage prints to stderr (e.g. why the experiments could not be listed)."""


# ---------------------------------------------------------------------------------------------------------- inputs
def load_json(path: Path) -> Any:
    """Read a JSON file; a missing or malformed file raises :class:`ReportInputError` naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportInputError(f"{path}: missing (run the stage that writes it first)") from None
    except json.JSONDecodeError as error:
        raise ReportInputError(f"{path}: not valid JSON: {error}") from None


def load_summaries(path: Path, required: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Read a ``{name: summary}`` file (see ``reasonrl.evaluation.summarize``), checking each summary's keys."""
    data = load_json(path)
    if not isinstance(data, dict):
        raise ReportInputError(f"{path}: expected a mapping of name → evaluation summary")
    missing = [name for name in required if name not in data]
    if missing:
        raise ReportInputError(f"{path}: no summary for {', '.join(missing)}")
    for name, summary in data.items():
        keys = {"n", "accuracy", "format_rate", "categories", "response_length"}
        if not isinstance(summary, dict) or not keys <= summary.keys():
            raise ReportInputError(f"{path}: {name}: expected an evaluation summary with keys {sorted(keys)}")
    return data


def read_metric(live_dir: Path, name: str) -> list[tuple[int, float]] | None:
    """The ``(step, value)`` rows DVCLive logged for metric ``name`` (e.g. ``eval/accuracy``); None if absent."""
    path = Path(live_dir) / "plots" / "metrics" / f"{name}.tsv"
    if not path.is_file():
        return None
    with path.open(encoding="utf-8", newline="") as stream:
        rows = list(csv.DictReader(stream, delimiter="\t"))
    column = name.rsplit("/", 1)[-1]
    try:
        return [(int(float(row["step"])), float(row[column])) for row in rows]
    except (KeyError, TypeError, ValueError) as error:
        raise ReportInputError(f"{path}: expected columns step and {column}: {error!r}") from None


@dataclass(frozen=True)
class GRPOEvaluation:
    grpo_step: int
    elapsed_seconds: float
    """Cumulative seconds of GRPO steps (rollout, scoring, training, sync) before this evaluation."""
    accuracy: float


def grpo_evaluations(live_dir: Path) -> list[GRPOEvaluation] | None:
    """GRPO's validation accuracy by GRPO step and elapsed time; None when a needed TSV is absent.

    ``run_grpo`` logs ``eval/accuracy``, ``time/elapsed_seconds`` and ``grpo_step`` at the same DVCLive step (the
    optimizer-step count) at each evaluation; ``grpo_step`` is also logged at the end of every GRPO step, with the
    same value when an evaluation follows at that DVCLive step. So the three join on the DVCLive step.
    """
    accuracy = read_metric(live_dir, "eval/accuracy")
    elapsed = read_metric(live_dir, "time/elapsed_seconds")
    grpo_step = read_metric(live_dir, "grpo_step")
    if accuracy is None or elapsed is None or grpo_step is None:
        return None
    elapsed_at, step_at = dict(elapsed), dict(grpo_step)
    return [
        GRPOEvaluation(int(step_at[step]), elapsed_at[step], value)
        for step, value in accuracy
        if step in elapsed_at and step in step_at
    ]


def pick_example_files(examples_dir: Path) -> list[Path]:
    """The first, middle and last ``step_*.json`` files (fewer when there are fewer)."""
    files = sorted(Path(examples_dir).glob("step_*.json"))
    if not files:
        return []
    return [files[i] for i in sorted({0, len(files) // 2, len(files) - 1})]


def read_params(path: Path) -> dict[str, Any]:
    """The raw params file as a mapping (the ablation table compares raw values, as ``dvc exp show`` does)."""
    try:
        data = parse_yaml(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportInputError(f"{path}: missing") from None
    return data if isinstance(data, dict) else {}


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"grpo": {"lr": 1}}`` → ``{"grpo.lr": 1}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, f"{name}.")
        else:
            flat[name] = value
    return flat


# --------------------------------------------------------------------------------------------- numbers and tables
def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; unlike p ± z·s.e. it stays informative at p = 0 or 1."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def accuracy_interval(summary: Mapping[str, Any]) -> tuple[float, float]:
    """95% Wilson interval of a summary's accuracy (``accuracy · n`` correct answers out of ``n``)."""
    return wilson_interval(round(summary["accuracy"] * summary["n"]), summary["n"])


def percent(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def number(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def format_accuracy(summary: Mapping[str, Any]) -> str:
    """``"30.0% [10.8, 60.3]"``: accuracy and its 95% Wilson interval, in percent."""
    low, high = accuracy_interval(summary)
    return f"{percent(summary['accuracy'])} [{100 * low:.1f}, {100 * high:.1f}]"


SUMMARY_COLUMNS = [
    "n",
    "accuracy [95% CI]",
    "format rate",
    "correct / format only / neither",
    "mean length: all / correct / incorrect",
]


def summary_table(summaries: Mapping[str, Mapping[str, Any]], label: str) -> Table:
    """One row per summary: n, accuracy with its Wilson interval, format rate, categories, mean lengths."""
    rows = []
    for name, s in summaries.items():
        categories = " / ".join(str(s["categories"][c]) for c in CATEGORIES)
        lengths = " / ".join(number(s["response_length"].get(k)) for k in ("all", "correct", "incorrect"))
        rows.append([name, str(s["n"]), format_accuracy(s), percent(s["format_rate"]), categories, lengths])
    return Table([label, *SUMMARY_COLUMNS], rows)


# --------------------------------------------------------------------------------------------------------- figures
def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def _figure(rows: int, columns: int, width: float, height: float):
    """A matplotlib figure and its grid of axes (no pyplot: no global state, no display backend)."""
    from matplotlib.figure import Figure as MplFigure

    figure = MplFigure(figsize=(width, height), layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False)


def plot_test_accuracy(final: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Bar chart of test accuracy per route with 95% Wilson intervals as error bars."""
    figure, [[axes]] = _figure(1, 1, 6.4, 4)
    names = list(final)
    accuracies = [final[n]["accuracy"] for n in names]
    intervals = [accuracy_interval(final[n]) for n in names]
    errors = [
        [max(0.0, a - low) for a, (low, _) in zip(accuracies, intervals, strict=True)],
        [max(0.0, high - a) for a, (_, high) in zip(accuracies, intervals, strict=True)],
    ]
    bars = axes.bar(names, accuracies, yerr=errors, capsize=6, color="#4c72b0")
    axes.bar_label(bars, labels=[percent(a) for a in accuracies], padding=3)
    axes.set_ylabel("test accuracy")
    axes.set_ylim(0, min(1.0, max(high for _, high in intervals) * 1.15 + 0.02))
    axes.set_title("Test accuracy per route (95% Wilson interval)")
    return _png(figure)


def plot_categories(final: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Stacked bars: the share of correct / format-only / neither answers per route."""
    figure, [[axes]] = _figure(1, 1, 6.4, 4)
    names = list(final)
    bottom = [0.0] * len(names)
    colours = {"correct": "#55a868", "format_only": "#dd8452", "neither": "#c44e52"}
    for category in CATEGORIES:
        shares = [final[n]["categories"][category] / final[n]["n"] for n in names]
        axes.bar(names, shares, bottom=bottom, label=category.replace("_", " "), color=colours[category])
        bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
    axes.set_ylabel("share of test answers")
    axes.set_ylim(0, 1)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    axes.set_title("Answer categories per route")
    return _png(figure)


@dataclass(frozen=True)
class Series:
    """One curve, drawn in a panel of its own."""

    title: str
    xlabel: str
    ylabel: str
    points: list[tuple[float, float]]
    integer_x: bool = True
    """Steps and rounds: integer ticks only."""


def plot_grid(rows: list[list[Series]], suptitle: str) -> bytes:
    """A grid of line plots, one row per list of series; shorter rows leave their last panels empty."""
    from matplotlib.ticker import MaxNLocator

    columns = max(len(row) for row in rows)
    figure, grid = _figure(len(rows), columns, 4.2 * columns, 3.4 * len(rows))
    for row, axes_row in zip(rows, grid, strict=True):
        for index, axes in enumerate(axes_row):
            if index >= len(row):
                axes.set_visible(False)
                continue
            series = row[index]
            xs, ys = zip(*series.points, strict=True)
            axes.plot(xs, ys, linewidth=1, marker="o" if len(xs) <= 30 else None, markersize=3)
            axes.set_title(series.title)
            axes.set_xlabel(series.xlabel)
            axes.set_ylabel(series.ylabel)
            axes.grid(alpha=0.3)
            if series.integer_x:
                axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.suptitle(suptitle)
    return _png(figure)


# ----------------------------------------------------------------------------------------------------- experiments
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


# ---------------------------------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class ReportInputs:
    reports_dir: Path
    params_path: Path
    repo_root: Path | None = None
    """Where ``dvc exp show`` runs; None: no ablation table (e.g. not a DVC repository)."""
    experiment_name: str | None = None
    """The DVC experiment this run is (``DVC_EXP_NAME``), if any."""


def _relative(path: Path, root: Path | None) -> str:
    """``path`` as ``dvc exp show`` keys it: relative to the repository root, POSIX separators."""
    path = Path(path)
    if root is not None and path.is_absolute():
        try:
            return path.relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def _run_section(report: Report, flat: Mapping[str, Any]) -> None:
    """What was run (``flat``: the dotted params): a tiny model on synthetic problems reads very differently from
    the 1.5B model on GSM8K."""
    data = flat.get("data.name", "gsm8k")
    task = "synthetic arithmetic word problems in GSM8K's format" if data == "arithmetic" else "GSM8K"
    report.blocks.append(
        Paragraph(
            f"Model `{flat.get('model.name')}` on {task} (`data.name: {data}`). Every route is evaluated on the same "
            f"test split with the r1_zero prompt and the same sampling: temperature {flat.get('eval.temperature')}, "
            f"top-p {flat.get('eval.top_p')}, at most {flat.get('eval.max_tokens')} new tokens, stop at "
            f"{flat.get('eval.stop')}."
        )
    )


# Each route against the one it starts from in the demo and the handout's comparisons.
ROUTE_COMPARISONS = (("sft", "base"), ("ei", "sft"), ("grpo", "sft"))


def accuracy_changes(final: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``"GRPO vs SFT +10.4 points"`` for each pair of :data:`ROUTE_COMPARISONS`."""
    changes = []
    for route, reference in ROUTE_COMPARISONS:
        points = 100 * (final[route]["accuracy"] - final[reference]["accuracy"])
        changes.append(f"{route.upper()} vs {reference.upper()} {points:+.1f} points")
    return changes


def _test_accuracy_section(report: Report, final: dict[str, dict[str, Any]], final_path: Path) -> None:
    report.blocks.append(Heading(2, "Test accuracy per route"))
    report.figures["test_accuracy.png"] = plot_test_accuracy(final)
    report.blocks.append(
        Figure(
            "test_accuracy.png",
            "Test accuracy per route. Error bars: 95% Wilson score interval over the n graded answers "
            "(samples of one question are treated as independent).",
        )
    )
    report.blocks.append(summary_table(final, "route"))
    report.blocks.append(Paragraph("Change in test accuracy: " + "; ".join(accuracy_changes(final)) + "."))
    prompts = ", ".join(f"{route} `{summary.get('prompt', 'r1_zero')}`" for route, summary in final.items())
    report.blocks.append(
        Paragraph(f"Prompt per route, each graded with its own reward function (the one it trained with): {prompts}.")
    )
    report.blocks.append(
        Paragraph(
            f"From `{final_path.as_posix()}`. Accuracy with its 95% Wilson score interval in brackets; "
            "categories: correct, right format but wrong answer, wrong format; lengths in tokens."
        )
    )


def _validation_section(report: Report, live: Mapping[str, Path]) -> None:
    report.blocks.append(Heading(2, "Validation accuracy during training"))
    series, missing = [], []
    for route, xlabel in (("sft", "optimizer step"), ("ei", "round")):
        points = read_metric(live[route], "eval/accuracy")
        if points:
            series.append(Series(route.upper(), xlabel, "validation accuracy", points))
        else:
            missing.append(f"`{(live[route] / 'plots/metrics/eval/accuracy.tsv').as_posix()}`")
    evaluations = grpo_evaluations(live["grpo"])
    if evaluations:
        points = [(e.grpo_step, e.accuracy) for e in evaluations]
        series.append(Series("GRPO", "GRPO step", "validation accuracy", points))
    else:
        missing.append(f"GRPO's eval/accuracy, time/elapsed_seconds or grpo_step under `{live['grpo'].as_posix()}`")
    if series:
        report.figures["validation_curves.png"] = plot_grid([series], "Validation accuracy")
        report.blocks.append(
            Figure("validation_curves.png", "Validation accuracy: SFT by optimizer step, EI by round, GRPO by step.")
        )
    if missing:
        report.blocks.append(Paragraph("Missing: " + "; ".join(missing) + "."))

    report.blocks.append(Heading(2, "GRPO validation accuracy against wall-clock time"))
    if evaluations:
        points = [(e.elapsed_seconds, e.accuracy) for e in evaluations]
        report.figures["grpo_wallclock.png"] = plot_grid(
            [[Series("GRPO", "seconds", "validation accuracy", points, integer_x=False)]],
            "GRPO validation accuracy vs time",
        )
        report.blocks.append(
            Figure(
                "grpo_wallclock.png",
                "GRPO validation accuracy against the cumulative seconds of GRPO steps (rollouts, scoring, "
                "training, weight sync; time spent evaluating is not counted).",
            )
        )
    else:
        report.blocks.append(
            Paragraph(f"Not available: missing GRPO evaluation curves in `{live['grpo'].as_posix()}`.")
        )


DYNAMICS = (
    # (row, route, metric, panel title, x label)
    ("entropy", "sft", "train/entropy", "SFT token entropy", "optimizer step"),
    ("entropy", "ei", "train/entropy", "EI token entropy", "round"),
    ("entropy", "grpo", "train/entropy", "GRPO token entropy", "optimizer step"),
    ("length", "sft", "eval/response_length_all", "SFT validation response length", "optimizer step"),
    ("length", "ei", "rollout/response_length", "EI rollout response length", "round"),
    ("length", "grpo", "rollout/response_length", "GRPO rollout response length", "optimizer step"),
)


def _dynamics_section(report: Report, live: Mapping[str, Path]) -> None:
    report.blocks.append(Heading(2, "Entropy and response length during training"))
    rows: dict[str, list[Series]] = {"entropy": [], "length": []}
    missing = []
    for row, route, metric, title, xlabel in DYNAMICS:
        points = read_metric(live[route], metric)
        if points:
            ylabel = "entropy (nats/token)" if row == "entropy" else "tokens"
            rows[row].append(Series(title, xlabel, ylabel, points))
        else:
            missing.append(f"{route} `{metric}`")
    grid = [series for series in rows.values() if series]
    if grid:
        report.figures["training_dynamics.png"] = plot_grid(grid, "Response entropy and length")
        report.blocks.append(
            Figure(
                "training_dynamics.png",
                "Top: mean token entropy of the responses trained on. Bottom: mean response length in tokens "
                "(SFT: validation answers; EI and GRPO: training rollouts).",
            )
        )
    if missing:
        report.blocks.append(Paragraph("Not logged: " + ", ".join(missing) + "."))


def _categories_section(report: Report, final: dict[str, dict[str, Any]]) -> None:
    report.blocks.append(Heading(2, "Answer categories per route"))
    report.figures["categories.png"] = plot_categories(final)
    report.blocks.append(
        Figure(
            "categories.png",
            "Share of test answers that are correct, have the right format but a wrong answer (format only), "
            "or have the wrong format (neither).",
        )
    )


def _baseline_section(report: Report, path: Path) -> None:
    report.blocks.append(Heading(2, "Zero-shot prompts (baseline)"))
    if not path.is_file():
        report.blocks.append(Paragraph(f"Not available: `{path.as_posix()}` is missing."))
        return
    report.blocks.append(summary_table(load_summaries(path), "prompt"))
    report.blocks.append(Paragraph(f"The base model on the test set with each prompt, from `{path.as_posix()}`."))


def _examples_section(report: Report, examples_dir: Path) -> None:
    report.blocks.append(Heading(2, "GRPO example rollouts"))
    files = pick_example_files(examples_dir)
    if not files:
        report.blocks.append(Paragraph(f"Not available: no `step_*.json` in `{examples_dir.as_posix()}`."))
        return
    report.blocks.append(
        Paragraph(f"Validation answers at the first, middle and last GRPO evaluation ({EXAMPLES_PER_FILE} each).")
    )
    for path in files:
        examples = load_json(path)
        if not isinstance(examples, list):
            raise ReportInputError(f"{path}: expected a list of examples")
        step = int(path.stem.removeprefix("step_"))
        report.blocks.append(Heading(3, f"GRPO step {step}"))
        for index, example in enumerate(examples[:EXAMPLES_PER_FILE], start=1):
            report.blocks.append(Paragraph(f"Example {index} (step {step}), reward {example.get('reward')}:"))
            report.blocks.append(Code(str(example.get("response", ""))))


def _ablation_section(
    report: Report, inputs: ReportInputs, final: dict[str, dict[str, Any]], params: dict[str, Any]
) -> None:
    report.blocks.append(Heading(2, "Ablations (DVC experiments)"))
    reports = Path(inputs.reports_dir)
    grpo_metrics_path = reports / "grpo" / "metrics.json"
    grpo_metrics = load_json(grpo_metrics_path) if grpo_metrics_path.is_file() else {}
    current = CurrentRun(
        name=inputs.experiment_name,
        params=params,
        test_accuracy=final["grpo"]["accuracy"],
        best_val_accuracy=grpo_metrics.get("best_val_accuracy") if isinstance(grpo_metrics, dict) else None,
    )
    if inputs.repo_root is None:
        report.blocks.append(Paragraph("No experiments: no repository to ask."))
        return
    try:
        data = run_exp_show(inputs.repo_root)
    except ExperimentsUnavailable as error:
        report.warnings.append(f"no experiments in the report: {error}")
        report.blocks.append(Paragraph(f"No experiments: {error}"))
        return
    root = Path(inputs.repo_root)
    experiments = parse_exp_show(
        data,
        params_file=_relative(inputs.params_path, root),
        final_metrics=_relative(reports / "final" / "metrics.json", root),
        grpo_metrics=_relative(grpo_metrics_path, root),
    )
    if not any(e.state != "baseline" for e in experiments):
        report.blocks.append(Paragraph("No experiments derived from the current commit yet."))
    report.blocks.append(ablation_table(ablation_rows(experiments, current)))
    report.blocks.append(
        Paragraph(
            "From `dvc exp show --json` (experiments of the current commit); params compared with the baseline "
            "commit's. GRPO test accuracy from `final/metrics.json`, best validation accuracy from "
            "`grpo/metrics.json`; the current run's values are read from its files."
        )
    )


def build_report(inputs: ReportInputs) -> Report:
    """Read every input, draw the figures and assemble the document."""
    reports = Path(inputs.reports_dir)
    final_path = reports / "final" / "metrics.json"
    final = load_summaries(final_path, required=ROUTES)
    final = {route: final[route] for route in ROUTES}
    live = {route: reports / route / "live" for route in ("sft", "ei", "grpo")}

    report = Report()
    report.blocks.append(Heading(1, "reasonrl report: zero-shot, SFT, expert iteration and GRPO"))
    params = flatten(read_params(inputs.params_path))
    _run_section(report, params)
    _test_accuracy_section(report, final, final_path)
    _validation_section(report, live)
    _dynamics_section(report, live)
    _categories_section(report, final)
    _baseline_section(report, reports / "baseline" / "metrics.json")
    _examples_section(report, live["grpo"] / "examples")
    _ablation_section(report, inputs, final, params)
    return report


# --------------------------------------------------------------------------------------------------------- render
def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fence(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render_markdown(blocks: list[Block], figures_prefix: str = "figures") -> str:
    """Markdown; figures link ``{figures_prefix}/{name}`` (relative to the Markdown file)."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Table):
            lines = ["| " + " | ".join(_md_cell(h) for h in block.headers) + " |"]
            lines.append("|" + "---|" * len(block.headers))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            parts.append("\n".join(lines))
        elif isinstance(block, Figure):
            parts.append(f"![{block.caption}]({figures_prefix}/{block.name})\n\n*{block.caption}*")
        elif isinstance(block, Code):
            fence = _fence(block.text)
            parts.append(f"{fence}text\n{block.text}\n{fence}")
    return "\n\n".join(parts) + "\n"


def _html_text(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: left; }
th { background: #f3f3f3; }
figure { margin: 1rem 0; } img { max-width: 100%; }
figcaption { font-style: italic; color: #555; }
pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; white-space: pre-wrap; }
"""


def render_html(blocks: list[Block], figures: Mapping[str, bytes], title: str = "reasonrl report") -> str:
    """A self-contained HTML page: styles inline, each figure a ``data:image/png;base64`` URI."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_html_text(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_html_text(block.text)}</p>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{_html_text(h)}</th>" for h in block.headers)
            body = "".join("<tr>" + "".join(f"<td>{_html_text(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(block, Figure):
            data = base64.b64encode(figures[block.name]).decode("ascii")
            caption = _html_text(block.caption)
            parts.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(block.caption)}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
        elif isinstance(block, Code):
            parts.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
        f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )

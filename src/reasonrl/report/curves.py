"""The report's sections on training: validation accuracy of the three trained routes, GRPO's rollouts (mean reward,
groups without reward variance), GRPO's validation accuracy against time, entropy and response length.

Each route counts its x in one unit, named the same in every figure (:data:`X_LABELS`): SFT its optimizer steps, EI
its rounds, GRPO its steps (each a rollout batch; its optimizer-step curves are averaged per step, :func:`grpo_curve`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from reasonrl.report.document import Figure, Heading, Paragraph, Report
from reasonrl.report.figures import ROUTE_COLOURS, SMOOTHING_NOTE, Series, curves_figure, png
from reasonrl.report.inputs import grpo_curve, grpo_evaluations, metric_path, read_metric
from reasonrl.report.tables import percent

X_LABELS = {"sft": "SFT optimizer step", "ei": "EI round", "grpo": "GRPO step"}


def route_curve(live: Mapping[str, Path], route: str, metric: str) -> list[tuple[int, float]] | None:
    """A metric's curve in the route's own x unit (:data:`X_LABELS`); None when not logged."""
    if route == "grpo":
        return grpo_curve(live[route], metric)
    return read_metric(live[route], metric)


def route_series(route: str, title: str, ylabel: str, points: list[tuple[int, float]] | None) -> Series | None:
    """The route's curve in its colour and x unit; None without points."""
    return Series(title, X_LABELS[route], ylabel, points, True, ROUTE_COLOURS[route]) if points else None


def validation_series(live: Mapping[str, Path]) -> tuple[list[Series | None], list[str]]:
    """Each trained route's validation accuracy (None where not logged), and what is missing (as the page names
    it)."""
    series: list[Series | None] = []
    missing = []
    for route in ("sft", "ei"):
        points = read_metric(live[route], "eval/accuracy")
        series.append(route_series(route, route.upper(), "validation accuracy", points))
        if not points:
            missing.append(f"`{metric_path(live[route], 'eval/accuracy').as_posix()}`")
    evaluations = grpo_evaluations(live["grpo"])
    points = [(e.grpo_step, e.accuracy) for e in evaluations or []]
    series.append(route_series("grpo", "GRPO", "validation accuracy", points))
    if not points:
        missing.append(f"GRPO's eval/accuracy, time/elapsed_seconds or grpo_step under `{live['grpo'].as_posix()}`")
    return series, missing


def validation_section(report: Report, live: Mapping[str, Path], mark: str | None) -> None:
    report.blocks.append(Heading(2, "Validation accuracy during training"))
    series, missing = validation_series(live)
    if any(series):
        report.figures["validation_curves.png"] = png(curves_figure([series], "Validation accuracy", mark))
        report.blocks.append(
            Figure(
                "validation_curves.png",
                "Validation accuracy of each trained route on one y-axis from zero: SFT by optimizer step, EI by "
                "round, GRPO by step (each starts from the model its route starts from).",
            )
        )
    if missing:
        report.blocks.append(Paragraph("Missing: " + "; ".join(missing) + "."))


ROLLOUT_CURVES = (
    ("rollout/reward", "Mean reward of the rollouts", "mean reward"),
    ("rollout/zero_variance_group_fraction", "Groups with zero reward variance", "share of groups"),
)


def grpo_rollouts_section(report: Report, live: Mapping[str, Path], mark: str | None) -> None:
    report.blocks.append(Heading(2, "GRPO rollouts: reward and learning signal"))
    curves = {metric: route_curve(live, "grpo", metric) for metric, _, _ in ROLLOUT_CURVES}
    if not all(curves.values()):
        absent = [f"`{metric}`" for metric, points in curves.items() if not points]
        report.blocks.append(Paragraph(f"Not logged under `{live['grpo'].as_posix()}`: {', '.join(absent)}."))
        return
    series = [route_series("grpo", title, ylabel, curves[metric]) for metric, title, ylabel in ROLLOUT_CURVES]
    figure = curves_figure([series], "GRPO rollouts", mark, share_y=False)
    report.figures["grpo_rollouts.png"] = png(figure)
    last_step, last_share = curves["rollout/zero_variance_group_fraction"][-1]
    report.blocks.append(
        Figure(
            "grpo_rollouts.png",
            "Left: mean reward of each step's rollouts. Right: the share of its groups (the answers to one question) "
            "whose answers all got the same reward: their advantages are zero, so they teach nothing. "
            f"At the last step ({last_step}) {percent(last_share)} of the groups had zero variance. {SMOOTHING_NOTE}",
        )
    )


def wallclock_section(report: Report, live: Mapping[str, Path], mark: str | None) -> None:
    report.blocks.append(Heading(2, "GRPO validation accuracy against wall-clock time"))
    evaluations = grpo_evaluations(live["grpo"])
    if not evaluations:
        report.blocks.append(
            Paragraph(f"Not available: missing GRPO evaluation curves in `{live['grpo'].as_posix()}`.")
        )
        return
    points = [(e.elapsed_seconds, e.accuracy) for e in evaluations]
    series = Series("GRPO", "seconds", "validation accuracy", points, integer_x=False, colour=ROUTE_COLOURS["grpo"])
    report.figures["grpo_wallclock.png"] = png(curves_figure([[series]], "GRPO validation accuracy vs time", mark))
    report.blocks.append(
        Figure(
            "grpo_wallclock.png",
            "GRPO validation accuracy against the cumulative seconds of GRPO steps (rollouts, scoring, "
            "training, weight sync; time spent evaluating is not counted).",
        )
    )


DYNAMICS = (
    # (row, route, metric)
    ("entropy", "sft", "train/entropy"),
    ("entropy", "ei", "train/entropy"),
    ("entropy", "grpo", "train/entropy"),
    ("length", "sft", "eval/response_length_all"),
    ("length", "ei", "rollout/response_length"),
    ("length", "grpo", "rollout/response_length"),
)
DYNAMICS_ROWS = {
    "entropy": ("token entropy", "entropy (nats/token)"),
    "length": ("response length", "tokens"),
}


def dynamics_section(report: Report, live: Mapping[str, Path], mark: str | None) -> None:
    report.blocks.append(Heading(2, "Entropy and response length during training"))
    rows: dict[str, list[Series | None]] = {"entropy": [], "length": []}
    missing = []
    for row, route, metric in DYNAMICS:
        title, ylabel = DYNAMICS_ROWS[row]
        points = route_curve(live, route, metric)
        rows[row].append(route_series(route, f"{route.upper()} {title}", ylabel, points))
        if not points:
            missing.append(f"{route} `{metric}`")
    if grid := [series for series in rows.values() if any(series)]:
        report.figures["training_dynamics.png"] = png(curves_figure(grid, "Response entropy and length", mark))
        report.blocks.append(
            Figure(
                "training_dynamics.png",
                "Top: mean token entropy of the responses trained on. Bottom: mean response length in tokens "
                "(SFT: validation answers; EI and GRPO: training rollouts). Each row on one y-axis from zero. "
                + SMOOTHING_NOTE,
            )
        )
    if missing:
        report.blocks.append(Paragraph("Not logged: " + ", ".join(missing) + "."))

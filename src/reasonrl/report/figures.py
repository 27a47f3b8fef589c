"""The report's figures as PNG bytes (matplotlib without pyplot: no global state, no display).

A curve's label is drawn as written (:func:`_literal`): it may be a name users chose, an experiment's, which DVC
allows to hold a ``$`` or start with ``_``."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reasonrl.report.tables import CATEGORIES, accuracy_interval, interval_name, percent

if TYPE_CHECKING:
    from matplotlib.lines import Line2D


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def _literal(text: str) -> str:
    """``text`` as matplotlib shows it literally: each ``$`` escaped, since an even number of them would be read as
    mathtext (and an unbalanced brace in it fail the drawing). Matplotlib drops the escape's backslash when it draws,
    and only that one (``a\\$b`` is drawn as written too)."""
    return text.replace("$", "\\$")


def _figure(rows: int, columns: int, width: float, height: float):
    """A matplotlib figure and its grid of axes (no pyplot: no global state, no display backend)."""
    from matplotlib.figure import Figure as MplFigure

    figure = MplFigure(figsize=(width, height), layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False)


def plot_test_accuracy(final: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Bar chart of test accuracy per route with their 95% intervals as error bars."""
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
    axes.set_title(f"Test accuracy per route ({interval_name(final)})")
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


def _draw_curves(
    axes, title: str, xlabel: str, ylabel: str, curves: Mapping[str | None, list[tuple[float, float]]], integer_x: bool
) -> list[Line2D]:
    """Line plots of ``curves`` on one panel, each labelled by its key (None: no legend entry); the labelled lines."""
    from matplotlib.ticker import MaxNLocator

    labelled = []
    for label, points in curves.items():
        xs, ys = zip(*points, strict=True)
        (line,) = axes.plot(xs, ys, linewidth=1, marker="o" if len(xs) <= 30 else None, markersize=3)
        if label is not None:
            line.set_label(_literal(label))
            labelled.append(line)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if integer_x:
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    return labelled


def plot_grid(rows: list[list[Series]], suptitle: str) -> bytes:
    """A grid of line plots, one row per list of series; shorter rows leave their last panels empty."""
    columns = max(len(row) for row in rows)
    figure, grid = _figure(len(rows), columns, 4.2 * columns, 3.4 * len(rows))
    for row, axes_row in zip(rows, grid, strict=True):
        for index, axes in enumerate(axes_row):
            if index >= len(row):
                axes.set_visible(False)
                continue
            series = row[index]
            _draw_curves(axes, series.title, series.xlabel, series.ylabel, {None: series.points}, series.integer_x)
    figure.suptitle(suptitle)
    return _png(figure)


@dataclass(frozen=True)
class Panel:
    """Several curves on shared axes, one per label (e.g. one per experiment)."""

    title: str
    xlabel: str
    ylabel: str
    curves: dict[str, list[tuple[float, float]]]


def plot_panels(panels: list[Panel], suptitle: str) -> bytes:
    """One row of panels, each with its curves overlaid and a legend; a panel without curves is left empty."""
    figure, [row] = _figure(1, len(panels), 4.6 * len(panels), 3.6)
    for panel, axes in zip(panels, row, strict=True):
        lines = _draw_curves(axes, panel.title, panel.xlabel, panel.ylabel, panel.curves, integer_x=True)
        xs = {x for points in panel.curves.values() for x, _ in points}
        if len(xs) == 1:  # one round: the integer locator would still tick fractions around it
            axes.set_xticks(sorted(xs))
        if lines:
            # Lines and labels given, not collected: collecting leaves out each label that starts with "_".
            axes.legend(lines, [line.get_label() for line in lines], fontsize="small")
    figure.suptitle(suptitle)
    return _png(figure)

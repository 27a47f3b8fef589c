"""The report's figures: matplotlib figures built without pyplot (no global state, no display), turned into PNG bytes
by :func:`png` at twice the usual resolution.

Colours are the Okabe-Ito palette, which readers with any common colour-vision deficiency can tell apart (no
red-against-green). Panels that compare routes share their y-axis and start it at zero, so a curve of two points is
never drawn on a zoomed axis of its own. A noisy curve (:data:`SMOOTH_MIN_POINTS` points or more) is drawn faint, with
its moving average over it. A figure of a run that only checks the plumbing (a randomly initialised model, synthetic
data) carries a small mark saying so, which stays with the PNG wherever it is copied.

A curve's label is drawn as written (:func:`_literal`): it may be a name users chose, an experiment's, which DVC
allows to hold a ``$`` or start with ``_``."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reasonrl.report.tables import CATEGORIES, accuracy_interval, interval_name, percent

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

DPI = 200
"""Twice matplotlib's 100: the HTML page shows each figure at half its pixel size (sharp on high-density screens)."""

OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
"""Okabe & Ito's colour-blind-safe palette: black, orange, sky blue, bluish green, yellow, blue, vermillion,
reddish purple."""
ROUTE_COLOURS = {"base": "#000000", "sft": "#0072B2", "ei": "#E69F00", "grpo": "#009E73"}
CATEGORY_COLOURS = {"correct": "#0072B2", "format_only": "#E69F00", "neither": "#CC79A7"}
# Experiments side by side (compare): the palette in order, black last (it reads as an axis).
SERIES_COLOURS = (*OKABE_ITO[1:], OKABE_ITO[0])

SMOOTH_MIN_POINTS = 20
"""A curve of this many points or more is drawn raw (faint) and as its centred moving average (solid)."""
SMOOTHING_NOTE = (
    f"Curves of {SMOOTH_MIN_POINTS} points or more: the raw values faint, their centred moving average over about a "
    "tenth of the run solid."
)


def png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _literal(text: str) -> str:
    """``text`` as matplotlib shows it literally: each ``$`` escaped, since an even number of them would be read as
    mathtext (and an unbalanced brace in it fail the drawing). Matplotlib drops the escape's backslash when it draws,
    and only that one (``a\\$b`` is drawn as written too)."""
    return text.replace("$", "\\$")


def _figure(rows: int, columns: int, width: float, height: float, sharey: bool | str = False):
    """A matplotlib figure and its grid of axes (no pyplot: no global state, no display backend)."""
    from matplotlib.figure import Figure as MplFigure

    figure = MplFigure(figsize=(width, height), layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False, sharey=sharey)


def _mark(figure: Figure, mark: str | None) -> None:
    """``mark`` small in the bottom right corner, in the space the layout keeps for it (it overlaps nothing)."""
    if mark:
        figure.supxlabel(mark, x=0.995, ha="right", fontsize=7, color="0.35", style="italic")


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Each value's centred mean over ``window`` values (odd), over fewer at the ends, where fewer exist."""
    half = window // 2
    return [
        sum(values[max(0, i - half) : i + half + 1]) / len(values[max(0, i - half) : i + half + 1])
        for i in range(len(values))
    ]


def smoothing_window(points: int) -> int:
    """About a tenth of the curve's points, odd, at least 3."""
    return max(3, points // 10) | 1


def accuracy_figure(final: Mapping[str, Mapping[str, Any]], mark: str | None = None) -> Figure:
    """Bar chart of test accuracy per route with their 95% intervals as error bars."""
    figure, [[axes]] = _figure(1, 1, 6.4, 4)
    names = list(final)
    accuracies = [final[n]["accuracy"] for n in names]
    intervals = [accuracy_interval(final[n]) for n in names]
    errors = [
        [max(0.0, a - low) for a, (low, _) in zip(accuracies, intervals, strict=True)],
        [max(0.0, high - a) for a, (_, high) in zip(accuracies, intervals, strict=True)],
    ]
    colours = [ROUTE_COLOURS.get(n, OKABE_ITO[5]) for n in names]
    bars = axes.bar(names, accuracies, yerr=errors, capsize=6, color=colours, ecolor="0.3")
    axes.bar_label(bars, labels=[percent(a) for a in accuracies], padding=3)
    axes.set_ylabel("test accuracy")
    axes.set_ylim(0, min(1.0, max(high for _, high in intervals) * 1.15 + 0.02))
    axes.set_title(f"Test accuracy per route ({interval_name(final)})", fontsize="medium")
    _mark(figure, mark)
    return figure


def categories_figure(final: Mapping[str, Mapping[str, Any]], mark: str | None = None) -> Figure:
    """Stacked bars: the share of correct / format-only / neither answers per route."""
    figure, [[axes]] = _figure(1, 1, 6.4, 4)
    names = list(final)
    bottom = [0.0] * len(names)
    for category in CATEGORIES:
        shares = [final[n]["categories"][category] / final[n]["n"] for n in names]
        axes.bar(
            names, shares, bottom=bottom, label=category.replace("_", " "), color=CATEGORY_COLOURS[category],
            edgecolor="white",
        )  # fmt: skip
        bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
    axes.set_ylabel("share of test answers")
    axes.set_ylim(0, 1)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    axes.set_title("Answer categories per route")
    _mark(figure, mark)
    return figure


@dataclass(frozen=True)
class Series:
    """One curve, drawn in a panel of its own."""

    title: str
    xlabel: str
    ylabel: str
    points: list[tuple[float, float]]
    integer_x: bool = True
    """Steps and rounds: integer ticks only."""
    colour: str = OKABE_ITO[5]


def _draw_points(axes: Axes, points: Sequence[tuple[float, float]], colour: str) -> Line2D:
    """The curve: few points as a line with markers; many as the raw line, faint, under its moving average."""
    xs, ys = zip(*points, strict=True)
    if len(xs) < SMOOTH_MIN_POINTS:
        (line,) = axes.plot(xs, ys, color=colour, linewidth=1.2, marker="o", markersize=3)
        return line
    axes.plot(xs, ys, color=colour, linewidth=0.8, alpha=0.3)
    (line,) = axes.plot(xs, moving_average(ys, smoothing_window(len(ys))), color=colour, linewidth=1.6)
    return line


def _label_axes(axes: Axes, title: str, xlabel: str, ylabel: str, xs: set[float], integer_x: bool) -> None:
    from matplotlib.ticker import MaxNLocator

    axes.set_title(title, fontsize="medium")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if integer_x and len(xs) <= 6:  # a few rounds: a tick at each (the locator would tick fractions between them)
        axes.set_xticks(sorted(xs))
    elif integer_x:
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def _y_limits(values: list[float]) -> tuple[float, float]:
    """From zero (or below, for negative values) to a tenth of the range above the highest value."""
    low, high = min(0.0, min(values)), max(0.0, max(values))
    margin = 0.1 * (high - low) or 1.0
    return (low - margin if low < 0 else 0.0), high + margin


def curves_figure(
    rows: list[list[Series | None]], suptitle: str, mark: str | None = None, share_y: bool = True
) -> Figure:
    """A grid of line plots, one row per list of series, each y-axis from zero to above the highest point; None (or
    a short row's end) leaves its panel empty, so that a column stays one route's. ``share_y``: the panels of a row
    compare routes on one quantity, so they share their y-axis (False: each panel is a quantity of its own)."""
    columns = max(len(row) for row in rows)
    figure, grid = _figure(len(rows), columns, 4.2 * columns, 3.4 * len(rows), sharey="row" if share_y else False)
    for row, axes_row in zip(rows, grid, strict=True):
        drawn = [series for series in row if series is not None]
        for index, axes in enumerate(axes_row):
            series = row[index] if index < len(row) else None
            if series is None:
                axes.set_visible(False)
                continue
            _draw_points(axes, series.points, series.colour)
            xs = {x for x, _ in series.points}
            _label_axes(axes, series.title, series.xlabel, series.ylabel, xs, series.integer_x)
            axes.yaxis.set_tick_params(labelleft=True)  # each panel keeps its numbers: it may be seen alone
            axes.set_ylim(*_y_limits([y for shown in (drawn if share_y else [series]) for _, y in shown.points]))
    figure.suptitle(suptitle)
    _mark(figure, mark)
    return figure


@dataclass(frozen=True)
class Panel:
    """Several curves on shared axes, one per label (e.g. one per experiment)."""

    title: str
    xlabel: str
    ylabel: str
    curves: dict[str, list[tuple[float, float]]]
    integer_x: bool = True
    """x counts steps or rounds (ticks at whole numbers); False for a measure such as device-hours."""


def plot_panels(panels: list[Panel], suptitle: str) -> bytes:
    """One row of panels, each with its curves overlaid and a legend; a panel without curves is left empty."""
    figure, [row] = _figure(1, len(panels), 4.6 * len(panels), 3.6)
    for panel, axes in zip(panels, row, strict=True):
        lines = []
        for index, (label, points) in enumerate(panel.curves.items()):
            line = _draw_points(axes, points, SERIES_COLOURS[index % len(SERIES_COLOURS)])
            line.set_label(_literal(label))
            lines.append(line)
        xs = {x for points in panel.curves.values() for x, _ in points}
        _label_axes(axes, panel.title, panel.xlabel, panel.ylabel, xs, integer_x=panel.integer_x)
        if lines:
            # Lines and labels given, not collected: collecting leaves out each label that starts with "_".
            axes.legend(lines, [line.get_label() for line in lines], fontsize="small")
    figure.suptitle(suptitle)
    return png(figure)


@dataclass(frozen=True)
class SeedSpread:
    """One setting's test accuracy on one route over its seeds: each seed's, and their mean with its interval."""

    setting: str
    accuracies: list[float]
    interval: tuple[float, float] | None


def seeds_figure(routes: Mapping[str, list[SeedSpread]]) -> bytes:
    """One panel per route: each setting's seeds as dots, their mean as a bar with its interval."""
    figure, [row] = _figure(1, len(routes), 3.2 * len(routes), 3.4, sharey=True)
    for (route, spreads), axes in zip(routes.items(), row, strict=True):
        for x, spread in enumerate(spreads):
            colour = SERIES_COLOURS[x % len(SERIES_COLOURS)]
            mean = sum(spread.accuracies) / len(spread.accuracies)
            if spread.interval is not None:
                low, high = spread.interval
                axes.errorbar([x], [mean], yerr=[[mean - low], [high - mean]], fmt="_", color=colour, capsize=8)
            axes.scatter([x] * len(spread.accuracies), spread.accuracies, color=colour, alpha=0.6, s=14)
        axes.set_xticks(range(len(spreads)), [_literal(s.setting) for s in spreads], rotation=20, fontsize="small")
        axes.set_xlim(-0.5, len(spreads) - 0.5)
        axes.set_title(route, fontsize="medium")
    row[0].set_ylabel("test accuracy")
    figure.suptitle("Test accuracy per seed (dots), mean and 95% interval over seeds and questions")
    return png(figure)

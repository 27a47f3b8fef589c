"""Numbers as the report prints them: accuracy intervals, percentages, the per-route summary table, the grader
cross-check."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from reasonrl.report.document import Table
from reasonrl.statistics import INTERVAL_CLUSTERED, INTERVAL_WILSON

CATEGORIES = ("correct", "format_only", "neither")

INTERVAL_NAMES = {
    INTERVAL_WILSON: "95% Wilson score interval",
    INTERVAL_CLUSTERED: "95% Wilson score interval clustered by question",
}
"""What a summary's ``accuracy_interval.method`` is called in the report."""


def accuracy_interval(summary: Mapping[str, Any]) -> tuple[float, float]:
    """The 95% interval of a summary's accuracy, as ``reasonrl.evaluation.summarize`` computed it."""
    interval = summary["accuracy_interval"]
    return (interval["low"], interval["high"])


def interval_name(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The name of the summaries' accuracy interval (both names, when they differ in samples per question)."""
    methods = sorted({s["accuracy_interval"]["method"] for s in summaries.values()})
    return " or ".join(INTERVAL_NAMES[method] for method in methods)


def percent(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def number(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def format_accuracy(summary: Mapping[str, Any]) -> str:
    """``"30.0% [10.8, 60.3]"``: accuracy and its 95% interval, in percent."""
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
    """One row per summary: n, accuracy with its 95% interval, format rate, categories, mean lengths."""
    rows = []
    for name, s in summaries.items():
        categories = " / ".join(str(s["categories"][c]) for c in CATEGORIES)
        lengths = " / ".join(number(s["response_length"].get(k)) for k in ("all", "correct", "incorrect"))
        rows.append([name, str(s["n"]), format_accuracy(s), percent(s["format_rate"]), categories, lengths])
    return Table([label, *SUMMARY_COLUMNS], rows)


def per_question_table(summaries: Mapping[str, Mapping[str, Any]]) -> Table | None:
    """With ``eval.samples_per_question`` > 1: per route the mean accuracy, pass@k for each k and the majority-vote
    accuracy; ``None`` when the summaries have one sample per question."""
    several = {name: s for name, s in summaries.items() if "pass_at_k" in s}
    if not several:
        return None
    ks = sorted({k for s in several.values() for k in s["pass_at_k"]}, key=int)
    rows = [
        [name, str(s["samples_per_question"]), percent(s["accuracy"])]
        + [percent(s["pass_at_k"].get(k)) for k in ks]
        + [percent(s["majority_accuracy"])]
        for name, s in several.items()
    ]
    return Table(["route", "samples per question", "mean accuracy", *(f"pass@{k}" for k in ks), "majority vote"], rows)


def grader_agreement_table(summaries: Mapping[str, Mapping[str, Any]]) -> Table | None:
    """Per route cross-checked by final_eval: how often math-verify agrees with our grader, and on how many answers
    it does not; ``None`` when no summary records a cross-check (metrics written before it existed)."""
    checked = {name: s for name, s in summaries.items() if "grader_agreement" in s}
    if not checked:
        return None
    rows = [[name, percent(s["grader_agreement"]), str(s["grader_disagreements"])] for name, s in checked.items()]
    return Table(["route", "math-verify agrees", "disagreements"], rows)


# An answer block can be a whole paragraph of reasoning; a table cell shows its start.
ANSWER_CELL_CHARS = 80


def _verdict(correct: bool) -> str:
    return "right" if correct else "wrong"


def answer_cell(answer: str | None) -> str:
    """The answer text as JSON (quotes show its whitespace, escapes its control characters), clipped."""
    text = json.dumps(answer, ensure_ascii=False)
    return text if len(text) <= ANSWER_CELL_CHARS else text[: ANSWER_CELL_CHARS - 1] + "…"


def disagreement_table(disagreements: Mapping[str, list[Mapping[str, Any]]], limit: int) -> Table:
    """The first ``limit`` disagreements of each route: question, ground truth, answer, both verdicts."""
    rows = [
        [
            route,
            str(d["question_index"]),
            str(d["ground_truth"]),
            answer_cell(d["answer"]),
            _verdict(d["ours_correct"]),
            _verdict(d["math_verify_correct"]),
        ]
        for route, found in disagreements.items()
        for d in found[:limit]
    ]
    return Table(["route", "question", "ground truth", "answer", "our grader", "math-verify"], rows)

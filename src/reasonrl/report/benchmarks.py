"""The report's section on the benchmarks and protocols (``eval.benchmarks``, ``eval.protocols``): a table per
protocol, route × held-out set, each accuracy with its 95% interval; the paired test of each trained route against
the model it started from, set by set; pass@k and maj@k where a protocol samples several answers; and what the
download stage found of each benchmark (its records, those left out, those the training data contaminates)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reasonrl.protocols import BENCHMARK_SETS, TEST, Slot, protocol_title
from reasonrl.report.document import Heading, Note, Paragraph, Report, Table
from reasonrl.report.inputs import ReportInputError, load_json
from reasonrl.report.tables import format_accuracy, interval_name, percent
from reasonrl.report.verdict import format_p_value
from reasonrl.routes import ROUTES


def by_protocol(slots: Mapping[Slot, Mapping[str, Any]]) -> dict[str | None, dict[str, Mapping[str, Any]]]:
    """``{protocol: {set name: {route: summary}}}`` from :func:`reasonrl.protocols.slot_summaries`."""
    grouped: dict[str | None, dict[str, Mapping[str, Any]]] = {}
    for slot, by_route in slots.items():
        grouped.setdefault(slot.protocol, {})[slot.set_name] = by_route
    return grouped


def accuracy_table(sets: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Table:
    """Route × set: accuracy (avg@k with several samples) and its 95% interval."""
    rows = [[route, *(format_accuracy(by_route[route]) for by_route in sets.values())] for route in ROUTES]
    return Table(["route", *(f"`{name}`" for name in sets)], rows)


def paired_cell(summary: Mapping[str, Any]) -> str:
    paired = summary.get("paired")
    return "—" if paired is None else f"p = {format_p_value(paired['p_value'])} (vs {paired['reference'].upper()})"


def paired_table(sets: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Table | None:
    """Trained route × set: the paired test's p-value against the model the route started from; None when no route
    is paired."""
    rows = [[route, *(paired_cell(by_route[route]) for by_route in sets.values())] for route in ROUTES
            if any("paired" in by_route[route] for by_route in sets.values())]  # fmt: skip
    return Table(["route", *(f"`{name}`" for name in sets)], rows) if rows else None


def sampled_cell(summary: Mapping[str, Any]) -> str:
    k = summary.get("samples_per_question")
    if k is None:
        return "—"
    return f"{percent(summary['pass_at_k'][str(k)])} / {percent(summary['majority_accuracy'])}"


def sampled_table(sets: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Table | None:
    """Route × set: pass@k and maj@k (k the samples per question); None with one sample per question."""
    if not any("pass_at_k" in summary for by_route in sets.values() for summary in by_route.values()):
        return None
    rows = [[route, *(sampled_cell(by_route[route]) for by_route in sets.values())] for route in ROUTES]
    return Table(["route", *(f"`{name}`" for name in sets)], rows)


CONTAMINATION_HEADERS = ["benchmark", "answers", "records", "left out: gold unreadable", "questions", "contaminated"]


def contamination_table(summary: Mapping[str, Any]) -> Table:
    rows = [
        [f"`{name}`", entry["answer_format"], str(entry["records"]), str(entry["ungradable"]), str(entry["questions"]),
         str(entry["contaminated"])]
        for name, entry in summary["benchmarks"].items()
    ]  # fmt: skip
    return Table(CONTAMINATION_HEADERS, rows)


def load_benchmark_summary(path: Path) -> dict[str, Any] | None:
    """The download stage's benchmark summary (``reasonrl.benchmarks.benchmark_summary``); None when absent."""
    if not path.is_file():
        return None
    summary = load_json(path)
    if not isinstance(summary, dict) or not isinstance(summary.get("benchmarks"), dict):
        raise ReportInputError(f"{path}: expected the download stage's summary with a mapping under 'benchmarks'")
    return summary


def benchmarks_section(
    report: Report,
    slots: Mapping[Slot, Mapping[str, Any]],
    params: Mapping[str, Any],
    final_path: Path,
    summary_path: Path,
) -> None:
    """The section, when the run has benchmarks or named protocols; nothing otherwise."""
    grouped = by_protocol(slots)
    if len(grouped) == 1 and all(slot.kind != BENCHMARK_SETS for slot in slots):
        return
    report.blocks.append(Heading(2, "Benchmarks and protocols"))
    report.blocks.append(
        Paragraph(
            "Every route on the test split, each of `eval.test_sets` and each of `eval.benchmarks`, under the "
            "sampling of `eval.*` and under each of `eval.protocols`; each route with the prompt it trained with, "
            "a benchmark's LaTeX answers graded by math-verify. "
            f"From `{final_path.as_posix()}`; the answers under `final/generations/` (`benchmarks/<name>/`, "
            "`protocols/<name>/`)."
        )
    )
    if (questions := params.get("eval.benchmark_questions")) is not None:
        report.blocks.append(
            Note(
                f"Each benchmark's first {questions} questions only (`eval.benchmark_questions`): a quick look, not "
                "the benchmark's numbers."
            )
        )
    for protocol, sets in grouped.items():
        any_summary = next(iter(sets[TEST].values()))
        report.blocks.append(Heading(3, protocol_title(protocol, any_summary, params)))
        report.blocks.append(accuracy_table(sets))
        summaries = {f"{name}/{route}": s for name, by_route in sets.items() for route, s in by_route.items()}
        several = "; with several samples per question the mean over them, avg@k" if sampled_table(sets) else ""
        report.blocks.append(Paragraph(f"Accuracy with its {interval_name(summaries)}{several}."))
        if (paired := paired_table(sets)) is not None:
            report.blocks.append(paired)
            report.blocks.append(
                Paragraph(
                    "Each trained route against the model it started from on the same questions, samples and seed: "
                    "McNemar's exact test with one sample per question, the exact sign-flip test by question with "
                    "several."
                )
            )
        if (sampled := sampled_table(sets)) is not None:
            report.blocks.append(sampled)
            report.blocks.append(
                Paragraph(
                    "pass@k / maj@k, k the samples per question: the unbiased chance that k samples hold a right "
                    "answer, and the accuracy of each question's most frequent well-formed answer."
                )
            )
    summary = load_benchmark_summary(summary_path)
    if summary is None:
        report.blocks.append(Paragraph(f"Contamination not shown: `{summary_path.as_posix()}` is missing."))
        return
    if summary["benchmarks"]:
        report.blocks.append(Heading(3, "The benchmarks' questions and contamination"))
        report.blocks.append(contamination_table(summary))
        kept = "left out" if summary["decontaminate"] else "kept (`eval.decontaminate: true` leaves them out)"
        report.blocks.append(
            Paragraph(
                f"From `{summary_path.as_posix()}`: each benchmark's records upstream, those left out because its "
                "grader cannot read their gold answer, the questions evaluated, and the contaminated ones: sharing "
                f"a {summary['ngram']}-word sequence with a training example (question or answer), or asked in the "
                f"training data; {kept}."
            )
        )

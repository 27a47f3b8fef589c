"""The report's sections on the test set: accuracy per route, the extra test sets, the answer categories, the grader
cross-check and the zero-shot baseline. Each appends its blocks (and figures) to the report."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reasonrl.report.document import Figure, Heading, Paragraph, Report
from reasonrl.report.figures import accuracy_figure, categories_figure, png
from reasonrl.report.inputs import load_crosscheck, load_summaries
from reasonrl.report.tables import (
    INTERVAL_NAMES,
    disagreement_table,
    grader_agreement_table,
    interval_name,
    per_question_table,
    summary_table,
)
from reasonrl.report.verdict import accuracy_changes, paired_sentences, paired_test_names
from reasonrl.statistics import INTERVAL_CLUSTERED, INTERVAL_WILSON

INTERVAL_EXPLANATIONS = {
    INTERVAL_WILSON: " over the n graded answers, one per question",
    INTERVAL_CLUSTERED: " (samples of one question are not independent: its effective sample size comes from the "
    "spread of the per-question accuracies, the questions taken as a sample of questions like them)",
}
"""How each ``accuracy_interval.method`` is computed, in words for the figure caption."""


def accuracy_section(report: Report, final: dict[str, dict[str, Any]], final_path: Path, mark: str | None) -> None:
    report.blocks.append(Heading(2, "Test accuracy per route"))
    report.figures["test_accuracy.png"] = png(accuracy_figure(final, mark))
    methods = sorted({s["accuracy_interval"]["method"] for s in final.values()})
    explained = "; ".join(INTERVAL_NAMES[method] + INTERVAL_EXPLANATIONS[method] for method in methods)
    report.blocks.append(Figure("test_accuracy.png", f"Test accuracy per route. Error bars: {explained}."))
    report.blocks.append(summary_table(final, "route"))
    report.blocks.append(Paragraph("Change in test accuracy: " + "; ".join(accuracy_changes(final)) + "."))
    if paired := paired_sentences(final):
        report.blocks.append(
            Paragraph(
                "Paired against the model each route started from (the same questions, samples and seed), "
                f"{paired_test_names(final)}: " + "; ".join(paired) + "."
            )
        )
    if (several := per_question_table(final)) is not None:
        report.blocks.append(several)
        report.blocks.append(
            Paragraph(
                "With several samples per question: pass@k is the unbiased estimate of the chance that k of them hold "
                "a right answer; the majority vote grades each question's most frequent well-formed answer."
            )
        )
    prompts = ", ".join(f"{route} `{summary.get('prompt', 'r1_zero')}`" for route, summary in final.items())
    report.blocks.append(
        Paragraph(f"Prompt per route, each graded with its own reward function (the one it trained with): {prompts}.")
    )
    report.blocks.append(
        Paragraph(
            f"From `{final_path.as_posix()}`. Accuracy with its {interval_name(final)} in brackets; "
            "categories: correct, right format but wrong answer, wrong format; lengths in tokens."
        )
    )


def extra_test_sets_section(report: Report, sets: Mapping[str, dict[str, dict[str, Any]]], final_path: Path) -> None:
    report.blocks.append(Heading(2, "Extra held-out test sets"))
    report.blocks.append(
        Paragraph(
            "Each of `eval.test_sets`, graded for every route with the same prompts, sampling and seed as the test "
            f"split; from `{final_path.as_posix()}` (each route's `test_sets`), the answers under "
            "`final/generations/test_sets/`."
        )
    )
    for name, summaries in sets.items():
        report.blocks.append(Heading(3, f"Test set `{name}`"))
        report.blocks.append(summary_table(summaries, "route"))
        report.blocks.append(Paragraph(f"Change in `{name}` accuracy: " + "; ".join(accuracy_changes(summaries)) + "."))
        if paired := paired_sentences(summaries):
            report.blocks.append(Paragraph(f"Paired, {paired_test_names(summaries)}: " + "; ".join(paired) + "."))


def categories_section(report: Report, final: dict[str, dict[str, Any]], mark: str | None) -> None:
    report.blocks.append(Heading(2, "Answer categories per route"))
    report.figures["categories.png"] = png(categories_figure(final, mark))
    report.blocks.append(
        Figure(
            "categories.png",
            "Share of test answers that are correct, have the right format but a wrong answer (format only), "
            "or have the wrong format (neither).",
        )
    )


# Disagreements listed per route; the rest are counted, and all are in the cross-check file.
DISAGREEMENTS_SHOWN = 10


def more_disagreements(disagreements: Mapping[str, list[Any]], limit: int) -> list[str]:
    """``"and 12 more for GRPO"`` for each route with more than ``limit`` disagreements."""
    return [
        f"and {len(found) - limit} more for {route.upper()}"
        for route, found in disagreements.items()
        if len(found) > limit
    ]


def grader_section(report: Report, final: dict[str, dict[str, Any]], crosscheck_path: Path) -> None:
    report.blocks.append(Heading(2, "Grader cross-check (math-verify)"))
    agreement = grader_agreement_table(final)
    if agreement is None:
        report.blocks.append(Paragraph("Not available: no route in `final/metrics.json` records `grader_agreement`."))
        return
    report.blocks.append(agreement)
    report.blocks.append(
        Paragraph(
            "Hugging Face's math-verify re-graded every test answer: the text our reward function reads (the "
            "`<answer>` block, or the last `\\boxed{}` or number), against the ground truth, on the answer alone "
            "(the format check is this project's rule). Our grader stays the reward and the accuracy above; each "
            "disagreement is an answer the two read differently."
        )
    )
    found = load_crosscheck(crosscheck_path)
    if found is None:
        report.blocks.append(Paragraph(f"Disagreements not listed: `{crosscheck_path.as_posix()}` is missing."))
        return
    disagreements = {route: found[route] for route in final if route in found}  # route order, not the file's
    if not any(disagreements.values()):
        report.blocks.append(Paragraph("The two graders agree on every answer."))
        return
    report.blocks.append(disagreement_table(disagreements, DISAGREEMENTS_SHOWN))
    more = more_disagreements(disagreements, DISAGREEMENTS_SHOWN)
    report.blocks.append(
        Paragraph(
            ", ".join([f"At most {DISAGREEMENTS_SHOWN} per route are listed", *more])
            + f"; all are in `{crosscheck_path.as_posix()}`. Question: its index in the test split; answer: the text "
            "both graders judged, as JSON."
        )
    )


def baseline_section(report: Report, path: Path) -> None:
    report.blocks.append(Heading(2, "Zero-shot prompts (baseline)"))
    if not path.is_file():
        report.blocks.append(Paragraph(f"Not available: `{path.as_posix()}` is missing."))
        return
    report.blocks.append(summary_table(load_summaries(path), "prompt"))
    report.blocks.append(Paragraph(f"The base model on the test set with each prompt, from `{path.as_posix()}`."))

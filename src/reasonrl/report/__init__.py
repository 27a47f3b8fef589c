"""The ``report`` stage's logic: read what the other stages wrote, draw the figures, render Markdown and HTML.

Inputs, under the reports directory: ``final/metrics.json`` (required: the four routes on the test set, and on
each of ``eval.test_sets`` under the route's ``test_sets``),
``final/grader_crosscheck.json`` (the answers math-verify grades differently from our grader),
``baseline/metrics.json`` (zero-shot, one summary per prompt), the DVCLive directories ``{sft,ei,grpo}/live``
and GRPO's example rollouts ``grpo/live/examples/step_*.json``. Only the run's own files, each a dependency of the
stage: the cached report is a function of them. (Comparing experiments is ``reasonrl.compare``'s, outside the
pipeline: which experiments exist changes with no dependency changing.) A missing optional input turns its figure
or section into a line saying what is missing; a missing required one raises :class:`ReportInputError` naming the
file. The same inputs give the headline metrics file (``headline``).

The document is built once as a list of blocks (:func:`build_report`, this module: one section after another) and
rendered twice (``document``). The parts: ``inputs`` (reading the stages' files), ``tables`` (numbers),
``figures`` (PNGs), ``document`` (blocks and rendering), ``headline`` (the metrics ``dvc exp show`` opens with).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.report.document import Code, Figure, Heading, Paragraph, Report
from reasonrl.report.figures import Series, plot_categories, plot_grid, plot_test_accuracy
from reasonrl.report.inputs import (
    EXAMPLES_PER_FILE,
    ReportInputError,
    flatten,
    grpo_evaluations,
    load_crosscheck,
    load_json,
    load_summaries,
    pick_example_files,
    read_metric,
    read_params,
    test_set_summaries,
)
from reasonrl.report.tables import (
    INTERVAL_NAMES,
    disagreement_table,
    grader_agreement_table,
    interval_name,
    per_question_table,
    summary_table,
)
from reasonrl.routes import ROUTE, ROUTES, TRAINED_ROUTES
from reasonrl.statistics import INTERVAL_CLUSTERED, INTERVAL_WILSON, TEST_MCNEMAR, TEST_SIGN_FLIP


@dataclass(frozen=True)
class ReportInputs:
    reports_dir: Path
    params_path: Path


def _run_section(report: Report, flat: Mapping[str, Any]) -> None:
    """What was run (``flat``: the dotted params): a tiny model on synthetic problems reads very differently from
    the 1.5B model on GSM8K."""
    data = flat.get("data.name", "gsm8k")
    task = {
        "arithmetic": "synthetic arithmetic word problems in GSM8K's format",
        "jsonl": f"the user's own data (`{flat.get('data.jsonl.train.path')}`, `{flat.get('data.jsonl.test.path')}`)",
    }.get(data, "GSM8K")
    report.blocks.append(
        Paragraph(
            f"Model `{flat.get('model.name')}` on {task} (`data.name: {data}`). Every route is evaluated on the same "
            f"test split with the prompt it trained with and the same sampling: temperature "
            f"{flat.get('eval.temperature')}, "
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


PAIRED_TESTS = {
    TEST_MCNEMAR: "McNemar's exact test",
    TEST_SIGN_FLIP: "the exact sign-flip test over questions (each question's difference in right answers keeps or "
    "flips its sign as a whole, since samples of one question are not independent)",
}
"""What a ``paired`` comparison's ``test`` is called in the report."""


def paired_sentences(final: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``"GRPO vs SFT: 41 answers right only for GRPO, 12 only for SFT, p = 4.1e-05"`` per route with a ``paired``
    comparison (see ``reasonrl.evaluation.add_paired_comparisons``); with several samples per question the questions
    on which each had more right answers come first, since the test counts those."""
    sentences = []
    for route, summary in final.items():
        if paired := summary.get("paired"):
            this, reference = route.upper(), paired["reference"].upper()
            counts = (
                f"{paired['only_this_right']} answers right only for {this}, "
                f"{paired['only_reference_right']} only for {reference}"
            )
            if paired["test"] == TEST_SIGN_FLIP:
                counts = (
                    f"more right answers for {this} on {paired['questions_this_better']} questions, for {reference} "
                    f"on {paired['questions_reference_better']} ({counts})"
                )
            sentences.append(f"{this} vs {reference}: {counts}, p = {paired['p_value']:.2g}")
    return sentences


def paired_test_names(final: Mapping[str, Mapping[str, Any]]) -> str:
    """The name of the routes' paired test (both, when they differ in samples per question)."""
    tests = sorted({s["paired"]["test"] for s in final.values() if "paired" in s})
    return " or ".join(PAIRED_TESTS[test] for test in tests)


INTERVAL_EXPLANATIONS = {
    INTERVAL_WILSON: " over the n graded answers, one per question",
    INTERVAL_CLUSTERED: " (samples of one question are not independent: its effective sample size comes from the "
    "spread of the per-question accuracies, the questions taken as a sample of questions like them)",
}
"""How each ``accuracy_interval.method`` is computed, in words for the figure caption."""


def _test_sets_section(report: Report, sets: Mapping[str, dict[str, dict[str, Any]]], final_path: Path) -> None:
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


def _test_accuracy_section(report: Report, final: dict[str, dict[str, Any]], final_path: Path) -> None:
    report.blocks.append(Heading(2, "Test accuracy per route"))
    report.figures["test_accuracy.png"] = plot_test_accuracy(final)
    methods = sorted({s["accuracy_interval"]["method"] for s in final.values()})
    report.blocks.append(
        Figure(
            "test_accuracy.png",
            "Test accuracy per route. Error bars: "
            + "; ".join(INTERVAL_NAMES[method] + INTERVAL_EXPLANATIONS[method] for method in methods)
            + ".",
        )
    )
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


# Disagreements listed per route; the rest are counted, and all are in the cross-check file.
DISAGREEMENTS_SHOWN = 10


def more_disagreements(disagreements: Mapping[str, list[Any]], limit: int) -> list[str]:
    """``"and 12 more for GRPO"`` for each route with more than ``limit`` disagreements."""
    return [
        f"and {len(found) - limit} more for {route.upper()}"
        for route, found in disagreements.items()
        if len(found) > limit
    ]


def _grader_section(report: Report, final: dict[str, dict[str, Any]], crosscheck_path: Path) -> None:
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


def build_report(inputs: ReportInputs) -> Report:
    """Read every input, draw the figures and assemble the document."""
    reports = Path(inputs.reports_dir)
    final_path = reports / "final" / "metrics.json"
    final = load_summaries(final_path, required=ROUTES)
    final = {route: final[route] for route in ROUTES}
    live = {route: reports / ROUTE[route].reports_dir / "live" for route in TRAINED_ROUTES}

    report = Report()
    report.blocks.append(Heading(1, "reasonrl report: zero-shot, SFT, expert iteration and GRPO"))
    params = flatten(read_params(inputs.params_path))
    _run_section(report, params)
    _test_accuracy_section(report, final, final_path)
    if sets := test_set_summaries(final, final_path):
        _test_sets_section(report, sets, final_path)
    _grader_section(report, final, reports / "final" / "grader_crosscheck.json")
    _validation_section(report, live)
    _dynamics_section(report, live)
    _categories_section(report, final)
    _baseline_section(report, reports / "baseline" / "metrics.json")
    _examples_section(report, live["grpo"] / "examples")
    return report

"""What the statistics say, in sentences: the routes' changes in accuracy, their paired tests, and the page's summary
verdict (the best route, whether the two best differ, whether each route beats the model it started from).

Significance is p < :data:`ALPHA`, each test on its own (the page makes four, uncorrected, and says so); p-values are
written in scientific notation (:func:`format_p_value`), so 3.5e-07 never reads as 0.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reasonrl.report.tables import format_accuracy
from reasonrl.statistics import TEST_MCNEMAR, TEST_SIGN_FLIP

ALPHA = 0.05

# Each route against the one it starts from in the demo and the handout's comparisons.
ROUTE_COMPARISONS = (("sft", "base"), ("ei", "sft"), ("grpo", "sft"))

PAIRED_TESTS = {
    TEST_MCNEMAR: "McNemar's exact test",
    TEST_SIGN_FLIP: "the exact sign-flip test over questions (each question's difference in right answers keeps or "
    "flips its sign as a whole, since samples of one question are not independent)",
}
"""What a ``paired`` comparison's ``test`` is called in the report."""
SHORT_TEST_NAMES = {TEST_MCNEMAR: "McNemar's exact test", TEST_SIGN_FLIP: "exact sign-flip test over questions"}


def format_p_value(p: float) -> str:
    """``3.5e-07``, ``5.0e-01``: two significant digits, always in scientific notation."""
    return f"{p:.1e}"


def accuracy_changes(final: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``"GRPO vs SFT +10.4 points"`` for each pair of :data:`ROUTE_COMPARISONS`."""
    changes = []
    for route, reference in ROUTE_COMPARISONS:
        points = 100 * (final[route]["accuracy"] - final[reference]["accuracy"])
        changes.append(f"{route.upper()} vs {reference.upper()} {points:+.1f} points")
    return changes


def paired_counts(this: str, reference: str, paired: Mapping[str, Any]) -> str:
    """``"41 answers right only for GRPO, 12 only for SFT"``; with several samples per question the questions on
    which each had more right answers come first, since the test counts those."""
    counts = (
        f"{paired['only_this_right']} answers right only for {this}, {paired['only_reference_right']} only for "
        f"{reference}"
    )
    if paired["test"] == TEST_SIGN_FLIP:
        counts = (
            f"more right answers for {this} on {paired['questions_this_better']} questions, for {reference} on "
            f"{paired['questions_reference_better']} ({counts})"
        )
    return counts


def paired_sentences(final: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``"GRPO vs SFT: 41 answers right only for GRPO, 12 only for SFT, p = 4.1e-05"`` per route with a ``paired``
    comparison (see ``reasonrl.evaluation.add_paired_comparisons``)."""
    sentences = []
    for route, summary in final.items():
        if paired := summary.get("paired"):
            this, reference = route.upper(), paired["reference"].upper()
            counts = paired_counts(this, reference, paired)
            sentences.append(f"{this} vs {reference}: {counts}, p = {format_p_value(paired['p_value'])}")
    return sentences


def paired_test_names(final: Mapping[str, Mapping[str, Any]]) -> str:
    """The name of the routes' paired test (both, when they differ in samples per question)."""
    tests = sorted({s["paired"]["test"] for s in final.values() if "paired" in s})
    return " or ".join(PAIRED_TESTS[test] for test in tests)


def two_best(final: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """The two routes of highest test accuracy, the better first (a tie keeps the routes' order)."""
    ranked = sorted(final, key=lambda route: -final[route]["accuracy"])
    return ranked[0], ranked[1]


def top_two_sentence(final: Mapping[str, Mapping[str, Any]], paired: Mapping[str, Any] | None, missing: str) -> str:
    """The verdict on the two best routes: the best one's lead (or the routes that tie for the highest accuracy) and
    whether the paired test finds it significant. ``paired``: the best against the second
    (``reasonrl.evaluation.paired_comparison``); None: ``missing`` says why there is none."""
    best, second = two_best(final)
    lead = 100 * (final[best]["accuracy"] - final[second]["accuracy"])
    if lead > 0:
        sentence = (
            f"{best.upper()} is the most accurate route on the test set, {format_accuracy(final[best])}, "
            f"{lead:.1f} points ahead of {second.upper()}, {format_accuracy(final[second])}"
        )
    else:
        tied = [route.upper() for route, summary in final.items() if summary["accuracy"] == final[best]["accuracy"]]
        sentence = f"{', '.join(tied)} tie for the highest test accuracy, {format_accuracy(final[best])}"
    if paired is None:
        return f"{sentence}; no paired test of {best.upper()} and {second.upper()}: {missing}."
    test = (
        f"{SHORT_TEST_NAMES[paired['test']]} on the same test questions: "
        f"{paired_counts(best.upper(), second.upper(), paired)}, p = {format_p_value(paired['p_value'])}"
    )
    if lead == 0:
        return f"{sentence} ({test})."
    verdict = "significant" if paired["p_value"] < ALPHA else "not significant: the test does not tell the two apart"
    return f"{sentence}. The lead is {verdict} ({test})."


def _start_verdict(points: float, p: float) -> str:
    if p >= ALPHA:
        return "no significant change"
    return "significantly better" if points > 0 else "significantly worse"


def start_sentence(final: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Each trained route against the model it started from (its ``paired`` comparison): the change in points,
    the p-value and the verdict; None when no route has one."""
    parts = []
    for route, summary in final.items():
        if paired := summary.get("paired"):
            points = 100 * (summary["accuracy"] - final[paired["reference"]]["accuracy"])
            parts.append(
                f"{route.upper()} vs {paired['reference'].upper()} {points:+.1f} points, p = "
                f"{format_p_value(paired['p_value'])}, {_start_verdict(points, paired['p_value'])}"
            )
    if not parts:
        return None
    return "Against the model each route started from: " + "; ".join(parts) + "."


def significance_sentence(tests: int) -> str:
    each = "the test" if tests == 1 else f"each of the {tests} tests on its own (no correction for making several)"
    return f"Significant: p < {ALPHA} in a two-sided paired test on the same test questions, {each}."

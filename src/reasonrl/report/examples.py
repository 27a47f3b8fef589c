"""The report's example answers, each beside its question and gold answer: every route on the first test questions
(``final/generations``), and GRPO's validation answers as training went on (``grpo/live/examples``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reasonrl.report.document import Example, Heading, Paragraph, Report
from reasonrl.report.inputs import EXAMPLES_PER_FILE, load_examples, pick_example_files

QUESTIONS_SHOWN = 2
"""Test questions whose answers the page shows for every route: the first ones of the test split, not chosen."""


def _reward(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def route_examples_section(report: Report, generations: Mapping[str, list[dict[str, Any]] | None], source: Path):
    """Each route's first answer to each of the first :data:`QUESTIONS_SHOWN` test questions."""
    report.blocks.append(Heading(2, "Answers per route"))
    answered = {route: records for route, records in generations.items() if records}
    if not answered:
        report.blocks.append(Paragraph(f"Not available: no `<route>.jsonl` in `{source.as_posix()}`."))
        return
    report.blocks.append(
        Paragraph(
            f"Each route's answer to the first {QUESTIONS_SHOWN} test questions (the first sample of each), from "
            f"`{source.as_posix()}`; reward 1 is a right answer in the right format."
        )
    )
    first = next(iter(answered.values()))
    indices = list(dict.fromkeys(record["question_index"] for record in first))[:QUESTIONS_SHOWN]
    for number, index in enumerate(indices, start=1):
        answers = []
        for route, records in answered.items():
            record = next((r for r in records if r["question_index"] == index), None)
            if record is not None:
                answers.append((f"{route.upper()}, reward {_reward(record['reward'])}", record["response"]))
        question = next(r for r in first if r["question_index"] == index)
        title = f"Test question {number} (index {index})"
        report.blocks.append(Example(title, question["question"], question["ground_truth"], answers))


def grpo_examples_section(report: Report, examples_dir: Path) -> None:
    """GRPO's first validation answers at its first, middle and last evaluation."""
    report.blocks.append(Heading(2, "GRPO example rollouts"))
    files = pick_example_files(examples_dir)
    if not files:
        report.blocks.append(Paragraph(f"Not available: no `step_*.json` in `{examples_dir.as_posix()}`."))
        return
    report.blocks.append(
        Paragraph(f"Validation answers at the first, middle and last GRPO evaluation ({EXAMPLES_PER_FILE} each).")
    )
    for path in files:
        step = int(path.stem.removeprefix("step_"))
        report.blocks.append(Heading(3, f"GRPO step {step}"))
        for index, example in enumerate(load_examples(path)[:EXAMPLES_PER_FILE], start=1):
            label = f"GRPO after {step} steps, reward {_reward(example['reward'])}"
            title = f"Example {index} (step {step})"
            report.blocks.append(
                Example(title, example["question"], example["ground_truth"], [(label, example["response"])])
            )

"""Writes this directory's example of a user's own data (docs/own-data.md), deterministically.

Fields named unlike GSM8K's (``problem``, ``solution``) and answers in the ``boxed`` format: the reasoning, then
``The answer is \\boxed{N}.``. train and test hold the CPU preset's arithmetic (1-2 steps on values up to 9);
``shifted`` is a held-out set off that distribution (3-4 steps on values up to 30), to see how far training carries.

    PYTHONPATH=src python examples/word_problems/make_examples.py && sha256sum examples/word_problems/*.jsonl
"""

import json
import random
from pathlib import Path

from reasonrl.grading import split_answer
from reasonrl.synthetic import arithmetic_problem

# name: (examples, seed, max_steps, max_value, min_steps)
SETS = {"train": (300, 10, 2, 9, 1), "test": (60, 11, 2, 9, 1), "shifted": (60, 12, 4, 30, 3)}


def boxed_record(problem: dict[str, str]) -> dict[str, str]:
    reasoning, answer = split_answer(problem["answer"])
    return {"problem": problem["question"], "solution": f"{reasoning}\nThe answer is \\boxed{{{answer}}}."}


def make_set(count: int, seed: int, max_steps: int, max_value: int, min_steps: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    records = []
    while len(records) < count:
        problem = arithmetic_problem(rng, max_steps, max_value)
        if len(split_answer(problem["answer"])[0].splitlines()) >= min_steps:
            records.append(boxed_record(problem))
    return records


def main() -> None:
    directory = Path(__file__).parent
    for name, spec in SETS.items():
        lines = [json.dumps(record) + "\n" for record in make_set(*spec)]
        (directory / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()

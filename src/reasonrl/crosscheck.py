"""A second opinion on the grader: Hugging Face's math-verify re-grades every final answer of an evaluation.

The project's own grader (:mod:`reasonrl.grading`) stays the reward and the reported accuracy. math-verify reads
numbers its own way (sympy, LaTeX and expression parsers), so where the two disagree one of them misreads an answer:
``2+3`` for 5 is right to math-verify (it evaluates) and wrong to ours (two numbers), ``eighteen (18)`` the reverse.

Both judge the same text: the answer our reward function reads (the ``<answer>`` block for r1_zero, the last
``\\boxed{}`` or last number for question_only), against the ground truth. They are compared on the answer check,
``answer_reward``: the format half of the reward is this project's rule, which math-verify has no notion of.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reasonrl.prompts import ANSWER_TEXT_FNS
from reasonrl.rewards import MATH_VERIFY
from reasonrl.symbolic import verdict

if TYPE_CHECKING:
    from reasonrl.evaluation import EvalResult


def crosscheck_grades(records: list[dict[str, Any]], prompt_name: str) -> dict[str, Any]:
    """Re-grade each evaluation record (see ``reasonrl.evaluation.evaluate``) with math-verify.

    Returns ``agreement`` (the fraction of records on which both graders give the same verdict) and
    ``disagreements``: for each record where they differ, its ``question_index``, ``ground_truth``, the ``answer``
    text both judged, ``ours_correct`` (its ``answer_reward``) and ``math_verify_correct``.
    """
    if prompt_name not in ANSWER_TEXT_FNS:
        raise ValueError(f"no answer extraction for prompt {prompt_name!r}; known: {', '.join(ANSWER_TEXT_FNS)}")
    if not records:
        raise ValueError("no evaluation records to cross-check")
    disagreements = []
    for record in records:
        answer = ANSWER_TEXT_FNS[prompt_name](record["response"])
        ours = record["answer_reward"] == 1.0
        theirs = verdict(answer, record["ground_truth"]).correct
        if ours != theirs:
            disagreements.append(
                {
                    "question_index": record["question_index"],
                    "ground_truth": record["ground_truth"],
                    "answer": answer,
                    "ours_correct": ours,
                    "math_verify_correct": theirs,
                }
            )
    return {"agreement": (len(records) - len(disagreements)) / len(records), "disagreements": disagreements}


def add_grader_crosschecks(
    results: Mapping[str, EvalResult], rewards: Mapping[str, str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Cross-check every result with the prompt it was graded with (its metrics' ``prompt``): add
    ``grader_agreement`` and ``grader_disagreements`` (a count) to its metrics, and return each result's
    disagreeing answers by name. ``rewards``: each prompt's reward spec the results were graded with (None: the
    built-ins); a result graded by math-verify itself (``rewards.<prompt>: math_verify``, reading the same answer
    text) is not graded again: its ``answer_reward`` is math-verify's verdict, so the two agree on every answer."""
    disagreements = {}
    for name, result in results.items():
        prompt = result.metrics["prompt"]
        if (rewards or {}).get(prompt) == MATH_VERIFY:
            crosscheck = {"agreement": 1.0, "disagreements": []}
        else:
            crosscheck = crosscheck_grades(result.records, prompt)
        result.metrics["grader_agreement"] = crosscheck["agreement"]
        result.metrics["grader_disagreements"] = len(crosscheck["disagreements"])
        disagreements[name] = crosscheck["disagreements"]
    return disagreements

"""math-verify as a second grader: hand-made answers where it agrees with ours and where it does not, the agreement
rate and the listed disagreements (its time bound: tests/test_symbolic.py)."""

import pytest

from reasonrl import symbolic
from reasonrl.config import EvalConfig
from reasonrl.cost import Tokens
from reasonrl.crosscheck import add_grader_crosschecks, crosscheck_grades
from reasonrl.data import GSM8KExample
from reasonrl.evaluation import EvalResult, evaluate
from reasonrl.grading import question_only_reward_fn, r1_zero_reward_fn
from reasonrl.prompts import ANSWER_TEXT_FNS, PROMPT_NAMES
from reasonrl.rewards import MATH_VERIFY
from reasonrl.rollouts.types import Sample


def r1_zero_records(cases: list[tuple[str, str]]) -> list[dict]:
    """Evaluation records as ``evaluate`` writes them, one per (answer block, ground truth)."""
    records = []
    for index, (answer, ground_truth) in enumerate(cases):
        response = f"thinking </think> <answer> {answer} </answer>"
        records.append(
            {"question_index": index, "response": response, "ground_truth": ground_truth}
            | r1_zero_reward_fn(response, ground_truth)
        )
    return records


R1_ZERO_CASES = [
    ("1,000", "1000"),  # both right: thousands separator
    ("1/2", "0.5"),  # both right: a fraction is the decimal
    ("\\frac{1}{2}", "0.5"),  # both right: LaTeX fraction
    ("17", "18"),  # both wrong
    ("2+3", "5"),  # math-verify evaluates the sum; ours reads two different numbers: wrong
    ("\\$18", "18"),  # both right: a LaTeX dollar, which math-verify reads whole as it reads a gold
    ("eighteen (18)", "18"),  # ours reads its one number; math-verify extracts nothing: wrong
]


def test_agreement_rate_and_disagreements_by_hand():
    crosscheck = crosscheck_grades(r1_zero_records(R1_ZERO_CASES), "r1_zero")
    assert crosscheck["agreement"] == pytest.approx(5 / 7)
    assert crosscheck["disagreements"] == [
        {"question_index": 4, "ground_truth": "5", "answer": "2+3", "ours_correct": False, "math_verify_correct": True},
        {"question_index": 6, "ground_truth": "18", "answer": "eighteen (18)", "ours_correct": True,
         "math_verify_correct": False},
    ]  # fmt: skip


def test_graders_are_compared_on_the_answer_not_the_format():
    # Text after </answer> breaks the format (reward 0) but not the answer (answer_reward 1): math-verify agrees.
    response = "thinking </think> <answer> 18 </answer> and more"
    record = {"question_index": 0, "response": response, "ground_truth": "18"} | r1_zero_reward_fn(response, "18")
    assert record["reward"] == 0.0 and record["answer_reward"] == 1.0
    assert crosscheck_grades([record], "r1_zero") == {"agreement": 1.0, "disagreements": []}


def test_no_answer_block_is_wrong_to_both():
    records = [{"question_index": 0, "response": "18", "ground_truth": "18"} | r1_zero_reward_fn("18", "18")]
    assert crosscheck_grades(records, "r1_zero")["agreement"] == 1.0


def test_question_only_answers_are_the_boxed_text():
    responses = ["so she earns \\boxed{2+3}.", "she earns 1,000 dollars"]
    records = [
        {"question_index": i, "response": r, "ground_truth": gt} | question_only_reward_fn(r, gt)
        for i, (r, gt) in enumerate(zip(responses, ["5", "1000"], strict=True))
    ]
    crosscheck = crosscheck_grades(records, "question_only")
    assert crosscheck["agreement"] == 0.5
    assert [(d["answer"], d["ours_correct"]) for d in crosscheck["disagreements"]] == [("2+3", False)]


def test_results_get_agreement_and_count_in_their_metrics():
    records = r1_zero_records(R1_ZERO_CASES)
    results = {
        "sft": EvalResult({"prompt": "r1_zero"}, records, Tokens()),
        "grpo": EvalResult({"prompt": "r1_zero"}, records[:4], Tokens()),
    }
    disagreements = add_grader_crosschecks(results)
    assert results["sft"].metrics == {"prompt": "r1_zero", "grader_agreement": 5 / 7, "grader_disagreements": 2}
    assert results["grpo"].metrics["grader_agreement"] == 1.0 and results["grpo"].metrics["grader_disagreements"] == 0
    assert [d["question_index"] for d in disagreements["sft"]] == [4, 6] and disagreements["grpo"] == []


def test_every_prompt_has_its_answer_text():
    assert set(ANSWER_TEXT_FNS) == set(PROMPT_NAMES)
    with pytest.raises(ValueError, match="no answer extraction for prompt 'tagged'"):
        crosscheck_grades(r1_zero_records(R1_ZERO_CASES), "tagged")


def test_answers_math_verify_graded_are_not_graded_again(monkeypatch):
    """``rewards.r1_zero: math_verify``: the evaluation's grade is math-verify's, so the cross-check takes it (full
    agreement) instead of running math-verify on every answer a second time. Counted by the grader's own timeouts:
    an answer that runs math-verify out of time does so once, in the evaluation."""
    monkeypatch.setattr(symbolic, "GRADING_SECONDS", 0.5)
    texts = [f"thinking </think> <answer> {answer} </answer>" for answer in ("2+1", "9^{9^{9^{9}}}", "4")]

    class Engine:  # answers every question with the texts above
        def tokenizer(self):
            return None

        def generate(self, prompts, n, **sampling):
            return [[Sample(text, [1], None, prompt_token_ids=[2], finish="stop_string") for text in texts]]

    rewards = {"r1_zero": MATH_VERIFY}
    before = symbolic.timeouts()
    config, question = EvalConfig(samples_per_question=3), GSM8KExample("q", "", "3")
    result = evaluate(Engine(), [question], "r1_zero", config, rewards=rewards)
    assert symbolic.timeouts() == before + 1 and [record["answer_reward"] for record in result.records] == [1, 0, 0]
    results = {"grpo": EvalResult({"prompt": "r1_zero"}, result.records, result.tokens)}
    assert add_grader_crosschecks(results, rewards) == {"grpo": []}
    assert symbolic.timeouts() == before + 1  # not graded again
    assert results["grpo"].metrics == {"prompt": "r1_zero", "grader_agreement": 1.0, "grader_disagreements": 0}
    assert crosscheck_grades(result.records, "r1_zero")["agreement"] == 1.0  # what grading again would have found

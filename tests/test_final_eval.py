"""final_eval's model list: NAME=DIRECTORY pairs of loadable models that share one tokenizer."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "stages"))
from final_eval import parse_models, training_prompts  # noqa: E402

from reasonrl.config import ConfigError, EvalConfig, GRPOConfig, Params, SFTConfig  # noqa: E402
from reasonrl.cost import Tokens  # noqa: E402
from reasonrl.data import GSM8KExample  # noqa: E402
from reasonrl.evaluation import (  # noqa: E402
    EvalResult,
    EvalTask,
    add_paired_comparisons,
    check_room,
    paired_comparison,
    pass_at_k,
    summarize,
)
from reasonrl.models import ModelSourceError  # noqa: E402
from reasonrl.prompts import load_prompt  # noqa: E402
from reasonrl.protocols import BENCHMARK_SETS, TEST, Slot  # noqa: E402
from reasonrl.routes import ROUTES  # noqa: E402
from reasonrl.statistics import sign_flip_p_value  # noqa: E402


def test_models_keep_their_order(tiny_model_dir):
    models = parse_models([f"sft={tiny_model_dir}", f"base={tiny_model_dir}"])
    assert list(models) == ["sft", "base"] and models["base"] == tiny_model_dir


@pytest.mark.parametrize("spec", ["base", "=models/base", "base=", "grpo=x=y"])
def test_malformed_or_missing_model_is_an_error_naming_it(spec):
    with pytest.raises((ConfigError, ModelSourceError), match="base|grpo|x=y"):
        parse_models([spec])


def test_a_name_given_twice_is_an_error(tiny_model_dir):
    with pytest.raises(ConfigError, match="expected a new NAME=DIRECTORY"):
        parse_models([f"base={tiny_model_dir}", f"base={tiny_model_dir}"])


def test_a_tokenizer_saved_again_is_the_same_vocabulary(tiny_model_dir, tmp_path):
    resaved = tmp_path / "resaved"
    shutil.copytree(tiny_model_dir, resaved)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(resaved)  # as the sft/ei/grpo stages save it
    assert list(parse_models([f"base={tiny_model_dir}", f"sft={resaved}"])) == ["base", "sft"]


def test_models_with_different_vocabularies_are_refused(tiny_model_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text().replace("<think>", "<thinking>"))
    with pytest.raises(ConfigError, match=f"grpo={other}: its vocabulary differs"):
        parse_models([f"base={tiny_model_dir}", f"grpo={other}"])


def test_each_model_gets_its_training_prompt(tiny_model_dir):
    models = dict.fromkeys(ROUTES, tiny_model_dir)
    params = Params(sft=SFTConfig(prompt="r1_zero_chat"), grpo=GRPOConfig(prompt="question_only"))
    assert training_prompts(models, params) == {
        "base": "r1_zero_chat", "sft": "r1_zero_chat", "ei": "r1_zero", "grpo": "question_only"
    }  # fmt: skip
    with pytest.raises(ConfigError, match="^--model other=...: NAME must be one of base, sft, ei, grpo"):
        training_prompts({"other": tiny_model_dir}, params)


def test_stage_reports_bad_model_before_loading_anything(tmp_path, params_file):
    result = subprocess.run(
        [sys.executable, str(REPO / "stages/final_eval.py"), "--params", str(params_file),
         "--data", str(tmp_path), "--test-sets", str(tmp_path), "--model", f"base={tmp_path / 'missing'}",
         "--metrics", str(tmp_path / "m.json"), "--cost", str(tmp_path / "cost.json"),
         "--generations", str(tmp_path / "g"), "--crosscheck", str(tmp_path / "c.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"error: {tmp_path / 'missing'}: not a Hugging Face model directory" in result.stderr
    assert not any((tmp_path / name).exists() for name in ("m.json", "g", "c.json"))


def test_a_question_too_long_for_max_model_len_is_refused_before_any_model_loads(tiny_tokenizer):
    """An OlympiadBench question can outgrow ``rollout.max_model_len``: final_eval checks every set's questions in
    every route's prompt before the engine starts, naming the set, the question and the length it needs."""
    short, long = GSM8KExample("What is 2 + 3?", "", "5"), GSM8KExample("What is 2 + 3? " * 60, "", "5")
    config, routes = EvalConfig(max_tokens=128), {"sft": "r1_zero", "grpo": "question_only"}
    tasks = {Slot(None, TEST): EvalTask([short], config),
             Slot(None, BENCHMARK_SETS, "olympiadbench"): EvalTask([short, long], config)}  # fmt: skip
    needed = {name: len(tiny_tokenizer.encode(load_prompt(name).render(long.question, tiny_tokenizer))) + 128
              for name in routes.values()}  # fmt: skip
    check_room(tasks, routes, tiny_tokenizer, max(needed.values()))
    too_short = needed["question_only"] - 1  # too short for both prompts: the first in order is named
    with pytest.raises(ConfigError) as refused:
        check_room(tasks, routes, tiny_tokenizer, too_short)
    assert str(refused.value) == (
        f"rollout.max_model_len: ({too_short}) is too short for question 2 of olympiadbench (benchmark) "
        f"({needed['question_only'] - 128} tokens in prompt question_only) and an answer of up to 128 tokens "
        f"(eval.max_tokens); raise rollout.max_model_len to at least {needed['question_only']}, lower "
        "eval.max_tokens or leave the set out"
    )


def test_pass_at_k_is_the_unbiased_estimator_by_hand():
    assert pass_at_k(samples=4, correct=0, k=2) == 0.0
    assert pass_at_k(samples=4, correct=1, k=1) == pytest.approx(0.25)
    assert pass_at_k(samples=4, correct=1, k=2) == pytest.approx(1 - 3 / 6)  # C(3,2)/C(4,2) pairs miss it
    assert pass_at_k(samples=4, correct=3, k=2) == 1.0  # any two hold a right one
    assert pass_at_k(samples=4, correct=4, k=4) == 1.0 and pass_at_k(samples=1, correct=0, k=1) == 0.0  # the bounds


@pytest.mark.parametrize(
    ("samples", "correct", "k", "named"),
    [
        (2, 0, 4, r"k must lie in 1\.\.samples \(1\.\.2\), got 4"),  # more draws than answers
        (4, 0, 0, r"k must lie in 1\.\.samples \(1\.\.4\), got 0"),
        (4, 5, 1, r"correct must lie in 0\.\.samples \(0\.\.4\), got 5"),  # more right answers than answers
        (4, -1, 2, r"correct must lie in 0\.\.samples \(0\.\.4\), got -1"),
        (0, 0, 1, r"samples must be 1 or more, got 0"),
    ],
    ids=["k above samples", "k zero", "correct above samples", "correct negative", "no samples"],
)
def test_pass_at_k_refuses_impossible_counts(samples, correct, k, named):
    with pytest.raises(ValueError, match=rf"^pass_at_k: {named}$"):
        pass_at_k(samples, correct, k)


def test_several_samples_per_question_give_pass_at_k_and_majority_vote():
    def record(question: int, answer: str | None, right: bool) -> dict:
        formatted = float(answer is not None)
        return {"question_index": question, "answer": answer, "reward": float(right), "format_reward": formatted,
                "length": 5}  # fmt: skip

    records = [
        record(0, "7", True), record(0, "7", True), record(0, "8", False), record(0, None, False),  # vote 7: right
        record(1, "3", False), record(1, "3", False), record(1, "4", True), record(1, "4", False),  # tie: 3 first
        record(2, None, False), record(2, None, False), record(2, None, False), record(2, "9", True),  # only 9
    ]  # fmt: skip
    metrics = summarize(records)
    assert metrics["samples_per_question"] == 4 and metrics["accuracy"] == pytest.approx(4 / 12)
    assert metrics["majority_accuracy"] == pytest.approx(2 / 3)
    expected_pass_2 = (1 - 1 / 6 + (1 - 3 / 6) + (1 - 3 / 6)) / 3  # 2, 1 and 1 right answers of 4
    assert metrics["pass_at_k"] == pytest.approx({"1": 4 / 12, "2": expected_pass_2, "4": 1.0})


def test_one_sample_per_question_reports_no_per_question_metrics():
    records = [{"question_index": i, "answer": "1", "reward": 1.0, "format_reward": 1.0, "length": 3} for i in range(3)]
    assert "pass_at_k" not in summarize(records) and "majority_accuracy" not in summarize(records)


def mcnemar_p_value(only_first: int, only_second: int) -> float:
    """McNemar's exact test on one answer per question: the sign-flip test over ±1 differences."""
    return sign_flip_p_value([1] * only_first + [-1] * only_second)


def test_mcnemar_exact_p_value_by_hand():
    assert mcnemar_p_value(0, 0) == 1.0
    assert mcnemar_p_value(5, 0) == pytest.approx(2 / 2**5)  # all 5 discordant pairs one way
    assert mcnemar_p_value(3, 1) == pytest.approx(2 * (1 + 4) / 16)  # P(X ≤ 1), X ~ Bin(4, 1/2), doubled
    assert mcnemar_p_value(2, 2) == 1.0


def test_routes_are_paired_with_the_model_they_started_from():
    def result(rewards: list[float]) -> EvalResult:
        records = [{"question_index": i, "reward": r} for i, r in enumerate(rewards)]
        return EvalResult({"accuracy": sum(rewards) / len(rewards)}, records, Tokens())

    results = {"base": result([0, 0, 0, 0, 1]), "sft": result([1, 1, 1, 0, 0]), "grpo": result([1, 1, 1, 1, 0])}
    add_paired_comparisons(results, {"sft": "base", "ei": "sft", "grpo": "sft"})
    assert results["sft"].metrics["paired"] == {
        "reference": "base", "only_this_right": 3, "only_reference_right": 1, "questions_this_better": 3,
        "questions_reference_better": 1, "test": "mcnemar_exact", "p_value": 0.625,
    }  # fmt: skip
    assert results["grpo"].metrics["paired"]["only_this_right"] == 1
    assert "paired" not in results["base"].metrics
    with pytest.raises(ValueError, match="same questions"):
        paired_comparison(results["sft"].records[:3], results["base"].records)


def test_several_samples_per_question_are_paired_question_by_question():
    def records(right_per_question: list[list[int]]) -> list[dict]:
        return [
            {"question_index": q, "reward": float(r)} for q, rights in enumerate(right_per_question) for r in rights
        ]

    this = records([[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
    reference = records([[0, 0, 0, 0], [0, 1, 0, 1], [1, 0, 1, 0], [0, 0, 0, 0]])
    paired = paired_comparison(this, reference)
    # Per question 4 − 0, 3 − 2, 1 − 2 and 0 − 0 right answers: the 2³ sign patterns of (4, 1, −1) sum to ±6, ±4, ±4
    # and ±2; 6 of the 8 are at least as far from 0 as the observed 4.
    assert paired == {
        "only_this_right": 6, "only_reference_right": 2, "questions_this_better": 2, "questions_reference_better": 1,
        "test": "sign_flip_exact_by_question", "p_value": 6 / 8,
    }  # fmt: skip
    # McNemar on the 16 answers as if independent would give 6 against 2 discordant: p = 0.29; per question 0.75.
    assert mcnemar_p_value(6, 2) == pytest.approx(0.2890625)

"""Reference CoTs as SFT pairs, and the calculator-annotation check that filters them."""

import json
import os
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from reasonrl.cot_filter import (
    DROP_REASONS,
    check_annotation,
    evaluate_arithmetic,
    make_sft_pairs,
    reference_response,
    strip_annotations,
)
from reasonrl.data import GSM8KExample, parse_lines
from reasonrl.grading import r1_zero_reward_fn
from reasonrl.presets import apply_to_file
from reasonrl.synthetic import arithmetic_lines

REPO = Path(__file__).resolve().parents[1]
NO_REASONING = '{"question": "What is 2 + 2?", "answer": "#### 4"}\n'


def test_reference_response_strips_annotations_and_closes_with_the_answer():
    example = GSM8KExample("q", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.", "72")
    assert strip_annotations(example.reasoning) == "Natalia sold 48/2 = 24 clips in May."
    response = reference_response(example)
    assert response == " Natalia sold 48/2 = 24 clips in May. </think> <answer> 72 </answer>"
    assert r1_zero_reward_fn(response, "72")["reward"] == 1.0


@pytest.mark.parametrize(
    ("expression", "value"),
    [("48/2", 24), ("(3+4)*2.5", Fraction(35, 2)), ("-3--4", 1), ("2**3", 8), ("2^3", 8), ("560//10", 56),
     (".5*4", 2), ("1,000+1", 1001), ("3 x 4", 12)],
)  # fmt: skip
def test_evaluate_arithmetic(expression, value):
    assert evaluate_arithmetic(expression) == value


@pytest.mark.parametrize(
    ("annotation", "verdict"),
    [
        ("48/2=24", None),
        ("10/3=3.33", None),  # rounded to the written precision
        ("7/2=3", None),  # truncated
        ("10/3=3.4", "annotation_wrong"),
        ("48/2=25", "annotation_wrong"),
        ("48/2", "annotation_unparsable"),
        ("1/0=1", "annotation_unparsable"),
        ("__import__('os').system('true')=0", "annotation_unparsable"),
        ("2**9999=1", "annotation_unparsable"),  # no unbounded powers
    ],
)
def test_check_annotation(annotation, verdict):
    assert check_annotation(annotation) == verdict


def test_pairs_are_marked_with_the_reason_they_would_be_dropped(tiny_tokenizer):
    examples = [
        GSM8KExample("q1", "2 + 2 = <<2+2=4>>4", "4"),
        GSM8KExample("q2", "2 + 2 = <<2+2=5>>5", "5"),
        GSM8KExample("q3", "2 + 2 = <<2+2>>4", "4"),
    ]
    pairs = make_sft_pairs(examples, "r1_zero", tiny_tokenizer)
    assert [pair.drop_reason for pair in pairs] == [None, "annotation_wrong", "annotation_unparsable"]
    assert pairs[0].prompt.endswith("User: q1\nAssistant: <think>")


def test_an_answer_only_example_is_kept_in_full_and_dropped_from_filtered(tiny_tokenizer):
    """A user's data with ``answer_format: number`` has no reasoning: nothing to verify as a chain of thought."""
    (pair,) = make_sft_pairs([GSM8KExample("q", "", "7")], "r1_zero", tiny_tokenizer)
    assert pair.drop_reason == "no_reasoning" and "no_reasoning" in DROP_REASONS
    assert pair.response == " </think> <answer> 7 </answer>"


def test_synthetic_arithmetic_is_deterministic_valid_and_correct():
    lines = arithmetic_lines(200, seed=3, max_steps=3, max_value=99)
    assert lines == arithmetic_lines(200, seed=3, max_steps=3, max_value=99)
    assert lines != arithmetic_lines(200, seed=4, max_steps=3, max_value=99)
    for example in parse_lines(lines, "synthetic"):
        steps = example.reasoning.splitlines()
        assert 1 <= len(steps) <= 3
        for step in steps:  # "Tom has 21 + 3 = 24 cards."
            expression, _, rest = step.partition(" has ")[2].partition(" = ")
            assert evaluate_arithmetic(expression) == int(rest.split()[0])
        assert steps[-1].split(" = ")[1].split()[0] == example.answer
        assert int(example.answer) >= 0


NEVER = """
def reward(response, ground_truth):
    return {"format_reward": 1.0, "answer_reward": 0.0, "reward": 0.0}
"""


def test_a_reward_that_keeps_nothing_stops_filter_cots_before_it_writes(tmp_path, tiny_model_dir, full_scale_params):
    """The stage in a tree whose reward rejects every reference CoT, after a run with the built-in: one line naming
    the reward and the counts, and that run's data/sft and stats as they were."""
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("stages", "src/reasonrl", "rewards"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=ignore)
    (tmp_path / "rewards/never.py").write_text(NEVER)
    params = tmp_path / "params.yaml"
    params.write_text(full_scale_params, encoding="utf-8")
    (tmp_path / "data/gsm8k").mkdir(parents=True)
    lines = arithmetic_lines(6, seed=0, max_steps=2, max_value=9)
    (tmp_path / "data/gsm8k/train.jsonl").write_text("".join(line + "\n" for line in lines[:5]) + NO_REASONING)
    command = [
        sys.executable, "stages/filter_cots.py", "--params", "params.yaml", "--data", "data/gsm8k",
        "--model", str(tiny_model_dir), "--out", "data/sft", "--stats", "stats.json",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    before = {path: path.read_bytes() for path in (tmp_path / "data/sft/filtered.jsonl", tmp_path / "stats.json")}
    assert json.loads(before[tmp_path / "stats.json"])["kept"] == 5

    apply_to_file({"rewards.r1_zero": "rewards.never:reward", "sft.prompt": "r1_zero"}, params)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "error: none of the 6 reference CoTs is kept (dropped 5 by reward, 1 by no_reasoning); the reward is "
        "rewards.r1_zero = rewards.never:reward, which must give reward 1.0 to a right, well-formed response"
    )
    assert {path: path.read_bytes() for path in before} == before
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["gsm8k", "sft"]  # no temporary left

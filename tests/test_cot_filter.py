"""Reference CoTs as SFT pairs, and the calculator-annotation check that filters them."""

from fractions import Fraction

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
from reasonrl.synthetic import arithmetic_lines


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

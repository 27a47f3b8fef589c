"""Reward functions: hand-written expectations, adversarial inputs, timing, and no evaluation of model text."""

from __future__ import annotations

import random
import time
from fractions import Fraction

import pytest

from reasonrl.grading import (
    MAX_NUMERAL_CHARS,
    ROUNDED_GOLD_PLACES,
    answers_match,
    extract_answer_block,
    has_r1_zero_format,
    last_boxed_content,
    last_numeral,
    numbers_in,
    parse_number,
    question_only_reward_fn,
    r1_zero_reward_fn,
    rounds_to,
)

TEN_TO_50 = "1" + "0" * 50
TEN_TO_50_PLUS_1 = "1" + "0" * 49 + "1"


def wrap(answer: str) -> str:
    """A well-formed R1-Zero response around ``answer``."""
    return f"Some reasoning. </think> <answer> {answer} </answer>"


# (response, ground_truth, format_reward, answer_reward, reward)
R1_ZERO_CASES = [
    # well-formed
    ("3 + 15 = 18 </think> <answer> 18 </answer>", "18", 1, 1, 1),
    ("3 + 15 = 18</think><answer>18</answer>", "18", 1, 1, 1),
    ("3 + 15 = 18\n</think>\n<answer>\n18\n</answer>\n", "18", 1, 1, 1),
    ("3 + 15 = 18 </think> <answer> 17 </answer>", "18", 1, 0, 0),
    # format violations
    ("<answer> 18 </answer> I am still thinking </think>", "18", 0, 1, 0),
    ("I guess <answer> 18 </answer>", "18", 0, 1, 0),
    ("reasoning </think> <answer> 18", "18", 0, 0, 0),
    ("reasoning <answer> 18 </answer>", "18", 0, 1, 0),
    ("reasoning </think> 18 </answer>", "18", 0, 0, 0),
    ("reasoning </think> <answer> 18 </answer> <answer> 18 </answer>", "18", 0, 0, 0),
    ("reasoning </think> <answer> 18 </answer> <answer> 19 </answer>", "18", 0, 0, 0),
    ("<answer> 19 </answer> reasoning </think> <answer> 18 </answer>", "18", 0, 0, 0),
    ("a </think> b </think> <answer> 18 </answer>", "18", 0, 1, 0),
    ("reasoning </think> <answer> </answer>", "18", 0, 0, 0),
    ("reasoning </think> <answer></answer>", "18", 0, 0, 0),
    ("reasoning </think> <answer> 18 </answer> Hope that helps!", "18", 0, 1, 0),
    ("reasoning </think> So: <answer> 18 </answer>", "18", 0, 1, 0),
    ("reasoning </think> </answer> 18 <answer>", "18", 0, 0, 0),
    ("reasoning </think> <ANSWER> 18 </ANSWER>", "18", 0, 0, 0),
    ("The answer is 18.", "18", 0, 0, 0),
    ("", "18", 0, 0, 0),
    # huge numbers, signs
    (wrap(TEN_TO_50), TEN_TO_50, 1, 1, 1),
    (wrap(TEN_TO_50_PLUS_1), TEN_TO_50, 1, 0, 0),
    (wrap("7" * 300), "7", 1, 0, 0),
    (wrap("\u22123"), "-3", 1, 1, 1),
    (wrap("-3"), "\u22123", 1, 1, 1),
    (wrap("-3"), "3", 1, 0, 0),
    # equal values written differently
    (wrap("1/2"), "0.5", 1, 1, 1),
    (wrap("3/6"), "0.5", 1, 1, 1),
    (wrap("0.5"), "1/2", 1, 1, 1),
    (wrap(".50"), "0.5", 1, 1, 1),
    (wrap("18.0"), "18", 1, 1, 1),
    (wrap("\\frac{1}{2}"), "0.5", 1, 1, 1),
    (wrap("\\dfrac{1}{2}"), "0.5", 1, 1, 1),
    (wrap("\\boxed{\\frac{1}{2}}"), "0.5", 1, 1, 1),
    (wrap("1.8"), "18", 1, 0, 0),
    (wrap("180"), "18", 1, 0, 0),
    # separators, currency, percent, boxes, words
    (wrap("$1,000.00"), "1000", 1, 1, 1),
    (wrap("1000"), "1,000", 1, 1, 1),
    (wrap("1,000,000"), "1000000", 1, 1, 1),
    (wrap("25%"), "25", 1, 1, 1),
    (wrap("\\boxed{18}"), "18", 1, 1, 1),
    (wrap("\\boxed{\\$18}"), "18", 1, 1, 1),
    (wrap("$18"), "18", 1, 1, 1),
    (wrap("\u20ac18"), "18", 1, 1, 1),
    (wrap("\u00a318"), "18", 1, 1, 1),
    (wrap("18 dollars"), "18", 1, 1, 1),
    (wrap("The answer is 18."), "18", 1, 1, 1),
    (wrap("18."), "18", 1, 1, 1),
    (wrap("18 (that is 18 dollars)"), "18", 1, 1, 1),
    (wrap("eighteen"), "18", 1, 0, 0),
    # hedging and malformed numbers
    (wrap("18 or 19"), "18", 1, 0, 0),
    (wrap("between 18 and 20"), "18", 1, 0, 0),
    (wrap("18-20"), "18", 1, 0, 0),
    (wrap("18, 19"), "18", 1, 0, 0),
    (wrap("18 \\boxed{19}"), "18", 1, 0, 0),
    (wrap("1.2.3"), "1.2", 1, 0, 0),
    (wrap("1/0"), "0", 1, 0, 0),
    (wrap("1/1/1"), "1", 1, 0, 0),
]


@pytest.mark.parametrize(("response", "ground_truth", "format_reward", "answer_reward", "reward"), R1_ZERO_CASES)
def test_r1_zero_reward_fn(response, ground_truth, format_reward, answer_reward, reward):
    assert r1_zero_reward_fn(response, ground_truth) == {
        "format_reward": format_reward,
        "answer_reward": answer_reward,
        "reward": reward,
    }


# (response, ground_truth, format_reward, answer_reward, reward)
QUESTION_ONLY_CASES = [
    ("6 * 3 = 18, so the answer is \\boxed{18}.", "18", 1, 1, 1),
    ("Half of it: \\boxed{\\frac{1}{2}}", "0.5", 1, 1, 1),
    ("Maybe \\boxed{17}. No, it is \\boxed{18}.", "18", 1, 1, 1),
    ("It is \\boxed{18}. No wait, \\boxed{17}.", "18", 1, 0, 0),
    ("\\boxed{\\boxed{18}}", "18", 1, 1, 1),
    ("3 apples and 15 more, so 18 apples.", "18", 1, 1, 1),
    ("18 apples, then 3 are eaten", "18", 1, 0, 0),
    ("She pays $1,000.00 in total", "1000", 1, 1, 1),
    ("The temperature ends at \u22123 degrees.", "-3", 1, 1, 1),
    ("Each gets \\frac{1}{2} of a pie", "0.5", 1, 1, 1),
    ("Somewhere in 18-20", "20", 1, 1, 1),
    ("The final answer is \\boxed{18", "18", 1, 1, 1),
    ("The answer is \\boxed{18 or 19}", "18", 1, 0, 0),
    ("\\boxed{\\text{eighteen}} after 18 steps", "18", 1, 0, 0),
    ("The answer is \\boxed{}", "18", 0, 0, 0),
    ("18", "18", 1, 1, 1),
    ("Total: " + "7" * 300, "7", 1, 0, 0),
    ("Total: " + "7" * 300 + " so 7", "7", 1, 1, 1),
    ("I do not know.", "18", 0, 0, 0),
    ("", "18", 0, 0, 0),
    ("</think> <answer> 18 </answer>", "18", 1, 1, 1),
]


@pytest.mark.parametrize(("response", "ground_truth", "format_reward", "answer_reward", "reward"), QUESTION_ONLY_CASES)
def test_question_only_reward_fn(response, ground_truth, format_reward, answer_reward, reward):
    assert question_only_reward_fn(response, ground_truth) == {
        "format_reward": format_reward,
        "answer_reward": answer_reward,
        "reward": reward,
    }


GSM8K_ANSWER_FIELD = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    ("reward_fn", "response", "reward"),
    [
        (r1_zero_reward_fn, "48 + 24 = 72 </think> <answer> 72 </answer>", 1.0),
        (r1_zero_reward_fn, "48 / 2 = 24 </think> <answer> 24 </answer>", 0.0),
        (question_only_reward_fn, "48 + 24 = \\boxed{72}", 1.0),
        (question_only_reward_fn, "She sold 24 clips in May", 0.0),
    ],
)
def test_ground_truth_as_gsm8k_answer_field(reward_fn, response, reward):
    assert reward_fn(response, GSM8K_ANSWER_FIELD)["reward"] == reward


def test_brace_less_fraction_is_the_fraction():
    """``\\frac12`` is one half, never the number 12: a policy that wrote it for 12 would be rewarded for a wrong
    answer."""
    assert r1_zero_reward_fn("x </think> <answer> \\frac12 </answer>", "12")["reward"] == 0.0
    assert r1_zero_reward_fn("x </think> <answer> \\frac12 </answer>", "0.5")["reward"] == 1.0


# (answer, ground truth, right): TeX reads each argument of \frac as a braced group or one character, after spaces
FRACTIONS = [
    ("\\frac12", "0.5", True),
    ("\\frac12", "12", False),
    ("\\dfrac34", "0.75", True),
    ("\\dfrac34", "34", False),
    ("\\tfrac12", "0.5", True),
    ("\\cfrac{1}{2}", "0.5", True),
    ("\\frac1{2}", "0.5", True),
    ("\\frac{1}2", "0.5", True),
    ("\\frac 1 2", "0.5", True),
    ("\\frac{12}3", "4", True),
    ("-\\frac12", "-0.5", True),
    ("-\\frac12", "0.5", False),
    ("\\boxed{\\frac12}", "0.5", True),
    ("$\\frac{1}{2}$.", "0.5", True),
    ("\\frac123", "0.5", False),  # one half, then a 3
    ("\\frac123", "123", False),
    ("\\frac123", "1/23", False),
    ("2\\frac12", "21/2", False),  # a mixed number, not 21/2; nor read as 5/2 (math-verify multiplies)
    ("\\frac12\\frac12", "0.5", False),  # a product
    ("\\frac{\\pi}{2}", "2", False),  # a fraction it cannot read is no number, not its denominator
    ("\\frac{\\frac{1}{2}}{3}", "3", False),
    ("{2 \\over 2}", "2", False),
]


@pytest.mark.parametrize(("answer", "ground_truth", "right"), FRACTIONS)
@pytest.mark.parametrize("prompt", ["r1_zero", "boxed", "last_number"])
def test_latex_fractions_are_read_as_tex_reads_them(answer, ground_truth, right, prompt):
    """The same reading where the answer is r1_zero's block, question_only's box, and question_only's last number."""
    response, reward_fn = {
        "r1_zero": (wrap(answer), r1_zero_reward_fn),
        "boxed": (f"So the answer is \\boxed{{{answer}}}", question_only_reward_fn),
        "last_number": (f"So the answer is {answer}", question_only_reward_fn),
    }[prompt]
    assert reward_fn(response, ground_truth)["answer_reward"] == float(right)


@pytest.mark.parametrize(
    ("answer", "ground_truth", "right"),
    [
        ("\\frac{2}{3}", "0.6666666667", True),  # MAWPS's golds: repeating decimals rounded to 10 places
        ("2/3", "0.6666666667", True),
        ("4/6", "0.6666666667", True),
        ("\\frac23", "0.6666666667", True),
        ("-2/3", "-0.6666666667", True),
        ("16/3", "5.3333333333", True),
        ("10/3", "3.33333", True),  # MAWPS's one gold of 5 places
        ("0.6666666667", "0.6666666667", True),
        ("0.67", "0.6666666667", False),  # a decimal answer must be the gold as written
        ("0.66666666667", "0.6666666667", False),
        ("0.6666666666", "0.6666666667", False),
        ("1/3", "0.6666666667", False),
        ("-2/3", "0.6666666667", False),
        ("2/3", "-0.6666666667", False),
        ("6667/10000", "0.6666666667", False),
        ("10/3", "3.333", False),  # 3 places are exact (ASDiv's 3.333 stays exact)
        ("1/3", "0.3", False),
        ("0.46", "0.5", False),
        ("1/2", "0.5", True),
    ],
)
def test_an_exact_answer_is_right_against_a_rounded_gold(answer, ground_truth, right):
    assert r1_zero_reward_fn(wrap(answer), ground_truth)["answer_reward"] == float(right)
    assert question_only_reward_fn(f"\\boxed{{{answer}}}", f"So.\n#### {ground_truth}")["answer_reward"] == float(right)


@pytest.mark.parametrize(("places", "max_denominator"), [(ROUNDED_GOLD_PLACES, 31), (6, 50), (10, 50)])
def test_at_most_one_fraction_rounds_to_a_rounded_gold(places, max_denominator):
    """For every fraction of [0, 2) with a denominator up to ``max_denominator`` (at 5 places all the rule admits),
    its value rounded to ``places`` is a gold that accepts it and no other such fraction: the rule cannot pass a
    second, wrong, answer. Each gold is checked against its neighbours in value, where any other would be."""
    values = sorted({Fraction(p, q) for q in range(1, max_denominator + 1) for p in range(2 * q)})
    for index, truth in enumerate(values):
        gold = Fraction(f"{float(truth):.{places}f}")
        neighbours = values[max(0, index - 3) : index + 4]
        assert [value for value in neighbours if value == gold or rounds_to(value, gold, places)] == [truth]


def test_ground_truth_field_with_thousands_separator():
    assert r1_zero_reward_fn(wrap("1000"), "He earns 1,000 dollars.\n#### 1,000")["reward"] == 1.0


@pytest.mark.parametrize(
    ("numeral", "value"),
    [
        ("18", Fraction(18)),
        ("-3", Fraction(-3)),
        ("\u22123", Fraction(-3)),
        ("1,000", Fraction(1000)),
        ("18.0", Fraction(18)),
        (".50", Fraction(1, 2)),
        ("1/2", Fraction(1, 2)),
        ("18.", Fraction(18)),
        ("1.2.3", None),
        ("1/2/3", None),
        ("1/0", None),
        ("", None),
        ("eighteen", None),
        ("9" * (MAX_NUMERAL_CHARS + 1), None),
    ],
)
def test_parse_number(numeral, value):
    assert parse_number(numeral) == value


def test_numbers_in_and_answers_match():
    assert numbers_in("The answer is $1,000.") == [Fraction(1000)]
    assert numbers_in("18 or 19") == [Fraction(18), Fraction(19)]
    assert numbers_in("no number") == []
    assert numbers_in("1.2.3") is None
    assert numbers_in("1 " * 100) is None
    assert answers_match("$1,000.00", "1000")
    assert not answers_match("18 or 19", "18")


def test_format_helpers():
    assert extract_answer_block("x </think> <answer> 18 </answer>") == "18"
    assert extract_answer_block("<answer> 18 </answer><answer> 18 </answer>") is None
    assert has_r1_zero_format("x </think> <answer> 18 </answer>\n")
    assert not has_r1_zero_format("x </think> <answer> 18 </answer> more")
    assert last_boxed_content("\\boxed{1} \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert last_boxed_content("\\boxed{{{") is None
    assert last_numeral("3 + 15 = 18 apples.") == "18"
    assert last_numeral("no digits") is None


def test_reward_values_are_floats():
    rewards = r1_zero_reward_fn(wrap("18"), "18")
    assert all(type(value) is float for value in rewards.values())
    rewards = question_only_reward_fn("\\boxed{18}", "18")
    assert all(type(value) is float for value in rewards.values())


def _adversarial_responses() -> dict[str, str]:
    rng = random.Random(0)
    alphabet = "0123456789 ./,-\u2212{}\\$%<>abcdefx\n"
    junk = "".join(rng.choice(alphabet) for _ in range(100_000))
    tag_junk = "".join(
        rng.choice(["<answer>", "</answer>", "</think>", "\\boxed{", "}", "7", " "]) for _ in range(20_000)
    )
    bodies = {
        "digits": "9" * 100_000,
        "ones": "1 " * 50_000,
        "one_slash_run": "1/" * 50_000,
        "dotted_digits": "1." * 50_000,
        "commas": "1," * 50_000,
        "minus_run": "-" * 100_000,
        "dots": "." * 100_000,
        "letters": "a" * 100_000,
        "fractions": "\\frac{1}{2}" * 9_000,
        "open_fractions": "\\frac{" * 16_000,
        "bare_fractions": "\\frac12" * 14_000,
        "spaced_fractions": "\\frac 1 2 " * 10_000,
        "half_braced_fractions": "\\frac{1}" * 12_000,
        "mixed_numbers": "2\\dfrac12" * 11_000,
        "fraction_commands": "\\tfrac" * 16_000,
        "overs": "1 \\over 2 " * 10_000,
        "fraction_then_spaces": "\\frac" + " " * 99_990 + "12",
        "spaced_fraction_commands": ("\\frac" + " " * 50) * 1_800 + "1",
        "junk": junk,
    }
    responses = dict(bodies)
    responses.update({f"answer_of_{name}": wrap(body) for name, body in bodies.items()})
    responses.update(
        {
            "answer_tags": "<answer>" * 50_000,
            "answer_blocks": "</think> " + "<answer> 1 </answer>" * 5_000,
            "nested_boxed": "\\boxed{" + "{" * 100_000,
            "many_boxed": "\\boxed{" * 14_000,
            "balanced_braces": "\\boxed{" + "{}" * 50_000 + "}",
            "tag_junk": tag_junk,
        }
    )
    return responses


ADVERSARIAL = _adversarial_responses()


@pytest.mark.parametrize("reward_fn", [r1_zero_reward_fn, question_only_reward_fn])
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_response_scored_fast(reward_fn, name):
    response = ADVERSARIAL[name]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        rewards = reward_fn(response, "18")
        best = min(best, time.perf_counter() - start)
    assert set(rewards) == {"format_reward", "answer_reward", "reward"}
    assert rewards["reward"] == 0.0
    assert best < 0.010, f"{reward_fn.__name__} took {best * 1000:.2f} ms on {name}"


@pytest.mark.parametrize("reward_fn", [r1_zero_reward_fn, question_only_reward_fn])
def test_model_text_is_never_evaluated(reward_fn, tmp_path):
    written = tmp_path / "written_by_model"
    touched = tmp_path / "touched_by_model"
    # Evaluated, the first payload would give 5 (characters written) and the second 0 (the shell's exit status).
    payloads = {
        f"__import__(\"pathlib\").Path({str(written)!r}).write_text('pwned')": "5",
        f"__import__('os').system('touch {touched}')": "0",
    }
    for payload, value_if_evaluated in payloads.items():
        for response in (wrap(payload), f"\\boxed{{{payload}}}"):
            assert reward_fn(response, value_if_evaluated)["reward"] == 0.0
        reward_fn(payload, value_if_evaluated)  # the bare text: graded by its last number, which is no concern here
    assert not written.exists()
    assert not touched.exists()


ZEROS = {"format_reward": 0.0, "answer_reward": 0.0, "reward": 0.0}


@pytest.mark.parametrize("reward_fn", [r1_zero_reward_fn, question_only_reward_fn])
@pytest.mark.parametrize(
    ("response", "ground_truth"),
    [
        (None, "18"),
        (18, "18"),
        (b"</think> <answer> 18 </answer>", "18"),
        (["</think> <answer> 18 </answer>"], "18"),
        (wrap("18"), None),
        (wrap("18"), 18),
        (wrap("18"), b"18"),
    ],
)
def test_arguments_that_are_not_strings_score_zero(reward_fn, response, ground_truth):
    assert reward_fn(response, ground_truth) == ZEROS


@pytest.mark.parametrize("reward_fn", [r1_zero_reward_fn, question_only_reward_fn])
@pytest.mark.parametrize("ground_truth", ["", "####", "#### ", "no number here", "18 or 19", "\ud800", "\x00"])
def test_unreadable_ground_truth_scores_no_answer(reward_fn, ground_truth):
    assert reward_fn(wrap("18"), ground_truth) == {"format_reward": 1.0, "answer_reward": 0.0, "reward": 0.0}


@pytest.mark.parametrize("reward_fn", [r1_zero_reward_fn, question_only_reward_fn])
@pytest.mark.parametrize(
    "response",
    [
        "\ud800",
        "\x00",
        "None",
        "</think>\x00<answer>\ud800</answer>",
        "</think> <answer> 18\x00 </answer>",
        "\\boxed{\ud800}",
        "\\boxed{\x00}",
        "\\frac{}{}\\dfrac{1}{0}",
        "\udfff18\ud800",
    ],
)
def test_garbage_never_raises(reward_fn, response):
    rewards = reward_fn(response, "18")
    assert set(rewards) == {"format_reward", "answer_reward", "reward"}
    assert all(value in (0.0, 1.0) for value in rewards.values())


@pytest.mark.parametrize(
    "answer, ground_truth",
    [
        ("\\sqrt{4}", "4"),
        ("x^2", "2"),
        ("3^3", "3"),
        ("3 \\times 3", "3"),
        ("3 \\cdot 3", "3"),
        ("\\boxed{\\sqrt{9}}", "9"),
    ],
)
def test_a_root_power_or_product_is_not_the_number_it_repeats(answer, ground_truth):
    """Every number in ``\\sqrt{4}`` or ``3^3`` is one value, but the answer states another: no reward for it."""
    assert r1_zero_reward_fn(f"x </think> <answer> {answer} </answer>", ground_truth)["answer_reward"] == 0.0
    assert question_only_reward_fn(f"so \\boxed{{{answer}}}", ground_truth)["answer_reward"] == 0.0

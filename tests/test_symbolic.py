"""Issue 33: LaTeX answers graded by math-verify (reasonrl.symbolic), each within a CPU-time bound whose timeouts
count as wrong and are counted; ``rewards.<prompt>: math_verify`` makes it a prompt's reward, and a held-out set with
LaTeX answers is graded by it."""

import signal
import threading
import time

import pytest

from reasonrl import symbolic
from reasonrl.config import EvalConfig, load_params
from reasonrl.data import GSM8KExample
from reasonrl.evaluation import evaluate
from reasonrl.presets import apply_to_file
from reasonrl.prompts import EXTRACTIONS, REWARD_FNS
from reasonrl.rewards import MATH_VERIFY, prompt_reward, rewards_for
from reasonrl.rollouts.types import Sample
from reasonrl.symbolic import gold_parses, timeouts, verdict

PI_PAIR = "\\left( 3, \\frac{\\pi}{2} \\right)"
"""MATH-500's first answer: a pair no single number states."""
PATHOLOGICAL = "9^{9^{9^{9}}}"
"""sympy compares this with a number for ever."""


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("(3, \\frac{\\pi}{2})", PI_PAIR, True),  # bare LaTeX, read whole
        ("$(3,\\pi/2)$", PI_PAIR, True),
        ("\\boxed{(3, \\frac{\\pi}{2})}", PI_PAIR, True),
        ("(3, \\frac{\\pi}{3})", PI_PAIR, False),
        ("(\\frac{\\pi}{2}, 3)", PI_PAIR, False),  # a pair is ordered
        ("0.5", "\\frac{1}{2}", True),
        ("-4n+10", "10-4 n", True),  # college_math's answer, without its $
        ("10+4n", "10-4 n", False),
        ("18 dollars", "18", True),  # a number in words around it
        ("19", "18", False),
        ("2,300", "2300", True),
        ("", "18", False),
        (None, "18", False),  # the prompt's extraction found no answer
    ],
)
def test_answers_are_graded_symbolically(answer, gold, correct):
    assert verdict(answer, gold) == symbolic.Verdict(correct)


def test_a_ground_truth_math_verify_cannot_read_is_refused():
    assert gold_parses(PI_PAIR) and gold_parses("$\\frac{48 i-56}{85}$") and gold_parses("18")
    assert not gold_parses("There is no solution.") and not gold_parses("np.arcsin(10/13)")


MATRIX_OVER_LINES = "So \\boxed{\\begin{pmatrix}\n1 \\\\\n2\n\\end{pmatrix}}."
"""A boxed answer written over several lines, as models (and college_math's golds) write matrices."""


@pytest.mark.parametrize("prompt", ["r1_zero", "question_only"])
@pytest.mark.parametrize("extraction", EXTRACTIONS)
def test_a_boxed_answer_over_several_lines_is_read_whole(prompt, extraction):
    gold = "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"
    reward = prompt_reward(prompt, {prompt: MATH_VERIFY}, extraction=extraction)
    for answer, right in ((MATRIX_OVER_LINES, 1.0), (MATRIX_OVER_LINES.replace("2", "3"), 0.0)):
        response = R1.format(answer) if prompt == "r1_zero" else answer
        assert reward(response, gold)["reward"] == right
    assert verdict("\\begin{pmatrix}\n1 \\\\\n2\n\\end{pmatrix}", gold) == symbolic.Verdict(True)


@pytest.mark.parametrize(
    ("gold", "read_as_if_kept"),
    [
        ("\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}", "2/3"),  # Minerva's
        ("\\max at x=2, min at x=4", "4"),  # college_math's
        ("\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}", "2"),
        ("Solution is: [x=1, y=5, z=3]", "3"),
        ("x \\neq \\pm 5", "5"),
    ],
)
def test_a_gold_read_only_in_part_is_refused(gold, read_as_if_kept):
    """math-verify's default mode would read a piece of each (the second column): a response stating that piece
    would be graded right."""
    assert not gold_parses(gold)
    assert verdict(read_as_if_kept, gold) == symbolic.Verdict(False)


@pytest.mark.parametrize(
    ("gold", "right", "wrong"),
    [
        # OlympiadBench's; 62.5, as math-verify reads $62.5\%$
        ("62.5%", ["62.5", "62.5\\%", "\\frac{125}{2}"], ["0.625", "6.25"]),
        ("8 \\%", ["8", "8\\%"], ["0.8"]),
        ("-1./3", ["-1/3", "-\\frac{1}{3}"], ["-1", "-1/4"]),  # Minerva's
        ("\\sqrt{27}.", ["3\\sqrt{3}"], ["27"]),  # college_math's
        (".273.", ["0.273"], ["273"]),
        (".344,.441, .189, .027.", ["0.344, 0.441, 0.189, 0.027"], ["0.027"]),  # read whole: all four
        ("\\approx 17.10 \\mathrm{ft}", ["17.1"], ["17"]),
    ],
)
def test_a_gold_with_a_percent_sign_full_stop_or_point_before_a_slash_is_read(gold, right, wrong):
    assert gold_parses(gold)
    assert [verdict(answer, gold).correct for answer in right + wrong] == [True] * len(right) + [False] * len(wrong)


def test_a_sentence_keeps_its_full_stop_and_stays_unreadable():
    """Without its full stop math-verify would read the sentence as the product of its letters; an ellipsis is
    no full stop."""
    assert symbolic.as_formula("There is no solution.") == "There is no solution."
    assert symbolic.as_formula("No.") == "No." and symbolic.as_formula("(x, y)=(1,0).") == "(x, y)=(1,0)"
    assert symbolic.as_formula("\\sqrt{27}.") == "\\sqrt{27}"
    assert symbolic.as_formula("1, 2, \\ldots") == "1, 2, \\ldots"
    assert not gold_parses("There is no solution.")


def test_a_pathological_answer_runs_out_of_time_is_wrong_and_counted():
    """Without the bound, comparing 9^(9^(9^9)) with 3 never returns (math-verify's own timeouts are off). The bound
    is CPU time: the verdict returns after about that much of it, however loaded the machine."""
    verdict("1", "1")  # math-verify imported and warmed up: the bound is the grading's alone
    before, cpu, handler = timeouts(), time.process_time(), signal.getsignal(signal.SIGPROF)
    assert verdict(PATHOLOGICAL, "3", seconds=0.5) == symbolic.Verdict(False, timed_out=True)
    assert 0.4 <= time.process_time() - cpu < 2.0  # the kernel counts CPU time in ticks
    assert timeouts() == before + 1
    assert signal.getsignal(signal.SIGPROF) is handler  # the timer's handler is gone again
    assert verdict("3", "3") == symbolic.Verdict(True) and timeouts() == before + 1  # grading goes on


def test_grading_off_the_main_thread_is_refused():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, verdict, "1", "1")))
    thread.start()
    thread.join()
    assert "only the main thread receives" in str(errors[0].value)


R1 = "2 + 1 = 3 </think> <answer> {} </answer>"


def test_math_verify_is_a_reward_any_prompt_can_name(params_file):
    apply_to_file({"rewards.r1_zero": MATH_VERIFY, "rewards.question_only": MATH_VERIFY}, params_file)
    specs = load_params(params_file).rewards.specs  # probed when params load, as every reward is
    r1_zero, question_only = prompt_reward("r1_zero", specs), prompt_reward("question_only", specs)
    assert r1_zero(R1.format("(3, \\frac{\\pi}{2})"), PI_PAIR) == {
        "format_reward": 1.0,
        "answer_reward": 1.0,
        "reward": 1.0,
    }
    assert r1_zero(R1.format("(3, \\frac{\\pi}{2})") + " more", PI_PAIR)["reward"] == 0.0  # r1_zero's format rule
    assert r1_zero(R1.format("3"), PI_PAIR)["answer_reward"] == 0.0
    assert question_only("So the point is $\\boxed{(3, \\frac{\\pi}{2})}$.", PI_PAIR)["reward"] == 1.0
    assert question_only("So the point is (3, pi/2).", PI_PAIR)["reward"] == 0.0  # its last number, 2
    # the built-in cannot grade it: no single number
    assert prompt_reward("r1_zero")(R1.format("(3, \\frac{\\pi}{2})"), PI_PAIR)["reward"] == 0.0


def test_math_verify_keeps_the_builtins_format_rule_without_running_its_answer_check(monkeypatch):
    """Each answer is graded once, by math-verify: the built-in reward, whose answer check was computed beside it and
    thrown away, no longer runs; the format rule alone gives the built-in's ``format_reward`` on every response."""
    responses = [
        R1.format("3"), R1.format("3") + " more", R1.format(" "), "</think> <answer> 1 </answer> <answer> 3 </answer>",
        "So it is \\boxed{3}.", "So it is \\boxed{}.", "three", "", "x = 3",
    ]  # fmt: skip
    for prompt in ("r1_zero", "question_only", "r1_zero_chat"):
        expected = [REWARD_FNS[prompt](response, "3")["format_reward"] for response in responses]
        called = []
        monkeypatch.setitem(REWARD_FNS, prompt, lambda response, truth, seen=called: seen.append(response))
        reward = prompt_reward(prompt, {prompt: MATH_VERIFY})
        assert [reward(response, "3")["format_reward"] for response in responses] == expected
        assert not called and 0 < sum(expected) < len(expected)


def test_a_latex_set_is_graded_by_math_verify_unless_the_user_chose_a_reward():
    specs = {"r1_zero": "r1_zero", "question_only": "rewards.tolerant:tolerant_reward"}
    assert rewards_for("gsm8k", specs) == specs
    assert rewards_for("latex", specs) == {"r1_zero": MATH_VERIFY, "question_only": specs["question_only"]}


def test_an_evaluation_graded_by_math_verify_counts_its_timeouts(monkeypatch):
    monkeypatch.setattr(symbolic, "GRADING_SECONDS", 0.5)
    texts = [R1.format("\\frac{6}{2}"), R1.format(PATHOLOGICAL), R1.format("4")]

    class Engine:  # answers every question with the texts above
        def tokenizer(self):
            return None

        def generate(self, prompts, n, **sampling):
            return [[Sample(text, [1], None, prompt_token_ids=[2], finish="stop_string") for text in texts]]

    config = EvalConfig(samples_per_question=3)
    result = evaluate(Engine(), [GSM8KExample("q", "", "3")], "r1_zero", config, rewards={"r1_zero": MATH_VERIFY})
    assert [record["reward"] for record in result.records] == [1.0, 0.0, 0.0]
    assert result.metrics["grading_timeouts"] == 1 and result.metrics["accuracy"] == pytest.approx(1 / 3)
    assert "grading_timeouts" not in evaluate(Engine(), [GSM8KExample("q", "", "3")], "r1_zero", config).metrics

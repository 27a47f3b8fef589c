"""Accuracy intervals and the paired test with several samples per question: by simulation, the 95% interval covers
the true accuracy about 95% of the time and the paired test rejects a true null at most about 5% of the time, where
treating samples as independent does neither; with one sample per question they are Wilson's and McNemar's."""

import itertools
import math
import random

import numpy as np
import pytest

from reasonrl.evaluation import clustered_interval, paired_comparison, summarize
from reasonrl.statistics import effective_sample_size, sign_flip_p_value, wilson_interval

# GSM8K-like heterogeneity: per-question accuracies spread over [0, 1] (Beta(0.9, 1.1): mean 0.45, intra-question
# correlation 1/3), so 8 samples of a question are worth about 2.4 independent answers.
SAMPLES, REPETITIONS = 8, 1000
BETA = (0.9, 1.1)
SEED = 0


def records(right: np.ndarray) -> list[dict]:
    """Graded records as ``evaluate`` writes them (the fields the statistics read); a row of ``right`` per question."""
    return [{"question_index": q, "reward": float(r)} for q, row in enumerate(right.tolist()) for r in row]


def interval_coverage(seed: int, questions: int = 100) -> tuple[float, float]:
    """How often the clustered interval, and the Wilson interval over all answers as if independent, cover the
    population accuracy: questions drawn afresh each repetition, as a test set is a sample of questions."""
    rng = np.random.default_rng(seed)
    truth = BETA[0] / sum(BETA)
    clustered = independent = 0
    for _ in range(REPETITIONS):
        accuracy = rng.beta(*BETA, questions)
        right = rng.random((questions, SAMPLES)) < accuracy[:, None]
        interval = clustered_interval(records(right))
        clustered += interval["low"] <= truth <= interval["high"]
        low, high = wilson_interval(right.mean(), right.size)
        independent += low <= truth <= high
    return clustered / REPETITIONS, independent / REPETITIONS


def test_the_clustered_interval_covers_the_truth_95_percent_of_the_time():
    clustered, independent = interval_coverage(SEED)
    # 1000 repetitions: the coverage's standard error is 0.007; seeds 0–19 gave 0.942–0.961.
    assert 0.93 <= clustered <= 0.97
    assert independent < 0.8  # samples as independent answers: 0.67–0.74 over the same seeds


def rejection_rates(
    seed: int, shift: float = 0.0, questions: int = 30, repetitions: int = REPETITIONS
) -> tuple[float, float]:
    """How often the paired test, and McNemar's test on the answers as if independent, reject at 0.05 when two
    models' logits on each question differ by a random amount with mean ``shift`` and standard deviation 2: under
    ``shift = 0`` the two are equally accurate over questions, yet on each question one is better."""
    rng = np.random.default_rng(seed)
    per_question = answers = 0
    for _ in range(repetitions):
        logit = rng.normal(-0.2, 1.5, questions)
        gap = rng.normal(shift, 2.0, questions)
        this = rng.random((questions, SAMPLES)) < 1 / (1 + np.exp(-(logit + gap / 2)))[:, None]
        reference = rng.random((questions, SAMPLES)) < 1 / (1 + np.exp(-(logit - gap / 2)))[:, None]
        paired = paired_comparison(records(this), records(reference))
        per_question += paired["p_value"] < 0.05
        answers += mcnemar_p_value(paired["only_this_right"], paired["only_reference_right"]) < 0.05
    return per_question / repetitions, answers / repetitions


def test_the_paired_test_holds_its_size_under_the_null():
    per_question, answers = rejection_rates(SEED)
    # An exact test rejects at most 5% (a little less: its p-values are discrete); seeds 0–19 gave 0.033–0.055,
    # within the 0.007 standard error of 1000 repetitions.
    assert per_question <= 0.07
    assert answers > 0.15  # McNemar on the answers as if independent: 0.20–0.24 over the same seeds


def test_the_paired_test_finds_a_real_difference():
    # One model 1.5 logits better on average: 59% against 35% accurate. Seeds 0–19 gave a power of 0.84–0.94.
    per_question, _ = rejection_rates(SEED, shift=1.5, repetitions=200)
    assert per_question > 0.7


def brute_force_p_value(differences: list[int]) -> float:
    """The sign-flip p-value by enumerating every sign pattern."""
    observed = abs(sum(differences))
    patterns = itertools.product((1, -1), repeat=len(differences))
    totals = [sum(s * d for s, d in zip(signs, differences, strict=True)) for signs in patterns]
    return sum(abs(t) >= observed for t in totals) / len(totals)


def test_sign_flip_p_value_is_the_exact_enumeration():
    rng = random.Random(SEED)
    for _ in range(200):
        differences = [rng.randint(-4, 4) for _ in range(rng.randint(0, 10))]
        assert sign_flip_p_value(differences) == pytest.approx(brute_force_p_value(differences), rel=1e-12)


def mcnemar_p_value(only_first: int, only_second: int) -> float:
    """McNemar's exact test as ``reasonrl.evaluation`` computed it before the sign-flip test replaced it."""
    discordant = only_first + only_second
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, i) for i in range(min(only_first, only_second) + 1)) / 2**discordant
    return min(1.0, 2 * tail)


def test_with_one_sample_per_question_the_sign_flip_test_is_mcnemars_exact_test_to_the_bit():
    for only_first, only_second in itertools.product(range(40), repeat=2):
        differences = [1] * only_first + [0] * 3 + [-1] * only_second  # questions both got right or wrong: 0
        assert sign_flip_p_value(differences) == mcnemar_p_value(only_first, only_second)


def test_effective_sample_size_by_hand():
    assert effective_sample_size([1, 0, 1], [1, 1, 1]) == 3.0  # one sample per question: n
    # p = 1/2; Σ (correct − p·samples)² = 2² + 2² + 0 = 8; p(1 − p) n² / 8 = 0.25 · 144 / 8
    assert effective_sample_size([4, 0, 2], [4, 4, 4]) == pytest.approx(4.5)
    assert effective_sample_size([4, 0, 4], [4, 4, 4]) == pytest.approx(3.0)  # samples agree: one per question
    assert effective_sample_size([2, 2, 2], [4, 4, 4]) == 12.0  # no spread between questions: capped at n
    assert effective_sample_size([0, 0, 0], [4, 4, 4]) == 3.0  # all wrong: nothing to measure agreement with
    with pytest.raises(ValueError, match=r"effective_sample_size: .* same questions \(got 2 and 1\)"):
        effective_sample_size([1, 2], [4])
    with pytest.raises(ValueError, match="each with one or more samples"):
        effective_sample_size([0], [0])


def graded(correct_per_question: list[int], samples: int) -> list[dict]:
    return [
        {"question_index": q, "reward": float(i < right), "format_reward": 1.0, "length": 3, "answer": str(i < right)}
        for q, right in enumerate(correct_per_question) for i in range(samples)
    ]  # fmt: skip


def test_one_sample_per_question_keeps_the_wilson_interval_over_the_answers():
    summary = summarize(graded([1, 1, 1, 0, 0, 0, 0, 0, 0, 0], samples=1))
    assert summary["accuracy_interval"] == {
        "method": "wilson", "level": 0.95, "effective_n": 10.0, "low": wilson_interval(0.3, 10)[0],
        "high": wilson_interval(0.3, 10)[1],
    }  # fmt: skip
    assert summary["accuracy_stderr"] == math.sqrt(0.3 * 0.7 / 10)


def test_several_samples_per_question_widen_the_interval_by_their_agreement():
    summary = summarize(graded([4, 0, 2], samples=4))
    low, high = wilson_interval(0.5, 4.5)
    assert summary["accuracy_interval"] == {
        "method": "wilson_clustered_by_question", "level": 0.95, "effective_n": pytest.approx(4.5),
        "low": pytest.approx(low), "high": pytest.approx(high),
    }  # fmt: skip
    assert summary["accuracy_stderr"] == pytest.approx(math.sqrt(0.25 / 4.5))
    assert (summary["n"], summary["questions"]) == (12, 3)

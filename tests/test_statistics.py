"""Accuracy intervals and the paired test with several samples per question: by simulation, the 95% interval covers
the true accuracy about 95% of the time and the paired test rejects a true null at most about 5% of the time, where
treating samples as independent does neither; with one sample per question they are Wilson's and McNemar's."""

import itertools
import math
import random

import numpy as np
import pytest

from reasonrl.evaluation import clustered_interval, paired_comparison, summarize
from reasonrl.statistics import (
    effective_sample_size,
    holm_adjusted,
    minimum_detectable_difference,
    seed_variance_components,
    sign_flip_p_value,
    t_quantile,
    two_level_bootstrap_interval,
    welch_test,
    wilson_interval,
)

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


def seeds_interval_coverage(seed: int, seed_spread: float, seeds: int = 3, questions: int = 100) -> tuple[float, float]:
    """How often the two-level bootstrap interval of the mean over ``seeds`` seeds, and the Wilson interval over all
    their answers as if one run, cover the population accuracy. Seeds and questions crossed, as in the pipeline:
    every seed answers the same questions (logit difficulty N(0, 1.5²), drawn afresh each repetition), and a seed
    shifts every question's logit by N(0, seed_spread²)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, 1_000_000) + rng.normal(0, seed_spread, 1_000_000)
    truth = float(np.mean(1 / (1 + np.exp(-logits))))
    bootstrap = pooled = 0
    repetitions = 400
    for repetition in range(repetitions):
        logit = rng.normal(0, 1.5, questions)[None, :] + rng.normal(0, seed_spread, seeds)[:, None]
        right = (rng.random((seeds, questions)) < 1 / (1 + np.exp(-logit))).astype(float)
        low, high = two_level_bootstrap_interval(right, resamples=500, seed=repetition)
        bootstrap += low <= truth <= high
        low, high = wilson_interval(right.mean(), right.size)
        pooled += low <= truth <= high
    return bootstrap / repetitions, pooled / repetitions


def test_the_two_level_interval_covers_the_truth_over_seeds_and_questions():
    # Seeds 2.5 accuracy points apart (logit sd 0.3 around 50%): 3 seeds of 100 questions. 400 repetitions: the
    # coverage's standard error is 0.011; simulation seeds 0–5 gave 0.935–0.963, the pooled Wilson 0.72–0.78.
    bootstrap, pooled = seeds_interval_coverage(SEED, seed_spread=0.3)
    assert 0.92 <= bootstrap <= 0.98
    assert pooled < 0.85
    # Without seed-to-seed spread the interval is a little wide (seeds 0–2: 0.975–0.98): questions are counted at
    # both levels. With seeds 20 points apart (logit sd 1) 3 seeds are too few for a bootstrap: 0.80–0.83, as the
    # docstring says; the Welch test's t distribution is what accounts for few seeds.
    assert seeds_interval_coverage(SEED, seed_spread=0.0)[0] >= 0.95
    assert seeds_interval_coverage(SEED, seed_spread=1.0)[0] < 0.9


def test_the_two_level_interval_by_hand():
    # One seed, questions all alike: nothing varies, the interval is the point.
    assert two_level_bootstrap_interval([[0.5, 0.5, 0.5]]) == (0.5, 0.5)
    # Two seeds each right on every question or on none: a resample's mean is 0, 1/2 or 1 by how many copies of the
    # right seed it draws, so the 95% interval spans [0, 1].
    assert two_level_bootstrap_interval([[1.0] * 4, [0.0] * 4]) == (0.0, 1.0)
    # One seed: the questions' bootstrap alone, which lies within the questions' range and around their mean.
    low, high = two_level_bootstrap_interval([[0.0, 1.0] * 50])
    assert 0.35 < low < 0.5 < high < 0.65
    with pytest.raises(ValueError, match="seeds × questions"):
        two_level_bootstrap_interval([0.5, 0.5])


def test_seed_variance_components_by_hand():
    # Seed means 0.5 and 0.25 (variance 0.03125); question means 0.75, 0.25, 0.125, 0.375 (overall 0.375).
    # Residuals a_sq − seed mean − question mean + 0.375: seed 0: 0, 0.125, −0.25, 0.125; seed 1: their negatives.
    # within = Σ residual² / ((2 − 1)(4 − 1)) = 2 · 0.09375 / 3 = 0.0625; between = 0.03125 − 0.0625 / 4.
    between, within = seed_variance_components([[0.875, 0.5, 0.0, 0.625], [0.625, 0.0, 0.25, 0.125]])
    assert within == pytest.approx(0.0625)
    assert between == pytest.approx(0.015625)
    # Seeds that differ less than their questions' noise explains: between is 0, not negative.
    assert seed_variance_components([[1.0, 0.0], [0.0, 1.0]]) == (0.0, 1.0)


def test_welch_test_by_hand():
    # Seed accuracies 0.50, 0.52, 0.48 against 0.40, 0.44, 0.42: both variances 0.0004, so t = 0.08 / √(2·0.0004/3)
    # with 4 degrees of freedom (equal variances and seeds); with 4 of them P(|T| ≥ t) = 1 − (3x − x³) / 2 with
    # x = t / √(4 + t²).
    result = welch_test([0.50, 0.52, 0.48], [0.40, 0.44, 0.42])
    t = 0.08 / math.sqrt(0.0008 / 3)
    x = t / math.sqrt(4 + t * t)
    assert result["difference"] == pytest.approx(0.08)
    assert result["t"] == pytest.approx(t)
    assert result["df"] == pytest.approx(4.0)
    assert result["p_value"] == pytest.approx(1 - (3 * x - x**3) / 2, rel=1e-9)
    # Unequal variances and seeds: Satterthwaite's degrees of freedom from each setting's share of the variance.
    result = welch_test([0.50, 0.52, 0.48], [0.40, 0.44, 0.36, 0.40])
    shares = (np.var([0.50, 0.52, 0.48], ddof=1) / 3, np.var([0.40, 0.44, 0.36, 0.40], ddof=1) / 4)
    assert result["df"] == pytest.approx(sum(shares) ** 2 / (shares[0] ** 2 / 2 + shares[1] ** 2 / 3))
    assert math.isnan(welch_test([0.5, 0.5], [0.4, 0.4])["p_value"])  # no seed-to-seed spread: nothing to test
    with pytest.raises(ValueError, match="two seeds per setting"):
        welch_test([0.5], [0.4, 0.4])


def test_welch_test_holds_its_size_with_three_seeds():
    rng = np.random.default_rng(SEED)
    rejections = sum(welch_test(rng.normal(0, 1, 3), rng.normal(0, 1, 3))["p_value"] < 0.05 for _ in range(4000))
    assert 0.02 <= rejections / 4000 <= 0.06  # a little conservative at 3 against 3: seeds 0–4 gave 0.030–0.039


def test_t_quantiles_match_the_tables():
    assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
    assert t_quantile(0.8, 4) == pytest.approx(0.940965, abs=1e-6)
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.025, 10) == pytest.approx(-2.228139, abs=1e-6)
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)


def test_holm_by_hand():
    # Sorted 0.01, 0.03, 0.04: 3·0.01, max(0.03, 2·0.03), max(0.06, 1·0.04); NaN (no test) stays out of the count.
    assert holm_adjusted([0.01, 0.04, 0.03, math.nan])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(holm_adjusted([0.01, 0.04, 0.03, math.nan])[3])
    assert holm_adjusted([0.2]) == [0.2]  # one comparison: nothing to correct
    assert holm_adjusted([0.6, 0.5]) == [1.0, 1.0]  # capped at 1


def test_minimum_detectable_difference_by_hand():
    # 3 seeds: df 4; (t₀.₉₇₅ + t₀.₈) · √(2 (0.0004 + 0.25/500) / 3) = (2.776445 + 0.940965) · 0.024495.
    assert minimum_detectable_difference(0.0004, 0.25, 3, 500) == pytest.approx(3.717410 * math.sqrt(0.0018 / 3))
    # More seeds and questions detect less.
    assert minimum_detectable_difference(0.0004, 0.25, 10, 500) < minimum_detectable_difference(0.0004, 0.25, 3, 500)
    with pytest.raises(ValueError, match="two seeds"):
        minimum_detectable_difference(0.0004, 0.25, 1, 500)

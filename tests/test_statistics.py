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
    seeds_and_questions_interval,
    sign_flip_p_value,
    t_quantile,
    t_two_sided_p_value,
    welch_power,
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


# Seeds and questions crossed, as in the pipeline: every seed answers the same questions, whose logit difficulty is
# N(0, 1.5²) around 50% accuracy (drawn afresh each repetition), and a seed shifts every question's logit by
# N(0, seed_logit_sd²). A logit sd of 0.3 makes seeds' accuracies 5.3 points apart (their sd), 1.0 16 points.
SEEDS_DOMINATE = {"seed_logit_sd": 0.3, "samples": 1}
"""5.3 points between seeds against 500 questions' sampling error of about 1.2 points."""
QUESTIONS_DOMINATE = {"seed_logit_sd": 0.0, "samples": 1}
"""Seeds alike: the seed means differ by their answers' noise only, and which questions were drawn is what varies."""


def seed_accuracy_sd(seed_logit_sd: float) -> float:
    """The sd over seeds of a seed's accuracy on all questions, in the model above: its accuracy is the mean of
    sigmoid(difficulty + shift) over the difficulty, and the sd is over the shift; both means by Gauss–Hermite."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)  # a standard normal's: Σ weights f(nodes) = √(2π) E f
    weights = weights / weights.sum()
    accuracy = (weights[None, :] / (1 + np.exp(-(1.5 * nodes[None, :] + seed_logit_sd * nodes[:, None])))).sum(axis=1)
    mean = weights @ accuracy
    return float(np.sqrt(weights @ (accuracy - mean) ** 2))


def seeds_interval_coverage(interval, seed_logit_sd: float, samples: int, seeds: int = 3, questions: int = 500,
                            repetitions: int = 2000, seed: int = SEED) -> float:  # fmt: skip
    """How often ``interval`` (a seeds × questions table of accuracies → (low, high)) covers the accuracy of the
    setting over all seeds and questions, 0.5 by symmetry in the model above, with ``samples`` answers per seed and
    question."""
    rng = np.random.default_rng(seed)
    logit = rng.normal(0, 1.5, (repetitions, 1, questions)) + rng.normal(0, seed_logit_sd, (repetitions, seeds, 1))
    accuracy = rng.binomial(samples, 1 / (1 + np.exp(-logit))) / samples
    covered = 0
    for table in accuracy:
        low, high = interval(table)
        covered += low <= 0.5 <= high
    return covered / repetitions


def seed_means_t_interval(table: np.ndarray) -> tuple[float, float]:
    """The t-interval on the seed means alone, which leaves out that every seed answered the same questions."""
    means = table.mean(axis=1)
    half = t_quantile(0.975, len(means) - 1) * means.std(ddof=1) / math.sqrt(len(means))
    return means.mean() - half, means.mean() + half


def test_the_seed_spreads_the_simulations_assume():
    # At 50% accuracy, as the integrals give them to 1e-10.
    assert seed_accuracy_sd(0.3) == pytest.approx(0.0525, abs=1e-4)  # 5.3 points between seeds
    assert seed_accuracy_sd(1.0) == pytest.approx(0.1612, abs=1e-4)  # 16 points


def test_the_interval_over_seeds_and_questions_covers_in_both_regimes():
    # 3 seeds of 500 questions, 2000 repetitions: the coverage's standard error is 0.005. Simulation seeds 0–4 gave
    # 0.956–0.970 where seeds dominate and 0.970–0.980 where questions do. The two-level bootstrap (seeds, then the
    # questions) this replaced covered 0.85–0.91 where seeds dominate (0.98 where questions do); the t-interval on
    # the seed means 0.89–0.92 where questions dominate (0.93–0.95 where seeds do).
    for regime in (SEEDS_DOMINATE, QUESTIONS_DOMINATE):
        assert 0.94 <= seeds_interval_coverage(seeds_and_questions_interval, **regime) <= 0.99, regime
    assert seeds_interval_coverage(seed_means_t_interval, **QUESTIONS_DOMINATE) < 0.93  # what the questions' part adds


def test_the_interval_over_seeds_and_questions_by_hand():
    # Seeds alike on 6 questions: no seeds' part; the question means 0.75, 0.5 (four times), 0.25 have variance
    # 2 · 0.25² / 5 = 0.025 and the noise is 0, so the half-width is t₀.₉₇₅(5) · √(0.025 / 6).
    questions = [0.75, 0.5, 0.5, 0.5, 0.5, 0.25]
    half = 2.570582 * math.sqrt(0.025 / 6)
    assert seeds_and_questions_interval([questions, questions]) == pytest.approx((0.5 - half, 0.5 + half))
    # Questions alike, seeds apart (means 0.4 and 0.6, variance 0.02): only the seeds' part, a half-width of
    # t₀.₉₇₅(1) · √(0.02 / 2) = 12.7 · 0.1, beyond [0, 1] on both sides and kept inside it.
    assert seeds_and_questions_interval([[0.4] * 3, [0.6] * 3]) == (0.0, 1.0)
    assert seeds_and_questions_interval([[0.5] * 3] * 2) == (0.5, 0.5)  # nothing varies: the point
    with pytest.raises(ValueError, match=r"seeds × questions table of two seeds and two questions at least"):
        seeds_and_questions_interval([[0.5, 0.5]])


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
    # Many seeds: Welch's test is the normal test, and the difference (z₀.₉₇₅ + z₀.₈) = 2.8016 standard errors of the
    # difference, √(2 (0.0004 + 0.25/500) / 1000).
    assert minimum_detectable_difference(0.0004, 0.25, 1000, 500) == pytest.approx(
        2.8016 * math.sqrt(0.0018 / 1000), rel=1e-3
    )
    # More seeds and questions detect less.
    assert minimum_detectable_difference(0.0004, 0.25, 10, 500) < minimum_detectable_difference(0.0004, 0.25, 3, 500)
    assert minimum_detectable_difference(0.0004, 0.25, 3, 1000) < minimum_detectable_difference(0.0004, 0.25, 3, 500)
    with pytest.raises(ValueError, match="two seeds"):
        minimum_detectable_difference(0.0004, 0.25, 1, 500)


def welch_p_values(ahead: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """:func:`welch_test`'s p-value for each row pair of two (pairs × seeds) arrays, its arithmetic in numpy."""
    share_a, share_b = ahead.var(axis=1, ddof=1) / ahead.shape[1], reference.var(axis=1, ddof=1) / reference.shape[1]
    t = (ahead.mean(axis=1) - reference.mean(axis=1)) / np.sqrt(share_a + share_b)
    df = (share_a + share_b) ** 2 / (share_a**2 / (ahead.shape[1] - 1) + share_b**2 / (reference.shape[1] - 1))
    return np.array([t_two_sided_p_value(float(x), float(d)) for x, d in zip(t, df, strict=True)])


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_welch_test_detects_the_minimum_detectable_difference_80_percent_of_the_time(seeds):
    # Two settings whose seed accuracies are normal with the variance the components give (0.0004 between seeds,
    # 0.25 / 500 from the questions), one ahead by the printed difference: Welch's test at level 0.05, the page's
    # test, must find it 80% of the time. 40,000 pairs: the power's standard error is 0.002; the equal-variance
    # t-test's difference (the one printed before) gave 0.45, 0.69 and 0.77 here.
    rng = np.random.default_rng(SEED + seeds)
    detectable = minimum_detectable_difference(0.0004, 0.25, seeds, 500)
    sd = math.sqrt(0.0004 + 0.25 / 500)
    ahead, reference = rng.normal(detectable, sd, (40_000, seeds)), rng.normal(0.0, sd, (40_000, seeds))
    p_values = welch_p_values(ahead, reference)
    assert p_values[:20] == pytest.approx(
        [welch_test(a, r)["p_value"] for a, r in zip(ahead[:20], reference[:20], strict=True)]
    )
    assert np.mean(p_values < 0.05) == pytest.approx(0.80, abs=0.01)


def test_welch_power_matches_its_size_and_grows_with_the_shift():
    # No shift: the chance of a false finding, as test_welch_test_holds_its_size_with_three_seeds measures it.
    assert 0.03 <= welch_power(0.0, 3) <= 0.04
    powers = [welch_power(shift, 3) for shift in (0.0, 1.0, 2.0, 4.0, 8.0)]
    assert powers == sorted(powers) and powers[-1] > 0.99
    assert welch_power(3.0, 3) < welch_power(3.0, 5) < welch_power(3.0, 50)  # more seeds: variances better known
    with pytest.raises(ValueError, match="two seeds"):
        welch_power(1.0, 1)

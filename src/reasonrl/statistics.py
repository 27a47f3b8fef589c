"""Accuracy intervals and the paired test, with one or several samples per question.

Samples of one question are not independent: a question the model finds hard is answered wrongly by most of its
samples. Treating ``k`` samples of each of ``n`` questions as ``n·k`` independent answers makes intervals too narrow
and paired p-values too small. Here the question is the unit: the accuracy's uncertainty comes from the spread of the
per-question accuracies, and the paired test flips the sign of whole per-question differences. With one sample per
question both reduce to their textbook forms: the Wilson interval over the answers and McNemar's exact test.

Several seeds of a setting (``python -m reasonrl.seeds``) add a second level: the interval of the mean over seeds,
the test between settings on seed means, Holm's correction for several settings and the minimum detectable
difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z_95 = 1.959963984540054  # two-sided 95% normal quantile

INTERVAL_WILSON = "wilson"
"""One sample per question: the Wilson score interval over the answers."""
INTERVAL_CLUSTERED = "wilson_clustered_by_question"
"""Several: the Wilson score interval with the effective sample size of :func:`effective_sample_size`."""
TEST_MCNEMAR = "mcnemar_exact"
"""One sample per question: McNemar's exact test (the sign test on the discordant pairs)."""
TEST_SIGN_FLIP = "sign_flip_exact_by_question"
"""Several: :func:`sign_flip_p_value` over the per-question differences in right answers."""


def wilson_interval(proportion: float, n: float, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a proportion observed on ``n`` (possibly effective, fractional) independent
    trials; unlike p ± z·s.e. it stays inside [0, 1] and informative at p = 0 or 1."""
    if n <= 0:
        return (math.nan, math.nan)
    p = proportion
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def effective_sample_size(correct: Sequence[int], samples: Sequence[int]) -> float:
    """How many independent answers the pooled accuracy of these questions is worth: ``p(1 − p) / v`` with ``v`` the
    cluster-robust (sandwich) variance of the pooled accuracy ``p``, ``Σ (correct_i − p·samples_i)² / n²`` over
    questions ``i``, ``n`` the number of answers. ``correct[i]`` of ``samples[i]`` answers to question ``i`` are right.

    With one sample per question it is ``n`` (the formula's value, returned exactly). With ``k`` samples of every
    question it lies between the number of questions (each question all right or all wrong: its samples agree) and
    ``n`` (samples as good as independent; a smaller spread than independence gives is chance, so ``n`` caps it).
    When every answer is right or every one wrong nothing measures how much samples agree: the number of questions,
    the cautious end."""
    if len(correct) != len(samples) or not samples or min(samples) < 1:
        raise ValueError(
            f"effective_sample_size: correct and samples must list the same questions (got {len(correct)} and "
            f"{len(samples)}), each with one or more samples"
        )
    n = sum(samples)
    if max(samples) == 1:
        return float(n)
    p = sum(correct) / n
    if p in (0.0, 1.0):
        return float(len(samples))
    spread = sum((c - p * m) ** 2 for c, m in zip(correct, samples, strict=True))
    return float(n) if spread == 0 else min(float(n), p * (1 - p) * n * n / spread)


def sign_flip_p_value(differences: Sequence[int]) -> float:
    """Two-sided exact sign-flip (Fisher randomisation) test of "no difference" on integer per-question differences
    (e.g. right answers of one model minus the other's): under the null each question's difference is as likely
    negative as positive, so all ``2^m`` sign patterns of the ``m`` non-zero differences are equally likely. The
    p-value is the share of patterns whose total is at least as far from 0 as the observed one, counted exactly.

    With differences of ±1 only (one sample per question) it is McNemar's exact test, to the last bit."""
    magnitudes = [abs(d) for d in differences if d != 0]
    total = sum(magnitudes)
    positive = sum(d for d in differences if d > 0)
    # A pattern's sum is 2·(its positive part) − total, and the positive part is symmetric about total / 2: the
    # two-sided p-value is twice the lower tail of the positive part, or 1 when the observed sum is 0.
    lower = min(positive, total - positive)
    if 2 * lower == total:
        return 1.0
    # ways[s]: sign patterns (so far) whose positive part is s, for s ≤ lower; each magnitude multiplies the
    # generating polynomial by (1 + x^magnitude). Integers, so the result is exact until the final division.
    ways = [1] + [0] * lower
    for magnitude in magnitudes:
        if magnitude <= lower:
            ways[magnitude:] = [a + b for a, b in zip(ways[magnitude:], ways, strict=False)]
    return 2 * sum(ways) / 2 ** len(magnitudes)


# Several seeds of a setting. A training run's accuracy varies with its seed as well as with the test questions
# drawn, and every seed of every setting answers the same test questions: seeds and questions are crossed, not
# nested. Seeds are the independent replicates of a setting; the questions are a shared sample of all the questions
# the accuracy is meant to describe.


def two_level_bootstrap_interval(
    accuracy: Sequence[Sequence[float]], resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of a setting's mean accuracy over its seeds that accounts for both seeds and questions:
    each resample draws the seeds with replacement, then the questions with replacement, and averages the drawn
    seeds' accuracies on the drawn questions. ``accuracy[s][q]`` is seed ``s``'s accuracy on question ``q`` (the
    share of its samples right); every seed answered the same questions, so one draw of questions serves every seed
    of a resample (resampling them separately per seed would average the questions' difficulty away, as if each
    seed had its own test set).

    With few seeds the seed level is coarse: 3 seeds have 10 distinct resamples, and their spread is (S − 1) / S of
    the seed means' variance. The interval is then too narrow when seeds vary more than questions do (the coverage
    simulation in tests/test_statistics.py measures how much); the Welch test on seed means
    (:func:`welch_test`) accounts for few seeds through its t distribution."""
    table = np.asarray(accuracy, dtype=float)
    if table.ndim != 2 or min(table.shape) < 1:
        raise ValueError(f"two_level_bootstrap_interval: need seeds × questions accuracies, got shape {table.shape}")
    seeds, questions = table.shape
    rng = np.random.default_rng(seed)
    drawn_questions = rng.integers(0, questions, size=(resamples, questions))
    drawn_seeds = rng.integers(0, seeds, size=(resamples, seeds))
    seed_means = table[:, drawn_questions].mean(axis=2)  # seeds × resamples: each seed on each draw of questions
    means = np.take_along_axis(seed_means.T, drawn_seeds, axis=1).mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def seed_variance_components(accuracy: Sequence[Sequence[float]]) -> tuple[float, float]:
    """``(between, within)``: the variance of the true accuracy from seed to seed, and the variance of a
    per-question accuracy around its seed's and its question's means (the seed × question interaction with the
    sampling noise), from a seeds × questions table of accuracies on the same questions (two-way ANOVA by the
    method of moments). A seed's mean accuracy then varies with variance ``between + within / questions``; the
    questions' own difficulty is shared by every seed and cancels from a difference between settings. ``between``
    is estimated as the seed means' variance less ``within / questions``, and is 0 where that is negative."""
    table = np.asarray(accuracy, dtype=float)
    seeds, questions = table.shape
    if seeds < 2 or questions < 2:
        raise ValueError(f"seed_variance_components: need two seeds and two questions at least, got {table.shape}")
    seed_means, question_means = table.mean(axis=1), table.mean(axis=0)
    residuals = table - seed_means[:, None] - question_means[None, :] + table.mean()
    within = float((residuals**2).sum() / ((seeds - 1) * (questions - 1)))
    between = max(0.0, float(seed_means.var(ddof=1)) - within / questions)
    return between, within


def _regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) by its continued fraction (modified Lentz), on the side of x where it converges fast."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _regularized_incomplete_beta(1.0 - x, b, a)
    front = math.exp(a * math.log(x) + b * math.log1p(-x) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * fraction


def t_two_sided_p_value(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` (possibly fractional) degrees of freedom."""
    return _regularized_incomplete_beta(df / (df + t * t), df / 2, 0.5)


def t_quantile(probability: float, df: float) -> float:
    """The ``probability`` quantile of Student's t with ``df`` degrees of freedom (bisection on the p-value)."""
    if not 0 < probability < 1:
        raise ValueError(f"t_quantile: probability must lie in (0, 1), got {probability}")
    if probability < 0.5:
        return -t_quantile(1 - probability, df)
    target = 2 * (1 - probability)  # the two-sided p-value at the quantile
    low, high = 0.0, 1.0
    while t_two_sided_p_value(high, df) > target:
        low, high = high, 2 * high
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if t_two_sided_p_value(middle, df) > target else (low, middle)
    return (low + high) / 2


def welch_test(this: Sequence[float], reference: Sequence[float]) -> dict[str, float]:
    """Welch's t-test of "equal mean accuracy" on two settings' seed accuracies (one number per seed): the seeds are
    the independent replicates of a setting, each seed's accuracy already carries its questions' noise, and the t
    distribution (Welch–Satterthwaite degrees of freedom) accounts for having few seeds, where a bootstrap or
    permutation test cannot (3 seeds against 3 have 20 distinct splits: no p-value below 0.1). ``difference`` is
    this minus reference; ``p_value`` is NaN where neither setting's seeds differ (nothing measures the noise)."""
    if len(this) < 2 or len(reference) < 2:
        raise ValueError(f"welch_test: need two seeds per setting at least, got {len(this)} and {len(reference)}")
    a, b = np.asarray(this, dtype=float), np.asarray(reference, dtype=float)
    share_a, share_b = float(a.var(ddof=1)) / len(a), float(b.var(ddof=1)) / len(b)
    difference = float(a.mean() - b.mean())
    stderr = math.sqrt(share_a + share_b)
    if a.min() == a.max() and b.min() == b.max():  # exactly: a mean of equal floats can differ from them
        return {"difference": difference, "t": math.nan, "df": math.nan, "p_value": math.nan}
    df = float((share_a + share_b) ** 2 / (share_a**2 / (len(a) - 1) + share_b**2 / (len(b) - 1)))
    t = difference / stderr
    return {"difference": difference, "t": t, "df": df, "p_value": t_two_sided_p_value(t, df)}


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (in their order): the i-th smallest becomes
    max over j ≤ i of (m − j + 1)·p_(j), capped at 1. Rejecting where the adjusted value is below alpha keeps the
    chance of any false rejection in the family at most alpha. NaN stays NaN and does not count in ``m``."""
    order = sorted((i for i, p in enumerate(p_values) if not math.isnan(p)), key=lambda i: p_values[i])
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def minimum_detectable_difference(
    between: float, within: float, seeds: int, questions: int, alpha: float = 0.05, power: float = 0.8
) -> float:
    """The smallest true difference in mean accuracy between two settings, each run with ``seeds`` seeds on the same
    ``questions`` questions, that a two-sided t-test on seed means at level ``alpha`` detects with probability
    ``power``: (t_{1−α/2} + t_{power}) · √(2 (between + within / questions) / seeds), with 2 (seeds − 1) degrees of
    freedom and the variance components of :func:`seed_variance_components`."""
    if seeds < 2:
        raise ValueError(f"minimum_detectable_difference: need two seeds at least, got {seeds}")
    df = 2 * (seeds - 1)
    stderr = math.sqrt(2 * (between + within / questions) / seeds)
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * stderr

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

import functools
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


def _seeds_by_questions(accuracy: Sequence[Sequence[float]], caller: str) -> np.ndarray:
    table = np.asarray(accuracy, dtype=float)
    if table.ndim != 2 or min(table.shape) < 2:
        raise ValueError(f"{caller}: need a seeds × questions table of two seeds and two questions at least, got shape "
                         f"{table.shape}")  # fmt: skip
    return table


def _interaction_variance(table: np.ndarray) -> float:
    """The variance of a per-question accuracy around its seed's and its question's means (two-way ANOVA's residual
    mean square): the seed × question interaction with the sampling noise."""
    seeds, questions = table.shape
    residuals = table - table.mean(axis=1, keepdims=True) - table.mean(axis=0, keepdims=True) + table.mean()
    return float((residuals**2).sum() / ((seeds - 1) * (questions - 1)))


def seeds_and_questions_interval(accuracy: Sequence[Sequence[float]], level: float = 0.95) -> tuple[float, float]:
    """Interval of a setting's mean accuracy over seeds and questions: what the mean over many seeds on all the
    questions the test set samples would be. ``accuracy[s][q]`` is seed ``s``'s accuracy on question ``q`` (the share
    of its samples right), every seed on the same questions. With S seeds and Q questions it is the mean ±
    √(t²_{S−1} · v_seeds + t²_{Q−1} · v_questions), within [0, 1]:

    - ``v_seeds``, the seed means' variance / S, is the seeds' part: seed-to-seed variance and the seed × question
      noise. Estimated from S seeds, it takes the t quantile with S − 1 degrees of freedom (4.30 for 3 seeds).
    - ``v_questions``, (the question means' variance − that noise / S) / Q, is the questions' part: how much easier
      or harder these questions are than all of them. Every seed answers them, so the seed means' spread cannot
      show it; 0 where the noise explains the question means' spread.

    Each regime then gets the interval it needs: where seeds differ most it is the t-interval on the seed means
    (a two-level bootstrap, whose 3 seeds have 10 distinct draws, is too narrow there), where the choice of
    questions dominates it adds what that t-interval lacks. Simulated coverage with 3 seeds of 500 questions
    (tests/test_statistics.py): 0.95–0.97 where seeds dominate, 0.97–0.98 where questions do; 0.93–0.99 from 2 to
    10 seeds, 20 to 500 questions and seeds up to 16 points apart. A little wide where the two parts are alike,
    since each part keeps its own quantile."""
    table = _seeds_by_questions(accuracy, "seeds_and_questions_interval")
    seeds, questions = table.shape
    noise = _interaction_variance(table)
    seeds_part = float(table.mean(axis=1).var(ddof=1)) / seeds
    questions_part = max(0.0, float(table.mean(axis=0).var(ddof=1)) - noise / seeds) / questions
    tail = 1 - (1 - level) / 2
    half = math.sqrt(
        t_quantile(tail, seeds - 1) ** 2 * seeds_part + t_quantile(tail, questions - 1) ** 2 * questions_part
    )
    mean = float(table.mean())
    return max(0.0, mean - half), min(1.0, mean + half)


def seed_variance_components(accuracy: Sequence[Sequence[float]]) -> tuple[float, float]:
    """``(between, within)``: the variance of the true accuracy from seed to seed, and the variance of a
    per-question accuracy around its seed's and its question's means (the seed × question interaction with the
    sampling noise), from a seeds × questions table of accuracies on the same questions (two-way ANOVA by the
    method of moments). A seed's mean accuracy then varies with variance ``between + within / questions``; the
    questions' own difficulty is shared by every seed and cancels from a difference between settings. ``between``
    is estimated as the seed means' variance less ``within / questions``, and is 0 where that is negative."""
    table = _seeds_by_questions(accuracy, "seed_variance_components")
    within = _interaction_variance(table)
    between = max(0.0, float(table.mean(axis=1).var(ddof=1)) - within / table.shape[1])
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


@functools.cache
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


# Welch's power with equal variances. With ``n`` seeds a setting and seed accuracies normal with variance σ² in both
# settings, Welch's statistic is (Z + shift) / √(W / ν): Z standard normal, ``shift`` the true difference in standard
# errors √(2σ²/n), W ~ χ²_ν (ν = 2(n − 1)) the two sample variances' sum in units of σ²/(n − 1). Its degrees of
# freedom, (n − 1) / (u² + (1 − u)²), depend only on u, the first sample variance's share of that sum:
# u ~ Beta((n − 1)/2, (n − 1)/2), independent of W. The power is the mean over u and W of
# Φ(shift − c(u)·√(W/ν)) + Φ(−shift − c(u)·√(W/ν)), c(u) the t quantile at u's degrees of freedom: a
# two-dimensional integral, taken by Gauss–Legendre quadrature over θ with u = sin²θ (which removes the Beta
# density's poles at 2 seeds) and over r = √(W/2), whose density ∝ r^(2n − 3)·e^(−r²) is smooth.
_SHARE_NODES, _SIZE_NODES = 24, 96  # λ to 1e-5 relative for 2 to 300 seeds (against 48 and 128 nodes)


@functools.cache
def _welch_quadrature(seeds: int, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(share weights, critical t at each share, size weights, √(W/ν) at each size) for :func:`welch_power`."""
    m = seeds - 1
    x, w = np.polynomial.legendre.leggauss(_SHARE_NODES)
    theta = math.pi / 4 * (x + 1)
    u = np.sin(theta) ** 2
    share_weights = w * (np.sin(theta) * np.cos(theta)) ** (m - 1)  # the Beta density in θ, up to a constant
    # u and 1 − u have the same degrees of freedom, and the nodes are symmetric about θ = π/4: half the quantiles.
    df = m / (u**2 + (1 - u) ** 2)
    half = [t_quantile(1 - alpha / 2, float(d)) for d in df[: _SHARE_NODES // 2]]
    critical = np.array(half + half[::-1])
    x, w = np.polynomial.legendre.leggauss(_SIZE_NODES)
    low, high = max(0.0, math.sqrt(m) - 8), math.sqrt(m) + 8  # r is about normal(√m, 1/2) for many seeds
    r = low + (high - low) * (x + 1) / 2
    log_density = (2 * m - 1) * np.log(r) - r * r
    size_weights = w * np.exp(log_density - log_density.max())
    return share_weights / share_weights.sum(), critical, size_weights / size_weights.sum(), r / math.sqrt(m)


_normal_tail = np.frompyfunc(math.erfc, 1, 1)


def welch_power(shift: float, seeds: int, alpha: float = 0.05) -> float:
    """The chance that :func:`welch_test` at level ``alpha`` finds a difference between two settings of ``seeds``
    seeds each whose seed accuracies are normal with the same variance σ² and whose means differ by ``shift``
    standard errors of the difference of means (a difference δ is ``shift = δ / √(2σ² / seeds)``). Exact up to the
    quadrature's 1e-5 (the comment above says how); Welch's test estimates both variances and so has less power than
    the equal-variance t-test at the same shift, much less with few seeds.

    >>> round(welch_power(0.0, seeds=3), 3)  # no difference: the test's size, a little below its level
    0.035
    """
    if seeds < 2:
        raise ValueError(f"welch_power: need two seeds at least, got {seeds}")
    share_weights, critical, size_weights, scale = _welch_quadrature(seeds, alpha)
    bound = critical[:, None] * scale[None, :]
    tails = _normal_tail((bound - shift) / math.sqrt(2)) + _normal_tail((bound + shift) / math.sqrt(2))
    return float(share_weights @ (tails.astype(float) / 2) @ size_weights)


@functools.cache
def _welch_detectable_shift(seeds: int, alpha: float, power: float) -> float:
    """The shift (in standard errors) at which :func:`welch_power` is ``power``, by bisection (it grows with it)."""
    low, high = 0.0, 4.0
    while welch_power(high, seeds, alpha) < power:
        low, high = high, 2 * high
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if welch_power(middle, seeds, alpha) < power else (low, middle)
    return (low + high) / 2


def minimum_detectable_difference(
    between: float, within: float, seeds: int, questions: int, alpha: float = 0.05, power: float = 0.8
) -> float:
    """The smallest true difference in mean accuracy between two settings, each run with ``seeds`` seeds on the same
    ``questions`` questions, that Welch's test on seed means (:func:`welch_test`) at level ``alpha`` detects with
    probability ``power``: the shift at which :func:`welch_power` reaches ``power``, times the standard error
    √(2 (between + within / questions) / seeds) of the difference, with the variance components of
    :func:`seed_variance_components` (both settings as variable). With 2 seeds it is about 10.4 standard errors, with
    3 about 4.3, with 5 about 3.3, tending to 2.8 (the normal's 1.96 + 0.84) with many."""
    if seeds < 2:
        raise ValueError(f"minimum_detectable_difference: need two seeds at least, got {seeds}")
    stderr = math.sqrt(2 * (between + within / questions) / seeds)
    return _welch_detectable_shift(seeds, alpha, power) * stderr

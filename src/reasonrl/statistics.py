"""Accuracy intervals and the paired test, with one or several samples per question.

Samples of one question are not independent: a question the model finds hard is answered wrongly by most of its
samples. Treating ``k`` samples of each of ``n`` questions as ``n·k`` independent answers makes intervals too narrow
and paired p-values too small. Here the question is the unit: the accuracy's uncertainty comes from the spread of the
per-question accuracies, and the paired test flips the sign of whole per-question differences. With one sample per
question both reduce to their textbook forms: the Wilson interval over the answers and McNemar's exact test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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

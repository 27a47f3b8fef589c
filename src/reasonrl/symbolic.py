"""Symbolic answers: ground truths written in LaTeX (``\\frac{\\pi}{2}``, ``\\left( 3, \\frac{\\pi}{2} \\right)``)
graded with Hugging Face's math-verify (its ``parse`` and ``verify``), each response within a time bound.

math-verify reads LaTeX and plain expressions into sympy and compares them symbolically, so ``\\frac{1}{2}``, ``0.5``
and ``1/2`` agree, as do ``(3, \\pi/2)`` and ``\\left( 3, \\frac{\\pi}{2} \\right)``. The exact rational grader
(:mod:`reasonrl.grading`) stays the one for numeric answers; this one is for answers no single number can state.

Model text is untrusted, and sympy can be kept busy for minutes by it (``9^{9^{9^{9}}}``). Every verdict here runs
under a time bound, :data:`GRADING_SECONDS` of the process's CPU time, kept by a SIGPROF timer: a response that runs
past it is wrong, and counted (:func:`timeouts`). CPU time rather than wall clock, so that a loaded machine (a legit
answer took 2 s of wall clock for 0.3 s of CPU on a shared 2-core machine) does not misgrade; every stage grades
while its engine is idle, so the process's CPU time is the grader's. math-verify's own timeouts are off: they count
whole wall-clock seconds per step (a response takes several), and set a SIGALRM timer of their own. A signal reaches
the main thread only, which is where every stage grades; anywhere else :func:`verdict` refuses to run.

math-verify and sympy load in seconds, so they are imported on first use: a run that grades no LaTeX never loads
them.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from reasonrl.grading import ANSWER_DELIMITER

GRADING_SECONDS = 3.0
"""The CPU-time bound of one verdict: reading the response's answer and comparing it with the ground truth (whose own
parse, cached, is bounded alike). A MATH answer takes some 20-50 ms, 0.3 s when sympy first meets a kind of
expression."""
LATEX_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")
_timeouts = 0


class GradingTimeout(BaseException):
    """The timer ran out inside math-verify. A BaseException, so that no ``except Exception`` in math-verify or
    sympy (they have many) swallows it and keeps computing."""


@dataclass(frozen=True)
class Verdict:
    correct: bool
    timed_out: bool = False
    """The bound ran out: the answer is then wrong."""


def timeouts() -> int:
    """How many verdicts of this process ran out of time so far: a caller counts its own by the difference."""
    return _timeouts


class _NoTimeoutWarning(logging.Filter):
    """Drops math-verify's warning that its timeouts are off: they are, because :func:`time_bound` keeps time."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _math_verify() -> tuple[Callable, Callable, tuple]:
    """math-verify's ``parse``, ``verify`` and the extraction configs (LaTeX, then plain expressions), imported and
    warmed up once: the first parse builds its grammar, seconds on a busy machine, which no response's bound should
    pay for."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_NoTimeoutWarning())
    configs = (LatexExtractionConfig(), ExprExtractionConfig())
    parse("$\\frac{1}{2}$", extraction_config=configs, parsing_timeout=None)
    return parse, verify, configs


@contextmanager
def time_bound(seconds: float) -> Iterator[None]:
    """Raise :class:`GradingTimeout` inside the block once the process has spent ``seconds`` of CPU time in it."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("symbolic grading keeps its time bound with SIGPROF, which only the main thread receives")

    def expire(signum: int, frame: object) -> None:
        raise GradingTimeout

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _parsed(text: str) -> list:
    """math-verify's readings of ``text`` as sympy objects (no fallback strings); [] when it finds none."""
    parse, _, configs = _math_verify()
    return parse(text, extraction_config=configs, fallback_mode="no_fallback", parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str) -> tuple:
    """A ground truth's readings: the bare answer boxed (surrounding ``$`` dropped), so that it is read whole (bare,
    ``\\left( 3, \\frac{\\pi}{2} \\right)`` reads as 3); a whole solution is read at its last ``\\boxed{}``, a
    whole GSM8K answer field at its final answer. Cached: a question's truth is compared with each of its answers."""
    text = gold.rpartition(ANSWER_DELIMITER)[2].strip()
    if "\\boxed" not in text:
        text = f"\\boxed{{{text.strip('$').strip()}}}"
    return tuple(_parsed(text))


def parse_answer(answer: str) -> list:
    """A response's answer text read as written and, when it has no LaTeX delimiters, also as one LaTeX formula
    (bare ``(3, \\frac{\\pi}{2})`` reads whole only so, ``18 dollars`` only as written): a verdict takes either."""
    readings = _parsed(answer)
    if not any(delimiter in answer for delimiter in LATEX_DELIMITERS):
        readings += _parsed(f"${answer}$")
    return readings


def gold_parses(gold: str, seconds: float | None = None) -> bool:
    """Whether math-verify reads ``gold`` as a formula within ``seconds`` (None: :data:`GRADING_SECONDS`): a ground
    truth that it cannot read, no response could match."""
    try:
        with time_bound(seconds or GRADING_SECONDS):
            return bool(parse_gold(gold))
    except GradingTimeout:
        return False


def verdict(answer: str | None, gold: str, seconds: float | None = None) -> Verdict:
    """Whether ``answer`` (the text a prompt's extraction read from a response; None: it found none) states
    ``gold``, by math-verify: the answer read and compared within ``seconds`` (None: :data:`GRADING_SECONDS`; the
    gold's parse, cached, has a bound of its own); a timeout is wrong and counted (:func:`timeouts`)."""
    global _timeouts
    if answer is None or not answer.strip():
        return Verdict(False)
    _, verify, _ = _math_verify()
    seconds = seconds or GRADING_SECONDS
    try:
        with time_bound(seconds):
            golds = list(parse_gold(gold))
        with time_bound(seconds):
            return Verdict(verify(golds, parse_answer(answer), timeout_seconds=None))
    except GradingTimeout:
        _timeouts += 1
        return Verdict(False, timed_out=True)

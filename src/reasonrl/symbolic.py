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

A formula is read whole or not at all: math-verify, left to itself, tries each candidate a text holds, the whole
formula first and then pieces of it, and keeps the first that parses, so a gold answer it cannot read whole would be
read as a piece of it (``\\max at x=2, min at x=4`` as 4, ``\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}`` as 2/3). A
ground truth is read in its first-match mode, which stops at the whole formula (:func:`read_whole`), after writing it
the way math-verify reads a formula (:func:`as_formula`: ``62.5\\%`` as ``62.5``); an answer is read that way too,
then as written (:func:`answer_readings`), so that the gold itself, given as the answer, is right.

math-verify and sympy load in seconds, so they are imported on first use: a run that grades no LaTeX never loads
them.
"""

from __future__ import annotations

import functools
import logging
import re
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


# "62.5\%", "8 \%": math-verify drops a percent sign inside $...$ but reads nothing of a box that holds one.
_PERCENT = re.compile(r"\\?%")
# "-1./3": a numeral's point right before a fraction's slash.
_POINT_BEFORE_SLASH = re.compile(r"(?<=[0-9])\.(?=/)")
_LEADING_APPROX = re.compile(r"\\approx(?![A-Za-z])")
# A word of prose ("No", "solution"): two letters or more, not a command's name ("\\sqrt") nor a braced argument
# ("{array}", "{min}").
_WORD = re.compile(r"(?<![\\{A-Za-z])[A-Za-z]{2,}+(?!})")


def as_formula(text: str) -> str:
    """``text`` as math-verify reads a formula whole: a percent sign dropped (``62.5\\%`` → ``62.5``, as math-verify
    itself drops it inside ``$…$``), a numeral's point before a slash too (``-1./3`` → ``-1/3``), a closing full stop
    (``\\sqrt{27}.``, ``.273.``; not an ellipsis, nor a sentence's: "There is no solution." stays prose, which
    math-verify would read as the product of its letters) and a leading ``\\approx`` (``\\approx 17.10``)."""
    text = _POINT_BEFORE_SLASH.sub("", _PERCENT.sub("", text)).strip()
    if text.endswith(".") and not text.endswith("..") and not _WORD.search(text):
        text = text[:-1].rstrip()
    approx = _LEADING_APPROX.match(text)
    return text[approx.end() :].strip() if approx else text


def _parsed(text: str, extraction_mode: str = "any_match") -> list:
    """math-verify's readings of ``text`` as sympy objects (no fallback strings); [] when it finds none.
    ``extraction_mode``: math-verify's; ``first_match`` stops at the first candidate, parsed or not."""
    parse, _, configs = _math_verify()
    modes = {"fallback_mode": "no_fallback", "extraction_mode": extraction_mode}
    return parse(text, extraction_config=configs, parsing_timeout=None, **modes)


def read_whole(text: str) -> list:
    """``text`` read as one formula (:func:`as_formula`, then boxed, surrounding ``$`` dropped) or not at all: []
    when math-verify cannot read all of it, where its default mode would read a piece of it. A text that holds a
    ``\\boxed{}`` already (a whole solution) is read at its last one."""
    if "\\boxed" in text:
        return _parsed(as_formula(text), extraction_mode="first_match")
    return _parsed(f"\\boxed{{{as_formula(text.strip().strip('$'))}}}", extraction_mode="first_match")


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str) -> tuple:
    """A ground truth's reading (:func:`read_whole`), bare (``\\left( 3, \\frac{\\pi}{2} \\right)`` read bare
    reads as 3) or a whole solution; a whole GSM8K answer field at its final answer. Cached: a question's truth is
    compared with each of its answers."""
    return tuple(read_whole(gold.rpartition(ANSWER_DELIMITER)[2].strip()))


def answer_readings(answer: str) -> Iterator[list]:
    """A response's answer text read whole, as a ground truth is (:func:`read_whole`: bare ``(3, \\frac{\\pi}{2})``
    reads whole only so, and a ground truth given as the answer reads as itself), then as written, where math-verify
    finds the answer among other text (``18 dollars``, ``So it is $\\frac{1}{2}$``): a verdict takes either. Lazily:
    a verdict that the first settles never spends time on the second."""
    yield read_whole(answer)
    yield _parsed(answer)


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
            readings = answer_readings(answer)
            return Verdict(any(verify(golds, reading, timeout_seconds=None) for reading in readings if reading))
    except GradingTimeout:
        _timeouts += 1
        return Verdict(False, timed_out=True)

"""Reward functions: grade a model's GSM8K answer against the ground truth.

Two prompt styles, two reward functions, both ``(response, ground_truth) -> {"format_reward", "answer_reward",
"reward"}`` with values 0.0 or 1.0:

* :func:`r1_zero_reward_fn` for the R1-Zero prompt, which ends with ``Assistant: <think>``; the response is
  ``"… reasoning … </think> <answer> 18 </answer>"``.
* :func:`question_only_reward_fn` for the bare question; the answer is the last ``\\boxed{…}``, else the last number.

Answers are compared as exact rationals (:class:`fractions.Fraction`) after normalisation, so ``$1,000.00``,
``1000``, ``\\frac{2000}{2}`` and ``\\frac{2000}2`` agree, and ``0.1 + 0.2``-style float noise cannot creep in. A
ground truth written as a decimal of :data:`ROUNDED_GOLD_PLACES` places or more is taken as rounded, and an exact
fraction that rounds to it is right too (:func:`rounds_to`): ``2/3`` against ``0.6666666667``.

Model output is untrusted: nothing here evaluates it (no ``eval``, no sympy), and every regular expression runs in
linear time, so a 100 kB adversarial response is scored in a few milliseconds. A reward function never raises:
an error inside, or an argument that is not a ``str``, scores all zeros.
"""

from __future__ import annotations

import re
from fractions import Fraction

ANSWER_DELIMITER = "####"
"""GSM8K's answer field ends with ``#### N``, the final answer."""
# GSM8K writes thousands as "1,000"; a comma elsewhere (a list "3, 4") is not a separator.
_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")

THINK_END = "</think>"
ANSWER_START = "<answer>"
ANSWER_END = "</answer>"
BOXED_START = "\\boxed{"

# Python's int() refuses more than 4300 digits, and no GSM8K answer comes near 200 characters: a longer run of
# number characters is not a number at all, which also bounds the cost of converting it.
MAX_NUMERAL_CHARS = 200
# An answer that mentions more numbers than this is working, not a final answer; the cap also bounds the work on a
# 100 kB answer made of "1 1 1 1 …".
MAX_ANSWER_NUMBERS = 64
# Legitimate boxed answers hold a few braces; the cap bounds the scan of "\boxed{{{{{…".
MAX_BOXED_BRACES = 256
# How far before the last number a fraction's command can stand and that number still be one of its arguments
# (two of 40 characters, braces and spaces).
FRACTION_REACH = 100

# A maximal run of characters that can belong to a numeral ("−" is U+2212, the typographic minus). One character
# class: linear. Written "[…][…]*" rather than "[…]+" because a leading class lets the regex engine skip other text
# twice as fast.
_NUMBER_RUN = re.compile("[-,./0-9\u2212][-,./0-9\u2212]*")
_NUMBER_RUN_OR_EMPTY = re.compile("[-,./0-9\u2212]*")
_DIGIT = re.compile(r"[0-9]")
# A minus right after a digit is a range or a subtraction ("18-20", "3-4"): two numbers, not one negative number.
_INFIX_MINUS = re.compile(r"(?<=[0-9.])-")
# One numeral: optional sign, a decimal (".5", "18", "18.0"), optionally "/" and a second decimal. Possessive
# quantifiers, no nesting that can backtrack.
_DECIMAL = r"(?:[0-9]++(?:\.[0-9]++)?+|\.[0-9]++)"
_NUMERAL = re.compile(rf"(?P<sign>-?)(?P<numerator>{_DECIMAL})(?:/(?P<denominator>{_DECIMAL}))?+")
# \frac{1}{2}, \dfrac{1}{2}, \tfrac12, \frac 1 2, \frac1{2}, \cfrac{1}{2}: TeX takes each argument as a braced group
# or a single character, skipping spaces before it. Each part is short and brace-free, so nested fractions are not
# read; a fraction left unread makes the whole text unreadable (_UNREAD_FRACTION), never a bare number.
_FRAC_ARGUMENT = r"\s*+(?:\{\s*+([^{}\s\\]{1,40}+)\s*+\}|([^{}\s\\]))"
_LATEX_FRAC = re.compile(rf"\\[dtc]?frac{_FRAC_ARGUMENT}{_FRAC_ARGUMENT}")
_UNREAD_FRACTION = re.compile(r"\\(?:[dtc]?frac|over)(?![A-Za-z])")
# A root, a power or a product states a value other than its numbers: \sqrt{4} is 2, 3^3 is 27, 3 \times 3 is 9, yet
# every number in each is the same one, which single_number would take for the answer.
_OPERATION = re.compile(r"\\(?:sqrt|times|cdot|div|pm|mp)(?![A-Za-z])|\^")
# A ground truth that is one plain decimal: its digits after the point are its stated precision.
_PLAIN_DECIMAL = re.compile("[-\u2212]?[0-9,]*+\\.([0-9]++)")
_BRACE = re.compile(r"[{}]")
ROUNDED_GOLD_PLACES = 5
"""A ground truth written with this many decimal places or more is a rounded value (a repeating decimal cut by a
program, MAWPS's ``0.6666666667``): no exact answer in GSM8K, SVAMP, ASDiv, MAWPS, AIME 2024 or AMC 2023 has more
than 3 places, their rounded ones have 5 (``3.33333``) or 10. Fewer places are exact: ``0.5`` is one half, and
``0.46`` is wrong against it."""


# ---------------------------------------------------------------------------------------------------------------
# Numbers


def strip_thousands_separators(text: str) -> str:
    """``"1,234,567"`` → ``"1234567"``; commas that do not separate thousands are kept."""
    return _THOUSANDS_SEPARATOR.sub("", text)


def split_answer(answer_field: str, strip_separators: bool = True) -> tuple[str, str]:
    """Split a GSM8K answer field into (reasoning, final answer).

    The final answer is the text after the last ``####``, stripped, thousands separators removed unless
    ``strip_separators`` is false (a LaTeX answer: the comma of ``(1,234)`` separates a pair).
    Raises ``ValueError`` when there is no ``####`` or nothing after it.
    """
    reasoning, delimiter, final = answer_field.rpartition(ANSWER_DELIMITER)
    if not delimiter:
        raise ValueError(f"no '{ANSWER_DELIMITER}' before the final answer")
    final = final.strip()
    if strip_separators:
        final = strip_thousands_separators(final)
    if not final:
        raise ValueError(f"nothing after '{ANSWER_DELIMITER}'")
    return reasoning.strip(), final


def parse_number(numeral: str) -> Fraction | None:
    """The exact value of one numeral, or ``None`` when ``numeral`` is not exactly one number.

    Accepts ``"18"``, ``"-3"``, ``"−3"`` (U+2212), ``"1,000"``, ``"18.0"``, ``".50"``, ``"1/2"``, ``"18."``
    (a sentence's full stop). Rejects ``"1.2.3"``, ``"1/2/3"``, ``"1/0"``, ``""``, words, and anything longer than
    :data:`MAX_NUMERAL_CHARS` characters.
    """
    if len(numeral) > MAX_NUMERAL_CHARS:
        return None
    text = strip_thousands_separators(numeral.strip().replace("\u2212", "-")).rstrip(".")
    match = _NUMERAL.fullmatch(text)
    if match is None:
        return None
    value = Fraction(match["numerator"])
    if match["denominator"] is not None:
        denominator = Fraction(match["denominator"])
        if denominator == 0:
            return None
        value /= denominator
    return -value if match["sign"] else value


def _numerals_in_run(run: str) -> list[str]:
    """Split one run of number characters into numerals: ``"18,19"`` → ``["18", "19"]``, ``"3-4"`` → ``["3", "4"]``.

    Thousands separators stay inside their numeral (``"1,000"`` → ``["1000"]``); pieces without a digit
    (``"..."``, ``"-"``) are dropped. A run longer than :data:`MAX_NUMERAL_CHARS` comes back whole, so that
    :func:`parse_number` rejects it.
    """
    if len(run) > MAX_NUMERAL_CHARS:
        return [run]
    run = strip_thousands_separators(run.replace("\u2212", "-"))
    return [piece.rstrip(".") for part in run.split(",") for piece in _INFIX_MINUS.split(part) if _DIGIT.search(piece)]


def normalize_latex(text: str, max_fractions: int = MAX_ANSWER_NUMBERS + 1) -> str:
    """Rewrite LaTeX fractions as plain ones: ``\\dfrac{1}{2}`` and ``\\frac12`` → ``1/2 ``; ``1{,}000`` → ``1,000``.

    A space follows each fraction (``\\frac123`` is ½ then 3, not 1/23) unless a command does (``\\frac12\\frac12``,
    a product, then reads as no number), and one goes before it after a digit (``2\\frac{1}{2}``, a mixed number, is
    two numbers, not 21/2). At most ``max_fractions`` are rewritten, which bounds the work; an answer with more
    numbers than that is rejected anyway.
    """
    text = text.replace("{,}", ",")
    if "frac" not in text:
        return text
    pieces, done = [], 0
    for count, fraction in enumerate(_LATEX_FRAC.finditer(text)):
        if count == max_fractions:
            break
        start, end = fraction.span()
        glued = start > done and text[start - 1] in "0123456789"
        pieces += [text[done:start], " " if glued else "", f"{fraction[1] or fraction[2]}/{fraction[3] or fraction[4]}"]
        pieces.append("" if text.startswith("\\", end) else " ")
        done = end
    pieces.append(text[done:])
    return "".join(pieces)


def numbers_in(text: str) -> list[Fraction] | None:
    """Every number in ``text``, in order; ``None`` when one of them cannot be read.

    ``"The answer is $1,000."`` → ``[1000]``; ``"18 or 19"`` → ``[18, 19]``; ``"\\boxed{\\frac{1}{2}}"`` → ``[1/2]``;
    ``"25%"`` → ``[25]``; ``"no number"`` → ``[]``. ``None`` for a malformed number (``"1.2.3"``, ``"1/0"``, a
    1000-digit run), for a fraction it cannot read (``\\frac{\\pi}{2}``, whose 2 is no answer), for a root, power or
    product (``\\sqrt{4}``, ``3^3``, ``3 \\times 3``: the value is not any number written) and for text with
    more than :data:`MAX_ANSWER_NUMBERS` runs of number characters: an answer is only as good as every number in it.
    """
    values: list[Fraction] = []
    if _DIGIT.search(text) is None:  # one fast scan spares the slower ones below on long number-free text
        return values
    text = normalize_latex(text)
    if _UNREAD_FRACTION.search(text) or _OPERATION.search(text):
        return None
    for index, run in enumerate(_NUMBER_RUN.finditer(text)):
        if index >= MAX_ANSWER_NUMBERS:
            return None
        for numeral in _numerals_in_run(run[0]):
            value = parse_number(numeral)
            if value is None:
                return None
            values.append(value)
    return values


def single_number(text: str) -> Fraction | None:
    """The one number an answer states, or ``None`` when it states none, several different ones, or a bad one.

    ``"18"``, ``"$18."``, ``"18 dollars"``, ``"\\boxed{18}"`` and ``"18 (that is 18 dollars)"`` → ``18``;
    ``"18 or 19"`` and ``"between 18 and 20"`` → ``None``: hedging between values earns nothing.
    """
    values = numbers_in(text)
    if not values or any(value != values[0] for value in values):
        return None
    return values[0]


def ground_truth_value(ground_truth: str) -> Fraction | None:
    """The value of a ground truth given as a bare number (``"72"``, ``"1,000"``, ``"-3"``) or as a whole GSM8K
    answer field (``"… reasoning …\\n#### 72"``). ``None`` when it is not one readable number (``"####"``)."""
    if ANSWER_DELIMITER in ground_truth:
        try:
            _, ground_truth = split_answer(ground_truth)
        except ValueError:
            return None
    return single_number(ground_truth)


def stated_places(ground_truth: str) -> int:
    """How many decimal places the ground truth (bare, or a GSM8K answer field's final answer) states when it is one
    plain decimal: ``"0.6666666667"`` → 10, ``"2.5"`` → 1; 0 for anything else (``"72"``, ``"1/3"``)."""
    if ANSWER_DELIMITER in ground_truth:
        ground_truth = ground_truth.rpartition(ANSWER_DELIMITER)[2]
    match = _PLAIN_DECIMAL.fullmatch(ground_truth.strip())
    return len(match[1]) if match else 0


def rounds_to(value: Fraction, gold: Fraction, places: int) -> bool:
    """Whether ``value``, an exact answer, is what a ground truth ``gold`` written with ``places`` decimal places
    rounds: ``2/3`` → ``0.6666666667``. Only for :data:`ROUNDED_GOLD_PLACES` places or more, and only for a fraction
    whose denominator q has 100·q² ≤ 10^places (q ≤ 31 at 5 places, q ≤ 10,000 at 10) lying within half a unit of
    the last place.

    Why it passes no wrong answer: two such fractions differ by at least 1/q² > 10^-places, while two values that
    round to the same gold differ by less, so at most one such fraction rounds to the gold; if the true answer is a
    fraction r/s that rounds to it, a different p/q would lie within 10^-places of it while differing by at least
    1/(qs), so s > 10^places / q ≥ 10^(places/2 + 1): a million at 10 places, far past any word problem's
    denominator. A decimal answer must equal the gold as written (``0.67`` is wrong against ``0.6666666667``), and a
    gold of fewer places is exact (``0.46`` stays wrong against ``0.5``)."""
    if places < ROUNDED_GOLD_PLACES:
        return False
    scale = 10**places
    return 100 * value.denominator**2 <= scale and 2 * abs(value - gold) * scale < 1


def answers_match(answer: str, ground_truth: str) -> bool:
    """Whether ``answer`` states exactly the ground truth's number, or the exact fraction a rounded one stands for
    (:func:`rounds_to`): ``answers_match("$1,000.00", "1000")`` and ``answers_match("\\frac{2}{3}",
    "0.6666666667")`` are true, ``answers_match("18 or 19", "18")`` is false."""
    expected = ground_truth_value(ground_truth)
    if expected is None:
        return False
    value = single_number(answer)
    return value is not None and (value == expected or rounds_to(value, expected, stated_places(ground_truth)))


# ---------------------------------------------------------------------------------------------------------------
# R1-Zero format: "… reasoning … </think> <answer> 18 </answer>"


def extract_answer_block(response: str) -> str | None:
    """The stripped content of the response's only ``<answer> … </answer>`` block, wherever it stands.

    ``None`` when there is not exactly one ``<answer>`` and one ``</answer>``, in that order. Says nothing about
    the rest of the format; see :func:`has_r1_zero_format`.
    """
    if response.count(ANSWER_START) != 1 or response.count(ANSWER_END) != 1:
        return None
    start = response.find(ANSWER_START) + len(ANSWER_START)
    end = response.find(ANSWER_END)
    if end < start:
        return None
    return response[start:end].strip()


def has_r1_zero_format(response: str) -> bool:
    """Whether the response closes its thought and then gives exactly one non-empty answer, and nothing else.

    The prompt ends with ``<think>``, so the response must read ``reasoning </think> <answer> 18 </answer>``:
    exactly one ``</think>``, exactly one ``<answer>`` and one ``</answer>``, only whitespace between
    ``</think>`` and ``<answer>``, a non-blank answer, and only whitespace after ``</answer>`` (generation stops
    at ``</answer>``, which is kept). Fails: an answer inside the thought, two answer blocks, a missing closing
    tag, ``<answer> </answer>``, text after the answer.
    """
    if response.count(THINK_END) != 1:
        return False
    content = extract_answer_block(response)
    if not content:
        return False
    think_end = response.find(THINK_END) + len(THINK_END)
    answer_start = response.find(ANSWER_START)
    answer_end = response.find(ANSWER_END) + len(ANSWER_END)
    return (
        think_end <= answer_start and not response[think_end:answer_start].strip() and not response[answer_end:].strip()
    )


# ---------------------------------------------------------------------------------------------------------------
# Question-only format: "… so she earns \boxed{18}." or "… so she earns 18 dollars."


def last_boxed_content(text: str) -> str | None:
    """The content of the last ``\\boxed{…}``, nested braces included: ``"\\boxed{\\frac{1}{2}}"`` →
    ``"\\frac{1}{2}"``. ``None`` when there is no ``\\boxed{`` or the last one never closes."""
    start = text.rfind(BOXED_START)
    if start < 0:
        return None
    depth = 0
    for count, brace in enumerate(_BRACE.finditer(text, start + len(BOXED_START) - 1)):
        if count >= MAX_BOXED_BRACES:
            return None
        depth += 1 if brace[0] == "{" else -1
        if depth == 0:
            return text[start + len(BOXED_START) : brace.start()]
    return None


def last_numeral(text: str) -> str | None:
    """The last numeral in ``text``: ``"3 + 15 = 18 apples."`` → ``"18"``, ``"half: \\frac{1}{2}"`` and
    ``"half: -\\frac12"`` → ``"1/2"`` and ``"-1/2"``, ``"18-20"`` → ``"20"``. ``None`` when ``text`` has no digit.
    Where the last digits belong to a LaTeX fraction, the text from it on comes back as plain text, which states no
    single number when it holds more than the fraction (``"\\frac123"`` → ``"1/2 3"``, the mixed number
    ``"2\\frac12"`` → ``"2 1/2"``) or a fraction that cannot be read (``"\\frac{\\pi}{2}"``, not 2)."""
    # Ten reverse searches for a single character run at memory speed; a forward regex would visit every number of a
    # 100 kB response.
    last_digit = max(text.rfind(digit) for digit in "0123456789")
    if last_digit < 0:
        return None
    run_start = _run_start(text, last_digit)
    run_end = _NUMBER_RUN_OR_EMPTY.match(text, last_digit).end()
    # A LaTeX fraction is one number although its digits sit in two arguments, braced or not.
    # Nearest first: a fraction read whole that ends before the number leaves it to an outer one (\frac{\frac12}{3}).
    for command in reversed(list(_UNREAD_FRACTION.finditer(text, max(0, run_start - FRACTION_REACH), run_start + 1))):
        fraction = _LATEX_FRAC.match(text, command.start())
        if fraction is None or fraction.end() > run_start:
            end = max(run_end, fraction.end()) if fraction else run_end
            return normalize_latex(text[_run_start(text, command.start()) : end]).strip()  # with a sign glued before
    return _numerals_in_run(text[run_start:run_end])[-1]


def _run_start(text: str, end: int) -> int:
    """Where the run of number characters that ends at ``end`` (exclusive) starts. Leftwards only a little past
    MAX_NUMERAL_CHARS: a run that reaches further is too long to be a number whatever its true start."""
    before = text[max(0, end - MAX_NUMERAL_CHARS - 1) : end][::-1]
    return end - _NUMBER_RUN_OR_EMPTY.match(before).end()


def extract_final_answer(response: str) -> str | None:
    """The answer to a question-only prompt: the content of the last ``\\boxed{}`` if there is one, else the last
    numeral. ``None`` (nothing extracted) when neither exists or the box is empty."""
    boxed = last_boxed_content(response)
    if boxed is not None:
        return boxed.strip() or None
    return last_numeral(response)


def has_final_answer(response: str) -> bool:
    """question_only's format rule: an answer can be read at all (:func:`extract_final_answer`)."""
    return extract_final_answer(response) is not None


def r1_zero_answer(response: str) -> str | None:
    """The number a well-formatted R1-Zero response answers, canonical (``"18"``, ``"5/2"``), for majority votes;
    ``None`` when the format is broken or the answer block states no single number."""
    block = extract_answer_block(response) if has_r1_zero_format(response) else None
    value = single_number(block) if block is not None else None
    return None if value is None else str(value)


def question_only_answer(response: str) -> str | None:
    """The number a question-only response answers (:func:`extract_final_answer`), canonical; ``None`` if none."""
    answer = extract_final_answer(response)
    value = single_number(answer) if answer is not None else None
    return None if value is None else str(value)


# ---------------------------------------------------------------------------------------------------------------
# Reward functions


def _rewards(format_reward: bool, answer_reward: bool, reward: bool) -> dict[str, float]:
    return {"format_reward": float(format_reward), "answer_reward": float(answer_reward), "reward": float(reward)}


def r1_zero_reward_fn(response: str, ground_truth: str) -> dict[str, float]:
    """Reward for the R1-Zero prompt; ``response`` is the text generated after ``Assistant: <think>``.

    >>> r1_zero_reward_fn("3 + 15 = 18 </think> <answer> $18 </answer>", "18")
    {'format_reward': 1.0, 'answer_reward': 1.0, 'reward': 1.0}

    ``format_reward``: :func:`has_r1_zero_format`. ``answer_reward``: the response has exactly one answer block
    and it states the ground truth's number (:func:`answers_match`); it is computed even when the format fails, as
    a diagnostic ("right answer, broken format"). ``reward`` is 1.0 only when both are 1.0. ``ground_truth`` is a
    bare number or a whole GSM8K answer field. Never raises: any error scores all zeros.
    """
    try:
        if not isinstance(response, str) or not isinstance(ground_truth, str):
            return _rewards(False, False, False)
        format_ok = has_r1_zero_format(response)
        answer = extract_answer_block(response)
        answer_ok = answer is not None and answers_match(answer, ground_truth)
        return _rewards(format_ok, answer_ok, format_ok and answer_ok)
    except Exception:
        return _rewards(False, False, False)


def question_only_reward_fn(response: str, ground_truth: str) -> dict[str, float]:
    """Reward for the question-only prompt (no tags): the answer is the last ``\\boxed{}``, else the last number.

    >>> question_only_reward_fn("6 * 3 = 18, so the answer is \\\\boxed{18}.", "18")
    {'format_reward': 1.0, 'answer_reward': 1.0, 'reward': 1.0}

    ``format_reward`` is 1.0 when an answer could be extracted at all (:func:`extract_final_answer`),
    ``answer_reward`` when it states the ground truth's number, and ``reward`` equals ``answer_reward``.
    Never raises: any error scores all zeros.
    """
    try:
        if not isinstance(response, str) or not isinstance(ground_truth, str):
            return _rewards(False, False, False)
        answer = extract_final_answer(response)
        answer_ok = answer is not None and answers_match(answer, ground_truth)
        return _rewards(answer is not None, answer_ok, answer_ok)
    except Exception:
        return _rewards(False, False, False)

"""Reward functions: grade a model's GSM8K answer against the ground truth.

Two prompt styles, two reward functions, both ``(response, ground_truth) -> {"format_reward", "answer_reward",
"reward"}`` with values 0.0 or 1.0:

* :func:`r1_zero_reward_fn` for the R1-Zero prompt, which ends with ``Assistant: <think>``; the response is
  ``"… reasoning … </think> <answer> 18 </answer>"``.
* :func:`question_only_reward_fn` for the bare question; the answer is the last ``\\boxed{…}``, else the last number.

Answers are compared as exact rationals (:class:`fractions.Fraction`) after normalisation, so ``$1,000.00``,
``1000`` and ``\\frac{2000}{2}`` agree, and ``0.1 + 0.2``-style float noise cannot creep in.

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
# \frac{1}{2}, \dfrac{1}{2}, \tfrac{1}{2}; each part is short and brace-free, so nested fractions are not read.
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{\s*+([^{}\s\\]{1,40}+)\s*+\}\{\s*+([^{}\s\\]{1,40}+)\s*+\}")
_BRACE = re.compile(r"[{}]")


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
    """Rewrite LaTeX fractions as plain ones: ``\\dfrac{1}{2}`` → ``1/2``; ``1{,}000`` → ``1,000``.

    At most ``max_fractions`` are rewritten: each substitution costs a Python call, and an answer with more
    numbers than that is rejected anyway.
    """
    text = text.replace("{,}", ",")
    if "frac{" in text:
        text = _LATEX_FRAC.sub(r"\1/\2", text, count=max_fractions)
    return text


def numbers_in(text: str) -> list[Fraction] | None:
    """Every number in ``text``, in order; ``None`` when one of them cannot be read.

    ``"The answer is $1,000."`` → ``[1000]``; ``"18 or 19"`` → ``[18, 19]``; ``"\\boxed{\\frac{1}{2}}"`` → ``[1/2]``;
    ``"25%"`` → ``[25]``; ``"no number"`` → ``[]``. ``None`` for a malformed number (``"1.2.3"``, ``"1/0"``, a
    1000-digit run) and for text with more than :data:`MAX_ANSWER_NUMBERS` runs of number characters: an answer is
    only as good as every number in it.
    """
    values: list[Fraction] = []
    if _DIGIT.search(text) is None:  # one fast scan spares the slower ones below on long number-free text
        return values
    for index, run in enumerate(_NUMBER_RUN.finditer(normalize_latex(text))):
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


def answers_match(answer: str, ground_truth: str) -> bool:
    """Whether ``answer`` states exactly the ground truth's number: ``answers_match("$1,000.00", "1000")`` is
    true, ``answers_match("18 or 19", "18")`` is false."""
    expected = ground_truth_value(ground_truth)
    return expected is not None and single_number(answer) == expected


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
    """The last numeral in ``text``: ``"3 + 15 = 18 apples."`` → ``"18"``, ``"half: \\frac{1}{2}"`` → ``"1/2"``,
    ``"18-20"`` → ``"20"``. ``None`` when ``text`` has no digit."""
    # Ten reverse searches for a single character run at memory speed; a forward regex would visit every number of a
    # 100 kB response.
    last_digit = max(text.rfind(digit) for digit in "0123456789")
    if last_digit < 0:
        return None
    # A LaTeX fraction is one number although its digits sit in two brace groups.
    frac = text.rfind("frac{", 0, last_digit)
    if frac > 0:
        for backslash in range(max(frac - 2, 0), frac):  # "\dfrac", "\tfrac" or "\frac"
            match = _LATEX_FRAC.match(text, backslash)
            if match is not None and match.end() > last_digit:
                return f"{match[1]}/{match[2]}"
    # Widen to the digit's run. Leftwards only a little past MAX_NUMERAL_CHARS: a run that reaches further is too
    # long to be a number whatever its true start.
    before = text[max(0, last_digit - MAX_NUMERAL_CHARS - 1) : last_digit][::-1]
    run_start = last_digit - _NUMBER_RUN_OR_EMPTY.match(before).end()
    run_end = _NUMBER_RUN_OR_EMPTY.match(text, last_digit).end()
    return _numerals_in_run(text[run_start:run_end])[-1]


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

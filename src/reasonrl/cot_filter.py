"""SFT pairs from GSM8K reference solutions, and the checks that decide which ones are correct CoTs.

GSM8K solutions carry calculator annotations, ``48/2 = <<48/2=24>>24``. The response keeps the reasoning without
them, in the r1_zero format: ``<reasoning> </think> <answer> N </answer>``. A pair is kept for ``filtered`` when
that response earns reward 1 from the SFT prompt's reward (params' ``rewards.<sft.prompt>``) and every annotation is
arithmetically right. An example without reasoning (a user's data with ``answer_format: number``) gives an
answer-only pair: kept in ``full``, dropped from ``filtered`` as ``no_reasoning``, since there is no chain of thought
to verify.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from reasonrl.data import GSM8KExample
from reasonrl.errors import UserError
from reasonrl.prompts import Prompt, load_prompt
from reasonrl.rewards import RewardFn, prompt_reward

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_ANNOTATION = re.compile(r"<<([^<>]*)>>")
_TOKEN = re.compile(r"\s*(\d+\.?\d*|\.\d+|\*\*|//|[-+*/x^()])")
_MAX_EXPONENT = 64  # a larger power is no grade-school arithmetic, and would be slow to compute exactly

DROP_REASONS = ("reward", "annotation_unparsable", "annotation_wrong", "no_reasoning")


class NothingKeptError(UserError, ValueError):
    """Every reference CoT was dropped: SFT would have no pair to train on."""


@dataclass(frozen=True)
class SFTPair:
    prompt: str
    response: str
    drop_reason: str | None
    """None when the pair belongs in ``filtered``; else one of ``DROP_REASONS``."""


def strip_annotations(text: str) -> str:
    """``"48/2 = <<48/2=24>>24 clips"`` → ``"48/2 = 24 clips"``."""
    return _ANNOTATION.sub("", text)


def reference_response(example: GSM8KExample) -> str:
    """The reference solution in the r1_zero response format (the prompt already opened ``<think>``)."""
    reasoning = strip_annotations(example.reasoning).strip()
    thought = f" {reasoning}" if reasoning else ""
    return f"{thought} </think> <answer> {example.answer} </answer>"


class _Parser:
    """Recursive descent over ``+ - * x / // ^ ** ( )`` and decimals, exact with Fractions. Never ``eval``."""

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        position = 0
        while position < len(text.rstrip()):
            match = _TOKEN.match(text, position)
            if not match:
                raise ValueError(f"unexpected {text[position : position + 10]!r}")
            self.tokens.append(match.group(1))
            position = match.end()
        self.index = 0

    def parse(self) -> Fraction:
        value = self._sum()
        if self.index != len(self.tokens):
            raise ValueError(f"trailing {self.tokens[self.index]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise ValueError("unexpected end")
        self.index += 1
        return token

    def _sum(self) -> Fraction:
        value = self._product()
        while self._peek() in ("+", "-"):
            value = value + self._product() if self._take() == "+" else value - self._product()
        return value

    def _product(self) -> Fraction:
        value = self._power()
        while self._peek() in ("*", "x", "/", "//"):
            operator, right = self._take(), self._power()
            if operator in ("/", "//") and right == 0:
                raise ValueError("division by zero")
            if operator == "/":
                value /= right
            elif operator == "//":
                value = Fraction(value // right)
            else:
                value *= right
        return value

    def _power(self) -> Fraction:
        base = self._unary()
        if self._peek() in ("^", "**"):
            self._take()
            exponent = self._power()
            if exponent.denominator != 1 or abs(exponent) > _MAX_EXPONENT:
                raise ValueError(f"unsupported exponent {exponent}")
            return base**exponent.numerator
        return base

    def _unary(self) -> Fraction:
        if self._peek() in ("-", "+"):
            return -self._unary() if self._take() == "-" else self._unary()
        token = self._take()
        if token == "(":
            value = self._sum()
            if self._take() != ")":
                raise ValueError("unbalanced parenthesis")
            return value
        if token[0].isdigit() or token[0] == ".":
            return Fraction(token)
        raise ValueError(f"unexpected {token!r}")


def evaluate_arithmetic(expression: str) -> Fraction:
    """Exact value of a calculator expression such as ``"48/2"`` or ``"(3+4)*2.5"``; ValueError if unparsable."""
    return _Parser(expression.replace(",", "")).parse()


def check_annotation(annotation: str) -> str | None:
    """None when ``"lhs=rhs"`` is right to the precision ``rhs`` is written in; else the drop reason.

    GSM8K rounds or truncates results (``<<10/3=3.33>>``, ``<<7/2=3>>``) to the decimals it writes, so both pass.
    """
    lhs, equals, rhs = annotation.rpartition("=")
    try:
        if not equals:
            raise ValueError("no '='")
        expected = evaluate_arithmetic(rhs)
        actual = evaluate_arithmetic(lhs)
    except (ValueError, ZeroDivisionError):
        return "annotation_unparsable"
    unit = Fraction(1, 10 ** len(rhs.strip().partition(".")[2]))
    rounded = abs(actual - expected) <= unit / 2
    truncated = expected == math.trunc(actual / unit) * unit
    return None if rounded or truncated else "annotation_wrong"


def make_sft_pair(
    example: GSM8KExample, prompt: Prompt, tokenizer: PreTrainedTokenizerBase, reward_fn: RewardFn
) -> SFTPair:
    response = reference_response(example)
    drop_reason = None
    for annotation in _ANNOTATION.findall(example.reasoning):
        drop_reason = check_annotation(annotation)
        if drop_reason:
            break
    if reward_fn(response, example.answer)["reward"] != 1.0:
        drop_reason = "reward"
    if not example.reasoning.strip():
        drop_reason = "no_reasoning"
    return SFTPair(prompt=prompt.render(example.question, tokenizer), response=response, drop_reason=drop_reason)


def make_sft_pairs(
    examples: list[GSM8KExample],
    prompt_name: str,
    tokenizer: PreTrainedTokenizerBase,
    rewards: Mapping[str, str] | None = None,
) -> list[SFTPair]:
    """One pair per example, in order, its prompt ``prompt_name`` (one in r1_zero's answer form, ``sft.prompt``)
    rendered for ``tokenizer``, each marked with why it would be dropped (if it would); ``rewards[prompt_name]``
    grades the responses (None: the prompt's built-in)."""
    prompt, reward_fn = load_prompt(prompt_name), prompt_reward(prompt_name, rewards)
    return [make_sft_pair(example, prompt, tokenizer, reward_fn) for example in examples]


def drop_counts(pairs: list[SFTPair]) -> dict[str, int]:
    """How many pairs each of :data:`DROP_REASONS` drops from ``filtered``."""
    return {reason: sum(pair.drop_reason == reason for pair in pairs) for reason in DROP_REASONS}


def require_kept(pairs: list[SFTPair], prompt_name: str, rewards: Mapping[str, str] | None = None) -> None:
    """Raise :class:`NothingKeptError`, naming the reward (``rewards.<prompt_name>``) and the drop counts, when no
    pair belongs in ``filtered``; the caller checks before writing anything, so its earlier output stays."""
    if any(pair.drop_reason is None for pair in pairs):
        return
    spec = prompt_name if rewards is None else rewards[prompt_name]
    dropped = ", ".join(f"{count} by {reason}" for reason, count in drop_counts(pairs).items() if count)
    raise NothingKeptError(
        f"none of the {len(pairs)} reference CoTs is kept{f' (dropped {dropped})' if dropped else ''}; "
        f"the reward is rewards.{prompt_name} = {spec}, which must give reward 1.0 to a right, well-formed response"
    )

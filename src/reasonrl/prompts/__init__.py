"""The prompt templates shipped with the package (``<name>.prompt``), each with the reward function that grades
answers to it: the one registry of prompt names that params, evaluation and training read.

A template is plain text with a ``{question}`` placeholder, or a chat prompt: turns under ``[system]``, ``[user]``
and ``[assistant]`` header lines, rendered through the tokenizer's chat template (an instruct model's), e.g.::

    [system]
    Solve the problem. Think in <think> </think>, answer in <answer> </answer>.
    [user]
    {question}
    [assistant]
    <think>

``{question}`` stands once: in a plain template anywhere, in a chat prompt in the last user turn; no other
``{word}`` stands in either (a typo such as ``{questions}`` would render the same prompt for every question). A final
``[assistant]`` turn is the fixed start of every answer, written after the template's generation prompt; earlier
user/assistant turns (worked examples) go to the template as they are. A turn's text is its lines, blank lines
around it dropped. A UTF-8 byte order mark, blank lines before the first header and spaces around a header are
ignored; a line that looks meant as a header but is not one (``[ user ]``, ``[system] text``) is an error, not text
for the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from reasonrl.errors import UserError
from reasonrl.grading import (
    extract_answer_block,
    extract_final_answer,
    has_final_answer,
    has_r1_zero_format,
    last_boxed_content,
    question_only_answer,
    question_only_reward_fn,
    r1_zero_answer,
    r1_zero_reward_fn,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

RewardFn = Callable[[str, str], dict[str, float]]

REWARD_FNS: dict[str, RewardFn] = {
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
    "r1_zero_chat": r1_zero_reward_fn,
}
"""Each prompt's reward function: ``r1_zero`` and ``r1_zero_chat`` (its instructions as an instruct model's system
turn) want ``</think> <answer> N </answer>``, ``question_only`` a final number (the last ``\\boxed{}``, else the
last number)."""
PROMPT_NAMES: tuple[str, ...] = tuple(REWARD_FNS)
FORMAT_FNS: dict[str, Callable[[str], bool]] = {
    "r1_zero": has_r1_zero_format,
    "question_only": has_final_answer,
    "r1_zero_chat": has_r1_zero_format,
}
"""Each prompt's format rule, its reward function's ``format_reward``, alone: for a reward that keeps the prompt's
format rule and grades the answer its own way (``reasonrl.rewards``' ``math_verify``)."""
ANSWER_FNS: dict[str, Callable[[str], str | None]] = {
    "r1_zero": r1_zero_answer,
    "question_only": question_only_answer,
    "r1_zero_chat": r1_zero_answer,
}
"""Each prompt's answer as a canonical number string (the reward function's reading of it), for majority votes."""
ANSWER_TEXT_FNS: dict[str, Callable[[str], str | None]] = {
    "r1_zero": extract_answer_block,
    "question_only": extract_final_answer,
    "r1_zero_chat": extract_answer_block,
}
"""Each prompt's answer text as its reward function reads it, before any number is read from it (``None``: none
found): what math-verify grades (``reasonrl.rewards``' ``math_verify``, ``reasonrl.crosscheck``)."""
ANSWER, BOXED = "answer", "boxed"
EXTRACTIONS = (ANSWER, BOXED)
"""Where math-verify reads a response's final answer (a benchmark declares one, ``reasonrl.benchmarks``).
``answer``: the prompt's own reading (:data:`ANSWER_TEXT_FNS`: r1_zero's ``<answer>`` block, question_only's last
``\\boxed{}`` or last number). ``boxed``: the last ``\\boxed{}`` within that reading (r1_zero's block may box a
LaTeX answer after words: "the pair is \\boxed{(3, \\frac{\\pi}{2})}"), else the reading as it is; for question_only,
whose reading takes the last box already, the two are the same."""


def answer_text_fn(prompt: str, extraction: str = ANSWER) -> Callable[[str], str | None]:
    """The answer text of ``prompt``'s responses as ``extraction`` (one of :data:`EXTRACTIONS`) reads it."""
    own = ANSWER_TEXT_FNS[prompt]
    if extraction == ANSWER:
        return own
    if extraction != BOXED:
        raise ValueError(f"unknown extraction {extraction!r}; one of {', '.join(EXTRACTIONS)}")

    def boxed_text(response: str) -> str | None:
        text = own(response)
        boxed = None if text is None else last_boxed_content(text)
        return text if boxed is None else boxed.strip() or None

    return boxed_text


def vote_answer_fn(prompt: str, extraction: str = ANSWER) -> Callable[[str], str | None]:
    """What a majority vote counts of ``prompt``'s responses: the canonical number (:data:`ANSWER_FNS`); with
    ``boxed`` the extracted LaTeX without its spaces (equivalent forms such as ``\\frac12`` and ``0.5`` count
    apart)."""
    if extraction == ANSWER:
        return ANSWER_FNS[prompt]
    text_fn = answer_text_fn(prompt, extraction)

    def voted(response: str) -> str | None:
        text = text_fn(response)
        return None if text is None else "".join(text.split()) or None

    return voted


ROLES = ("system", "user", "assistant")
_HEADER = re.compile(r"\[(\w+)\]")
# What a writer meant as a header: a role in brackets at the line's start, however spaced or cased, or a bracketed
# word alone on its line ("[Note] Solve it" in a plain template is text).
_HEADER_LIKE = re.compile(r"\s*\[\s*(?:(?i:system|user|assistant)\s*\]|\w+\s*\]\s*$)")
PLACEHOLDER = "{question}"
# A braced word not glued to a word or a backslash: a would-be placeholder, where "\boxed{answer}" is LaTeX.
_PLACEHOLDER_LIKE = re.compile(r"(?<![\w\\])\{\s*\w+\s*\}")


class PromptError(UserError, ValueError):
    """A prompt template cannot be used as written, or not with the model's tokenizer; the message says where."""


@dataclass(frozen=True)
class Prompt:
    """A parsed template: plain ``text``, or chat ``turns`` (role, text) and the ``assistant_prefix`` that starts
    every answer."""

    name: str
    text: str
    turns: tuple[tuple[str, str], ...] = ()
    assistant_prefix: str = ""

    @property
    def is_chat(self) -> bool:
        return bool(self.turns)

    def messages(self, question: str) -> list[dict[str, str]]:
        """The chat turns with the question in place, as ``apply_chat_template`` takes them."""
        return [{"role": role, "content": text.replace(PLACEHOLDER, question)} for role, text in self.turns]

    def render(self, question: str, tokenizer: PreTrainedTokenizerBase) -> str:
        """The text the model is given for ``question``: the template filled in (other braces in the question kept
        literally) or, for a chat prompt, ``tokenizer``'s chat template over the turns, its generation prompt and
        the assistant prefix."""
        if not self.is_chat:
            return self.text.replace(PLACEHOLDER, question)
        rendered = tokenizer.apply_chat_template(self.messages(question), tokenize=False, add_generation_prompt=True)
        return rendered + self.assistant_prefix


def parse_prompt(name: str, text: str, source: str) -> Prompt:
    """Parse a template; a chat prompt is one whose first non-blank line is a turn header. Errors name
    ``source``:line."""
    text = text.removeprefix("\ufeff")
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        for found in _PLACEHOLDER_LIKE.findall(line):
            if found != PLACEHOLDER:
                raise PromptError(f"{source}:{number}: {found} is no placeholder; the one placeholder is {PLACEHOLDER}")
    first = next((number for number, line in enumerate(lines, start=1) if line.strip()), None)
    if first is None or not _HEADER_LIKE.match(lines[first - 1]):
        return _plain_prompt(name, text, lines, source)
    turns: list[tuple[str, int, list[str]]] = []  # role, header line number, text lines
    for number, line in enumerate(lines[first - 1 :], start=first):
        header = _HEADER.fullmatch(line.strip())
        if header is None and _HEADER_LIKE.match(line):
            raise PromptError(
                f"{source}:{number}: {line.strip()!r} looks like a turn header but is not one; a header is [system], "
                "[user] or [assistant] alone on its line"
            )
        if header is None:
            turns[-1][2].append(line)
            continue
        if header.group(1) not in ROLES:
            raise PromptError(
                f"{source}:{number}: unknown turn {line.strip()}; a chat prompt's turns are [system], [user] and "
                "[assistant]"
            )
        turns.append((header.group(1), number, []))
    parsed = [(role, number, "\n".join(body).strip("\n")) for role, number, body in turns]
    for role, number, body in parsed:
        if not body:
            raise PromptError(f"{source}:{number}: the [{role}] turn is empty")
    users = [index for index, (role, _, _) in enumerate(parsed) if role == "user"]
    if not users:
        raise PromptError(f"{source}: a chat prompt needs a [user] turn holding {PLACEHOLDER}")
    for index, (_, number, body) in enumerate(parsed):
        expected = 1 if index == users[-1] else 0
        if body.count(PLACEHOLDER) != expected:
            where = "once, in the last [user] turn" if expected else "only in the last [user] turn"
            raise PromptError(f"{source}:{number}: {PLACEHOLDER} must stand {where}")
    prefix = parsed.pop()[2] if parsed[-1][0] == "assistant" else ""
    return Prompt(name, text, tuple((role, body) for role, _, body in parsed), prefix)


def _plain_prompt(name: str, text: str, lines: list[str], source: str) -> Prompt:
    """A plain template: its text, which must hold :data:`PLACEHOLDER` once."""
    holding = [number for number, line in enumerate(lines, start=1) for _ in range(line.count(PLACEHOLDER))]
    if not holding:
        raise PromptError(
            f"{source}: a plain template needs {PLACEHOLDER} once, where the question goes; it has none (every "
            "question would get the same prompt)"
        )
    if len(holding) > 1:
        raise PromptError(f"{source}:{holding[1]}: {PLACEHOLDER} must stand once in a plain template; again here")
    return Prompt(name, text)


def load_prompt(name: str) -> Prompt:
    """Prompt ``name`` (one of :data:`PROMPT_NAMES`), parsed."""
    if name not in PROMPT_NAMES:
        raise ValueError(f"unknown prompt {name!r}; choose one of {', '.join(PROMPT_NAMES)}")
    file = resources.files(__package__).joinpath(f"{name}.prompt")
    return parse_prompt(name, file.read_text(encoding="utf-8"), str(file))


def check_prompt(name: str, param: str, tokenizer: PreTrainedTokenizerBase, model: str | Path) -> None:
    """Refuse a chat prompt for a tokenizer without a chat template, at a stage's start, naming the param and the
    model (``apply_chat_template`` would stop the first generation, after the models have loaded)."""
    if load_prompt(name).is_chat and not tokenizer.chat_template:
        plain = [other for other in PROMPT_NAMES if not load_prompt(other).is_chat]
        raise PromptError(
            f"{param}: {name} is a chat prompt, rendered through the tokenizer's chat template, but the tokenizer of "
            f"{model} has none; choose a plain prompt ({', '.join(plain)}) or an instruct model, whose tokenizer "
            f"carries one"
        )

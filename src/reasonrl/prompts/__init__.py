"""Prompt templates shipped with the package, each with a ``{question}`` placeholder."""

from __future__ import annotations

from importlib import resources

PROMPT_NAMES: tuple[str, ...] = ("r1_zero", "question_only")


def load_prompt(name: str) -> str:
    """The template text of prompt ``name`` (``r1_zero`` or ``question_only``)."""
    if name not in PROMPT_NAMES:
        raise ValueError(f"unknown prompt {name!r}; choose one of {', '.join(PROMPT_NAMES)}")
    return resources.files(__package__).joinpath(f"{name}.prompt").read_text(encoding="utf-8")


def format_prompt(template: str, question: str) -> str:
    """Fill the template's ``{question}``; other braces in the question are kept literally."""
    return template.replace("{question}", question)

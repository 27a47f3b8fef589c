"""GSM8K records: parsing, validation and answer extraction.

A GSM8K jsonl line is ``{"question": ..., "answer": "<reasoning>\\n#### <final answer>"}``. Every malformed line is
an error that names the file and line: a silently skipped example changes the data set without anyone noticing.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

ANSWER_DELIMITER = "####"
# GSM8K writes thousands as "1,000"; a comma elsewhere (a list "3, 4") is not a separator.
_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


class DataFormatError(ValueError):
    """A malformed data record; the message names the file and line."""


@dataclass(frozen=True)
class GSM8KExample:
    question: str
    reasoning: str
    answer: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def strip_thousands_separators(text: str) -> str:
    """``"1,234,567"`` → ``"1234567"``; commas that do not separate thousands are kept."""
    return _THOUSANDS_SEPARATOR.sub("", text)


def split_answer(answer_field: str) -> tuple[str, str]:
    """Split a GSM8K answer field into (reasoning, final answer).

    The final answer is the text after the last ``####``, stripped, thousands separators removed.
    Raises ``ValueError`` when there is no ``####`` or nothing after it.
    """
    reasoning, delimiter, final = answer_field.rpartition(ANSWER_DELIMITER)
    if not delimiter:
        raise ValueError(f"no '{ANSWER_DELIMITER}' before the final answer")
    final = strip_thousands_separators(final.strip())
    if not final:
        raise ValueError(f"nothing after '{ANSWER_DELIMITER}'")
    return reasoning.strip(), final


def parse_record(line: str, source: str = "<string>", line_number: int = 1) -> GSM8KExample:
    """Parse one jsonl line; any defect raises :class:`DataFormatError` naming ``source:line_number``."""
    where = f"{source}:{line_number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataFormatError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(record, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in ("question", "answer"):
        if key not in record:
            raise DataFormatError(f"{where}: missing key '{key}'")
        if not isinstance(record[key], str) or not record[key].strip():
            raise DataFormatError(f"{where}: '{key}' must be a non-empty string")
    try:
        reasoning, answer = split_answer(record["answer"])
    except ValueError as error:
        raise DataFormatError(f"{where}: answer has {error}") from None
    return GSM8KExample(question=record["question"].strip(), reasoning=reasoning, answer=answer)


def load_gsm8k(path: str | Path) -> list[GSM8KExample]:
    """Read and validate every line of a GSM8K jsonl file (blank lines are errors too)."""
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        return [parse_record(line, str(path), number) for number, line in enumerate(handle, start=1)]

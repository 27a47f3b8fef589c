"""GSM8K records: parsing, validation and answer extraction; a user's own jsonl files converted to them.

A GSM8K jsonl line is ``{"question": ..., "answer": "<reasoning>\\n#### <final answer>"}``. Every malformed line is
an error that names the file and line: a silently skipped example changes the data set without anyone noticing.
A user's own data (``data.name: jsonl``, ``eval.test_sets``) is converted into such lines by the download stage, so
every later stage reads one format.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from reasonrl.atomic import atomic_directory
from reasonrl.errors import ConfigError, UserError
from reasonrl.grading import (
    ANSWER_DELIMITER,
    BOXED_START,
    ground_truth_value,
    last_boxed_content,
    split_answer,
    strip_thousands_separators,
)

SPLITS = ("train", "test")
# The one environment lookup of the project: CI and offline machines point it at a local GSM8K copy.
MIRROR_ENV_VAR = "GSM8K_MIRROR"


class DataFormatError(UserError, ValueError):
    """A malformed data record; the message names the file and line."""


@dataclass(frozen=True)
class GSM8KExample:
    question: str
    reasoning: str
    answer: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def examples_digest(examples: list[GSM8KExample]) -> str:
    """SHA-256 of a list of examples, in order."""
    return hashlib.sha256(json.dumps([e.to_dict() for e in examples], ensure_ascii=False).encode()).hexdigest()


def json_object(line: str, where: str) -> dict:
    """One jsonl line as a JSON object; anything else raises :class:`DataFormatError` naming ``where``."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataFormatError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(record, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


def parse_record(line: str, source: str = "<string>", line_number: int = 1) -> GSM8KExample:
    """Parse one jsonl line; any defect raises :class:`DataFormatError` naming ``source:line_number``."""
    where = f"{source}:{line_number}"
    record = json_object(line, where)
    for key in ("question", "answer"):
        if key not in record:
            raise DataFormatError(f"{where}: missing key '{key}'")
        if not isinstance(record[key], str) or not record[key].strip():
            raise DataFormatError(f"{where}: '{key}' must be a non-empty string")
    try:
        reasoning, answer = split_answer(record["answer"])
    except ValueError as error:
        raise DataFormatError(f"{where}: answer has {error}") from None
    if ground_truth_value(answer) is None:
        raise DataFormatError(
            f"{where}: the final answer after '{ANSWER_DELIMITER}', {answer!r}, is not one number the grader can "
            f"compare (such as 72, -3, 1,000 or 2.5): no response could ever be rewarded for it"
        )
    return GSM8KExample(question=record["question"].strip(), reasoning=reasoning, answer=answer)


def jsonl_lines(text: str) -> list[str]:
    """Split jsonl text at newlines only: ``str.splitlines`` would also split inside strings at U+2028 and kin."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def read_jsonl(path: str | Path) -> list[dict]:
    """Every line of a jsonl file as a dict; a bad line raises :class:`DataFormatError` naming ``path:line``."""
    records = []
    for number, line in enumerate(jsonl_lines(Path(path).read_text(encoding="utf-8")), start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise DataFormatError(f"{path}:{number}: invalid JSON ({error.msg} at column {error.colno})") from None
    return records


def parse_lines(lines: list[str], source: str) -> list[GSM8KExample]:
    """Parse every line (blank lines are errors too); ``source`` names the file in errors."""
    return [parse_record(line, source, number) for number, line in enumerate(lines, start=1)]


def load_gsm8k(path: str | Path) -> list[GSM8KExample]:
    """Read and validate every line of a GSM8K jsonl file."""
    path = Path(path)
    return parse_lines(jsonl_lines(path.read_text(encoding="utf-8")), str(path))


def resolve_source(mirror: str | None, url: str) -> str:
    """Where the GSM8K files come from: the ``data.mirror`` directory, else ``$GSM8K_MIRROR``, else ``url``."""
    return mirror or os.environ.get(MIRROR_ENV_VAR) or url


def fetch(source: str, split: str) -> tuple[bytes, str]:
    """The raw bytes of ``<source>/<split>.jsonl`` (a local directory or a URL) and the location read."""
    if source.startswith(("http://", "https://")):
        location = f"{source.rstrip('/')}/{split}.jsonl"
        try:
            with urllib.request.urlopen(location, timeout=60) as response:
                return response.read(), location
        except OSError as error:
            raise DataFormatError(
                f"{location}: download failed ({error}); set data.mirror or ${MIRROR_ENV_VAR} to a directory "
                f"holding train.jsonl and test.jsonl"
            ) from None
    path = Path(source) / f"{split}.jsonl"
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file (GSM8K mirror from data.mirror or ${MIRROR_ENV_VAR})")
    return path.read_bytes(), str(path)


def verify_sha256(
    content: bytes, expected: str, location: str, param: str, release: str = "the official GSM8K release"
) -> None:
    actual = hashlib.sha256(content).hexdigest()
    if actual != expected:
        raise DataFormatError(
            f"{location}: SHA-256 {actual} does not match {param} = {expected}; the file is corrupt or not {release}"
        )


def split_train_val(lines: list[str], val_size: int, seed: int) -> tuple[list[str], list[str]]:
    """Shuffle indices with ``seed``; the first ``val_size`` go to val. Both keep the file's order."""
    if val_size >= len(lines):
        raise ConfigError(
            f"data.val_size: must be less than the {len(lines)} train examples to leave some to train on, got "
            f"{val_size}"
        )
    order = list(range(len(lines)))
    random.Random(seed).shuffle(order)
    val_indices = set(order[:val_size])
    train = [line for index, line in enumerate(lines) if index not in val_indices]
    val = [line for index, line in enumerate(lines) if index in val_indices]
    return train, val


def fetch_verified_gsm8k(source: str, sha256: dict[str, str]) -> dict[str, list[str]]:
    """The lines of GSM8K's train and test files, after checking their SHA-256 and validating every line."""
    verified: dict[str, list[str]] = {}
    for split in SPLITS:
        content, location = fetch(source, split)
        verify_sha256(content, sha256[split], location, f"data.sha256.{split}")
        lines = jsonl_lines(content.decode("utf-8"))
        parse_lines(lines, location)
        verified[split] = lines
    return verified


def write_splits(
    train: list[str], test: list[str], val_size: int, split_seed: int, out_dir: str | Path
) -> dict[str, int]:
    """Carve val from train, write ``{train,val,test}.jsonl`` atomically; returns the size of each split."""
    train, val = split_train_val(train, val_size, split_seed)
    splits = {"train": train, "val": val, "test": test}
    with atomic_directory(out_dir) as staging:
        for name, lines in splits.items():
            (staging / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return {name: len(lines) for name, lines in splits.items()}


def download_gsm8k(
    source: str, sha256: dict[str, str], val_size: int, split_seed: int, out_dir: str | Path
) -> dict[str, int]:
    """Fetch, verify and validate GSM8K, split train into train/val, write ``{train,val,test}.jsonl`` atomically."""
    verified = fetch_verified_gsm8k(source, sha256)
    return write_splits(verified["train"], verified["test"], val_size, split_seed, out_dir)


# ---------------------------------------------------------------------------------------------------------------
# A user's own data: jsonl files with any two field names, converted into GSM8K lines

ANSWER_FORMATS = ("gsm8k", "number", "boxed")
"""How an answer field is read: ``gsm8k`` reasoning then ``#### N``; ``number`` the field is the bare answer (a JSON
number or a string), with no reasoning; ``boxed`` the last ``\\boxed{…}`` is the answer, the text before it the
reasoning."""


@dataclass(frozen=True)
class JsonlFields:
    """Where a user's file keeps the question and the answer, and how the answer is written."""

    question_field: str
    answer_field: str
    answer_format: str


def read_answer(value: object, answer_format: str) -> tuple[str, str]:
    """(reasoning, final answer) of one answer field in ``answer_format``; ValueError says what is wrong."""
    if answer_format == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return "", str(value)
    if not isinstance(value, str) or not value.strip():
        kind = "a non-empty string or a JSON number" if answer_format == "number" else "a non-empty string"
        raise ValueError(f"must be {kind}")
    if answer_format == "gsm8k":
        try:
            return split_answer(value)
        except ValueError as error:
            raise ValueError(f"has {error}") from None
    if answer_format == "number":
        return "", strip_thousands_separators(value.strip())
    content = last_boxed_content(value)
    if content is None or not content.strip():
        raise ValueError(f"has no closed, non-empty {BOXED_START}...}} (answer_format boxed)")
    return value[: value.rfind(BOXED_START)].strip(), content.strip()


def convert_record(line: str, fields: JsonlFields, source: str, line_number: int) -> str:
    """One line of a user's jsonl file as a GSM8K jsonl line; any defect raises :class:`DataFormatError` naming
    ``source:line_number``."""
    where = f"{source}:{line_number}"
    record = json_object(line, where)
    for key in (fields.question_field, fields.answer_field):
        if key not in record:
            raise DataFormatError(f"{where}: missing key '{key}'")
    question = record[fields.question_field]
    if not isinstance(question, str) or not question.strip():
        raise DataFormatError(f"{where}: '{fields.question_field}' must be a non-empty string")
    try:
        reasoning, answer = read_answer(record[fields.answer_field], fields.answer_format)
    except ValueError as error:
        raise DataFormatError(f"{where}: '{fields.answer_field}' {error}") from None
    if ANSWER_DELIMITER in answer or ground_truth_value(answer) is None:
        raise DataFormatError(
            f"{where}: the answer read from '{fields.answer_field}' (answer_format {fields.answer_format}), "
            f"{answer!r}, is not one number the grader can compare (such as 72, -3, 1,000, 2.5 or \\frac{{1}}{{2}}): "
            "no response could ever be rewarded for it"
        )
    body = f"{reasoning}\n{ANSWER_DELIMITER} {answer}" if reasoning else f"{ANSWER_DELIMITER} {answer}"
    return json.dumps({"question": question.strip(), "answer": body}, ensure_ascii=False)


def fetch_file(location: str, param: str) -> bytes:
    """The bytes of a local file (relative to the working directory: the repository root in a stage) or a URL."""
    if location.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(location, timeout=60) as response:
                return response.read()
        except OSError as error:
            raise DataFormatError(f"{location}: download failed ({error}); {param} can name a local file") from None
    path = Path(location)
    if not path.is_file():
        raise DataFormatError(f"{location}: no such file ({param}; a relative path is read from the repository root)")
    return path.read_bytes()


def fetch_verified_jsonl(location: str, sha256: str, fields: JsonlFields, param: str) -> list[str]:
    """A user's jsonl file (``param``: the dotted params that name it, for errors), checked against its SHA-256,
    every line validated and converted into a GSM8K line."""
    content = fetch_file(location, f"{param}.path")
    verify_sha256(content, sha256, location, f"{param}.sha256", release=f"the file {param}.sha256 was taken from")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataFormatError(f"{location}: not UTF-8 text (byte {error.start})") from None
    lines = [convert_record(line, fields, location, number) for number, line in enumerate(jsonl_lines(text), 1)]
    if not lines:
        raise DataFormatError(f"{location}: no examples ({param}.path)")
    return lines


def write_test_sets(test_sets: dict[str, list[str]], out_dir: str | Path) -> None:
    """Each extra held-out set as ``<out_dir>/<name>.jsonl``, atomically; no sets, an empty directory. A directory
    of its own, apart from the splits: DVC hashes a directory output whole, so a set added there would make every
    stage that reads the splits rerun."""
    with atomic_directory(out_dir) as staging:
        for name, lines in test_sets.items():
            (staging / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")

"""GSM8K records: parsing, validation and answer extraction; a user's own jsonl files converted to them.

A GSM8K jsonl line is ``{"question": ..., "answer": "<reasoning>\\n#### <final answer>"}``. Every malformed line is
an error that names the file and line: a silently skipped example changes the data set without anyone noticing.
A user's own data (``data.name: jsonl``, ``eval.test_sets``) is converted into such lines by the download stage, so
every later stage reads one format.

The download stage streams: each file is hashed in chunks, then read, validated, converted and written a line at a
time, so its memory does not grow with the file (a URL is downloaded in chunks beside the outputs first, at most
``data.max_download_bytes``). What grows with the data is small: the train/val shuffle's index (4 bytes a train
line) and a 16-byte key per held-out question (the check for test questions asked in train).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import unicodedata
import urllib.request
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reasonrl.atomic import atomic_directory
from reasonrl.contamination import Overlap
from reasonrl.errors import ConfigError, UserError
from reasonrl.grading import (
    ANSWER_DELIMITER,
    BOXED_START,
    ground_truth_value,
    last_boxed_content,
    split_answer,
    strip_thousands_separators,
)
from reasonrl.symbolic import gold_parses

SPLITS = ("train", "test")
LATEX = "latex"
"""The answer format graded by math-verify (:mod:`reasonrl.symbolic`): a line so marked keeps its answer as written."""
SOURCE_LINE = "source_line"
"""The key of a benchmark line's line number in its upstream file (``reasonrl.benchmarks``)."""
# One of the project's two environment lookups (reasonrl.benchmarks' BENCHMARK_MIRROR the other): CI and offline
# machines point it at a local GSM8K copy.
MIRROR_ENV_VAR = "GSM8K_MIRROR"
CHUNK_BYTES = 1 << 20
"""What a download or a hash reads at a time."""
CAP_PARAM = "data.max_download_bytes"


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
    """Parse one jsonl line; any defect raises :class:`DataFormatError` naming ``source:line_number``. A line with
    ``"answer_format": "latex"`` (written by the download stage, which checked that math-verify reads it) keeps its
    final answer as written: LaTeX, not one number."""
    where = f"{source}:{line_number}"
    record = json_object(line, where)
    for key in ("question", "answer"):
        if key not in record:
            raise DataFormatError(f"{where}: missing key '{key}'")
        if not isinstance(record[key], str) or not record[key].strip():
            raise DataFormatError(f"{where}: '{key}' must be a non-empty string")
    latex = record.get("answer_format") == LATEX
    try:
        reasoning, answer = split_answer(record["answer"], strip_separators=not latex)
    except ValueError as error:
        raise DataFormatError(f"{where}: answer has {error}") from None
    if not latex and ground_truth_value(answer) is None:
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


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def download(url: str, destination: Path, max_bytes: int, hint: str) -> None:
    """Stream ``url`` into the file ``destination`` in chunks, refusing one of more than ``max_bytes`` (by its
    Content-Length, and by what arrives: a server may send none, or more than it announced). ``hint`` ends the
    error of a failed download."""
    too_large = f"{url}: larger than {CAP_PARAM} = {max_bytes} bytes"
    try:
        with urllib.request.urlopen(url, timeout=60) as response, destination.open("wb") as out:
            announced = response.headers.get("Content-Length", "")
            if announced.isdigit() and int(announced) > max_bytes:
                raise DataFormatError(f"{too_large} (it announces {announced}); raise {CAP_PARAM} to download it")
            received = 0
            while chunk := response.read(CHUNK_BYTES):
                received += len(chunk)
                if received > max_bytes:
                    raise DataFormatError(f"{too_large} (more arrived); raise {CAP_PARAM} to download it")
                out.write(chunk)
    except OSError as error:
        raise DataFormatError(f"{url}: download failed ({error}); {hint}") from None


@contextmanager
def local_file(location: str, scratch: Path, max_bytes: int, missing: str, hint: str) -> Iterator[Path]:
    """A local file as it is, or a URL downloaded (:func:`download`) into a file in the directory ``scratch``,
    removed on exit. ``missing`` ends the error of a local file that is not there."""
    if not is_url(location):
        path = Path(location)
        if not path.is_file():
            raise DataFormatError(f"{location}: no such file ({missing})")
        yield path
        return
    with tempfile.TemporaryDirectory(dir=scratch, prefix=".download.") as directory:
        path = Path(directory) / "file"
        download(location, path, max_bytes, hint)
        yield path


@contextmanager
def fetch(source: str, split: str, scratch: Path, max_bytes: int) -> Iterator[tuple[Path, str]]:
    """``<source>/<split>.jsonl`` (a local directory or a URL, downloaded into ``scratch``) as a local file, and the
    location read."""
    location = f"{source.rstrip('/')}/{split}.jsonl" if is_url(source) else str(Path(source) / f"{split}.jsonl")
    missing = f"GSM8K mirror from data.mirror or ${MIRROR_ENV_VAR}"
    hint = f"set data.mirror or ${MIRROR_ENV_VAR} to a directory holding train.jsonl and test.jsonl"
    with local_file(location, scratch, max_bytes, missing, hint) as path:
        yield path, location


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, as ``sha256sum`` prints it."""
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def verify_sha256(
    path: Path, expected: str, location: str, param: str, release: str = "the official GSM8K release"
) -> None:
    """Refuse the file at ``path`` (read from ``location``) unless its SHA-256 is ``expected`` (``param``)."""
    actual = file_sha256(path)
    if actual != expected:
        raise DataFormatError(
            f"{location}: SHA-256 {actual} does not match {param} = {expected}; the file is corrupt or not {release}"
        )


def file_lines(path: Path, location: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a jsonl file, one at a time, split at newlines only (as :func:`jsonl_lines`)."""
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                yield number, raw.removesuffix(b"\n").decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFormatError(f"{location}:{number}: not UTF-8 text (byte {error.start} of the line)") from None


def val_indices(count: int, val_size: int, seed: int) -> set[int]:
    """The indices of the ``count`` train lines that go to val: the first ``val_size`` of a shuffle with ``seed``.
    The shuffle runs over a compact array (4 bytes a line), the same draws as over a list."""
    if val_size >= count:
        raise ConfigError(
            f"data.val_size: must be less than the {count} train examples to leave some to train on, got {val_size}"
        )
    order = array("I", range(count))
    random.Random(seed).shuffle(order)
    return set(order[:val_size])


def split_train_val(lines: list[str], val_size: int, seed: int) -> tuple[list[str], list[str]]:
    """Shuffle indices with ``seed``; the first ``val_size`` go to val. Both keep the file's order."""
    chosen = val_indices(len(lines), val_size, seed)
    train = [line for index, line in enumerate(lines) if index not in chosen]
    val = [line for index, line in enumerate(lines) if index in chosen]
    return train, val


Lines = Iterator[tuple[str, str]]
"""GSM8K lines, each with its question (for the overlap check), produced one at a time."""
LineSource = Callable[[Path], Lines]
"""A split's lines; the argument is a directory for a download's file (removed when the lines are exhausted)."""


def gsm8k_lines(source: str, sha256: str, split: str, max_bytes: int, scratch: Path) -> Lines:
    """GSM8K's ``split`` file after checking its SHA-256 (``data.sha256.<split>``), every line validated."""
    with fetch(source, split, scratch, max_bytes) as (path, location):
        verify_sha256(path, sha256, location, f"data.sha256.{split}")
        for number, line in file_lines(path, location):
            yield line, parse_record(line, location, number).question


def given_lines(lines: Iterable[str], scratch: Path) -> Lines:
    """Lines made in memory (the synthetic set) with their questions; ``scratch`` unused (no download)."""
    for line in lines:
        yield line, json.loads(line)["question"]


def fetch_verified_gsm8k(source: str, sha256: dict[str, str], max_bytes: int) -> dict[str, list[str]]:
    """The lines of GSM8K's train and test files, after checking their SHA-256 and validating every line."""
    with tempfile.TemporaryDirectory() as scratch:
        return {
            split: [line for line, _ in gsm8k_lines(source, sha256[split], split, max_bytes, Path(scratch))]
            for split in SPLITS
        }


def question_key(question: str) -> bytes:
    """A question as the overlap check compares it: Unicode-normalised (NFKC), case-folded, runs of whitespace as
    one space; hashed to 16 bytes, so a held-out set's keys take little memory."""
    text = " ".join(unicodedata.normalize("NFKC", question).casefold().split())
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def write_lines(lines: Lines, path: Path) -> Counter[bytes]:
    """Write ``lines`` to ``path``; the number of lines of each :func:`question_key`."""
    keys: Counter[bytes] = Counter()
    with path.open("w", encoding="utf-8") as out:
        for line, question in lines:
            out.write(line + "\n")
            keys[question_key(question)] += 1
    return keys


@dataclass
class Written:
    """What :func:`write_data` wrote: the size of each split, test set (``test set <name>``) and benchmark
    (``benchmark <name>``); how many lines of each held-out file (``test`` and each test set) ask a question that a
    line of the train file (val included) asks too; and each benchmark's contaminated questions
    (:mod:`reasonrl.contamination`) by their line in its upstream file, left out when ``decontaminate``."""

    counts: dict[str, int] = field(default_factory=dict)
    in_train: dict[str, int] = field(default_factory=dict)
    contaminated: dict[str, list[int]] = field(default_factory=dict)


TEST_SETS_INDEX = "index.json"
"""Beside the test sets: each test set's and benchmark's number of questions, by name (``{}`` without
``eval.test_sets`` or ``eval.benchmarks``)."""


def write_data(
    train: LineSource,
    test: LineSource,
    test_sets: Mapping[str, LineSource],
    val_size: int,
    split_seed: int,
    out_dir: str | Path,
    test_sets_dir: str | Path,
    benchmarks: Mapping[str, LineSource] | None = None,
    decontaminate: bool = False,
) -> Written:
    """Write ``train`` (less val, carved by :func:`val_indices`), val and ``test`` to ``out_dir/{train,val,test}.jsonl``
    and each test set and benchmark to ``test_sets_dir/<name>.jsonl`` (and :data:`TEST_SETS_INDEX`), streaming, all
    atomically: any error leaves both directories as they were. ``test_sets_dir`` is apart from the splits: DVC hashes
    a directory output whole, so a set added to ``out_dir`` would make every stage that reads the splits rerun. Each
    benchmark is screened for contamination by the train file (val included); ``decontaminate`` leaves its
    contaminated questions out."""
    written, overlap = Written(), Overlap()
    with atomic_directory(out_dir) as staging, atomic_directory(test_sets_dir) as sets_staging:
        held_out = {"test": write_lines(test(staging), staging / "test.jsonl")}
        for name, lines in test_sets.items():
            held_out[f"test set {name}"] = write_lines(lines(sets_staging), sets_staging / f"{name}.jsonl")
        screened = {}
        for name, lines in (benchmarks or {}).items():
            keys = write_lines(screen(lines(sets_staging), name, overlap), sets_staging / f"{name}.jsonl")
            screened[f"benchmark {name}"] = keys.total()
        unsplit = staging / ".train.unsplit"
        seen: dict[str, set[bytes]] = {name: set() for name in held_out}
        count = 0
        with unsplit.open("w", encoding="utf-8") as out:
            for line, question in train(staging):
                out.write(line + "\n")
                count += 1
                key = question_key(question)
                for name, keys in held_out.items():
                    if key in keys:
                        seen[name].add(key)
                if overlap.active:
                    overlap.scan(key, example_text(line))
        chosen = val_indices(count, val_size, split_seed)
        with (
            unsplit.open(encoding="utf-8", newline="\n") as lines,
            (staging / "train.jsonl").open("w", encoding="utf-8") as train_out,
            (staging / "val.jsonl").open("w", encoding="utf-8") as val_out,
        ):
            for index, line in enumerate(lines):
                (val_out if index in chosen else train_out).write(line)
        unsplit.unlink()
        found = overlap.found()
        for name in benchmarks or {}:
            positions = found.get(name, [])
            written.contaminated[name] = set_aside(sets_staging / f"{name}.jsonl", positions, decontaminate)
            screened[f"benchmark {name}"] -= len(positions) if decontaminate else 0
        written.counts = {"train": count - len(chosen), "val": len(chosen)}
        written.counts |= {name: keys.total() for name, keys in held_out.items()} | screened
        written.in_train = {name: sum(keys[key] for key in seen[name]) for name, keys in held_out.items()}
        # DVC warns "'data/test_sets' is empty" each time it saves or hashes an empty output directory (four times
        # a run without eval.test_sets): the index keeps it from being empty, and says what it holds.
        sizes = {name: written.counts[f"test set {name}"] for name in test_sets}
        sizes |= {name: written.counts[f"benchmark {name}"] for name in benchmarks or {}}
        (sets_staging / TEST_SETS_INDEX).write_text(json.dumps(sizes, indent=2) + "\n", encoding="utf-8")
    return written


def screen(lines: Lines, name: str, overlap: Overlap) -> Lines:
    """``lines`` as they are, each question added to ``overlap`` under ``name`` at its position."""
    for position, (line, question) in enumerate(lines):
        overlap.add(name, position, question, question_key(question))
        yield line, question


def example_text(line: str) -> str:
    """A training line's question and answer (reasoning included): the text a contamination check compares."""
    record = json.loads(line)
    return f"{record['question']}\n{record['answer']}"


def set_aside(path: Path, positions: list[int], drop: bool) -> list[int]:
    """The upstream line (``source_line``) of each of ``path``'s lines at ``positions`` (from 0); with ``drop`` the
    file is rewritten without them."""
    wanted = set(positions)
    lines = jsonl_lines(path.read_text(encoding="utf-8"))
    source_lines = [json.loads(lines[position])[SOURCE_LINE] for position in positions]
    if drop and wanted:
        kept = [line for position, line in enumerate(lines) if position not in wanted]
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return source_lines


# ---------------------------------------------------------------------------------------------------------------
# A user's own data: jsonl files with any two field names, converted into GSM8K lines

ANSWER_FORMATS = ("gsm8k", "number", "boxed", LATEX)
"""How an answer field is read: ``gsm8k`` reasoning then ``#### N``; ``number`` the field is the bare answer (a JSON
number or a string), with no reasoning; ``boxed`` the last ``\\boxed{…}`` is the answer, the text before it the
reasoning; ``latex`` the answer is written in LaTeX and graded with math-verify (:mod:`reasonrl.symbolic`): the last
``\\boxed{…}`` when the field has one (the text before it the reasoning), else the whole field (MATH's ``answer``)."""


@dataclass(frozen=True)
class JsonlFields:
    """Where a user's file keeps the question and the answer, and how the answer is written."""

    question_field: str
    answer_field: str
    answer_format: str


def read_answer(value: object, answer_format: str) -> tuple[str, str]:
    """(reasoning, final answer) of one answer field in ``answer_format``; ValueError says what is wrong."""
    if answer_format in ("number", LATEX) and isinstance(value, int | float) and not isinstance(value, bool):
        return "", str(value)
    if not isinstance(value, str) or not value.strip():
        kind = "a non-empty string or a JSON number" if answer_format in ("number", LATEX) else "a non-empty string"
        raise ValueError(f"must be {kind}")
    if answer_format == "gsm8k":
        try:
            return split_answer(value)
        except ValueError as error:
            raise ValueError(f"has {error}") from None
    if answer_format == "number":
        return "", strip_thousands_separators(value.strip())
    content = last_boxed_content(value)
    if answer_format == LATEX and BOXED_START not in value:
        return "", value.strip()
    if content is None or not content.strip():
        raise ValueError(f"has no closed, non-empty {BOXED_START}...}} (answer_format {answer_format})")
    return value[: value.rfind(BOXED_START)].strip(), content.strip()


def convert_record(line: str, fields: JsonlFields, source: str, line_number: int) -> tuple[str, str]:
    """One line of a user's jsonl file as a GSM8K jsonl line, and its question; any defect raises
    :class:`DataFormatError` naming ``source:line_number``."""
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
    problem = answer_problem(answer, fields.answer_format)
    if problem:
        raise DataFormatError(
            f"{where}: the answer read from '{fields.answer_field}' (answer_format {fields.answer_format}), "
            f"{answer!r}, is {problem}: no response could ever be rewarded for it"
        )
    question = question.strip()
    return gsm8k_line(question, reasoning, answer, fields.answer_format), question


def answer_problem(answer: str, answer_format: str) -> str | None:
    """Why no response could be graded right against ``answer`` (read in ``answer_format``), None when one can:
    for ``latex`` math-verify must read it (:func:`reasonrl.symbolic.gold_parses`), for the others the rational
    grader must read it as one number."""
    if ANSWER_DELIMITER in answer:
        return f"not an answer (it holds {ANSWER_DELIMITER!r})"
    if answer_format == LATEX:
        return None if gold_parses(answer) else "not a formula math-verify can read"
    if ground_truth_value(answer) is None:
        return "not one number the grader can compare (such as 72, -3, 1,000, 2.5 or \\frac{1}{2})"
    return None


def gsm8k_line(
    question: str, reasoning: str, answer: str, answer_format: str, extra: Mapping[str, object] | None = None
) -> str:
    """A GSM8K jsonl line: ``reasoning`` (may be empty), then ``#### answer``; a LaTeX answer says so, so that
    :func:`parse_record` keeps it as written. ``extra`` keys go along (where a line came from)."""
    body = f"{reasoning}\n{ANSWER_DELIMITER} {answer}" if reasoning else f"{ANSWER_DELIMITER} {answer}"
    record = {"question": question, "answer": body} | ({"answer_format": LATEX} if answer_format == LATEX else {})
    return json.dumps(record | dict(extra or {}), ensure_ascii=False)


def jsonl_file_lines(
    location: str, sha256: str, fields: JsonlFields, param: str, max_bytes: int, scratch: Path
) -> Lines:
    """A user's jsonl file (``param``: the dotted params that name it, for errors; a URL downloaded into
    ``scratch``), checked against its SHA-256, every line validated and converted into a GSM8K line."""
    missing = f"{param}.path; a relative path is read from the repository root"
    with local_file(location, scratch, max_bytes, missing, f"{param}.path can name a local file") as path:
        verify_sha256(path, sha256, location, f"{param}.sha256", release=f"the file {param}.sha256 was taken from")
        number = 0
        for number, line in file_lines(path, location):
            yield convert_record(line, fields, location, number)
        if not number:
            raise DataFormatError(f"{location}: no examples ({param}.path)")

"""The standard math benchmarks by name (``eval.benchmarks``): each an upstream file pinned by URL at a fixed commit
and by SHA-256, and how a question and its gold answer are read from its fields.

Eight come from the Qwen2.5-Math evaluation harness (``evaluation/data/<name>/test.jsonl``), whose published tables
users quote; MATH-500 from openai/prm800k (a Git LFS file, fetched through GitHub's media host, which resolves LFS
objects); GSM8K's test split from openai/grade-school-math, the file the pipeline's own GSM8K data reads (so that
``eval.benchmarks: [gsm8k]`` puts GSM8K under the named protocols when the pipeline trains on other data).
``$BENCHMARK_MIRROR`` (or ``eval.benchmark_mirror``) names a local directory holding ``<name>/test.jsonl`` for
offline machines, as ``$GSM8K_MIRROR`` does for GSM8K (where the ``gsm8k`` benchmark is read when the benchmark
mirror has no copy); the files are checked against the same SHA-256 either way.

The download stage writes each benchmark as GSM8K lines (``reasonrl.data``) beside ``eval.test_sets``, a LaTeX
answer marked as such. A question whose gold answer its grader cannot read is left out and counted, never graded
wrong for every model alike: ASDiv's names, yes/no, clock times and ratios (``5:6``: no one number), college_math's
prose answers ("There is no solution.") and the formulas math-verify reads only in part (``\\max at x=2, min at
x=4``, which alone it would read as 4: :func:`reasonrl.symbolic.read_whole`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonrl.contamination import NGRAM
from reasonrl.data import (
    LATEX,
    SOURCE_LINE,
    DataFormatError,
    Lines,
    answer_problem,
    file_lines,
    gsm8k_line,
    is_url,
    json_object,
    local_file,
    verify_sha256,
)
from reasonrl.data import MIRROR_ENV_VAR as GSM8K_MIRROR_ENV_VAR
from reasonrl.grading import ANSWER_DELIMITER, last_boxed_content
from reasonrl.prompts import ANSWER, BOXED

MIRROR_ENV_VAR = "BENCHMARK_MIRROR"
NUMBER = "number"
QWEN_MATH_EVAL = (
    "https://raw.githubusercontent.com/QwenLM/Qwen2.5-Math/a45202bd16f1ec06f433442dc1152d0074773465/evaluation/data"
)
GSM8K_TEST = (
    "https://raw.githubusercontent.com/openai/grade-school-math/b52325ad96ea38979fdc222e881ff5d105f95295/"
    "grade_school_math/data/test.jsonl"
)
PRM800K_MATH500 = (
    "https://media.githubusercontent.com/media/openai/prm800k/7ecc794703b2877f63226f2477a49b34f9b25163/"
    "prm800k/math_splits/test.jsonl"
)

Reader = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its file, and how a record of it reads."""

    name: str
    url: str
    sha256: str
    records: int
    """Lines of the upstream file."""
    answer_format: str
    """``number``: graded by the exact rational grader (:mod:`reasonrl.grading`); ``latex``: by math-verify
    (:mod:`reasonrl.symbolic`)."""
    extraction: str
    """Where math-verify reads a response's answer (:data:`reasonrl.prompts.EXTRACTIONS`): ``boxed`` for a LaTeX
    benchmark, whose answers a model boxes, inside r1_zero's ``<answer>`` block too; the route's prompt and its
    own reading otherwise. A numeric benchmark is graded by the prompt's reward as configured."""
    question: Reader
    """The question a record asks, from its fields."""
    gold: Reader
    """Its gold answer as text, from its fields."""
    fields: tuple[str, ...] = field(default=())
    """The keys a record must have (a missing one is an error naming file and line)."""
    own_mirror: str | None = None
    """An environment variable naming a directory that holds this benchmark's file as ``test.jsonl`` itself
    (GSM8K's test split, in ``$GSM8K_MIRROR``), read when the benchmark mirror has no copy of it."""


def number_text(value: object) -> str:
    """A JSON number as an answer: ``27.0`` → ``"27"``, ``2.5`` → ``"2.5"``; a string as it is."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def without_dollars(text: str) -> str:
    """``"$(45,2),(-10,-9)$"`` → ``"(45,2),(-10,-9)"``: the answer fields of college_math and OlympiadBench wrap
    LaTeX in ``$``, once or piece by piece (``"$69$,$84$"``)."""
    return text.replace("$", "").strip()


def svamp_question(record: dict[str, Any]) -> str:
    """SVAMP's body and question, joined as the Qwen2.5-Math harness joins them (a full stop after the body)."""
    body = record["Body"].strip()
    return f"{body if body.endswith('.') else body + '.'} {record['Question'].strip()}"


def _qwen(
    name: str, sha256: str, records: int, answer_format: str, question: Reader, gold: Reader, *fields: str
) -> Benchmark:
    """A benchmark of the Qwen2.5-Math harness's data; a LaTeX one read at its last ``\\boxed{}``."""
    extraction = BOXED if answer_format == LATEX else ANSWER
    url = f"{QWEN_MATH_EVAL}/{name}/test.jsonl"
    return Benchmark(name, url, sha256, records, answer_format, extraction, question, gold, fields)


BENCHMARKS: dict[str, Benchmark] = {
    benchmark.name: benchmark
    for benchmark in (
        Benchmark(
            "math500",
            PRM800K_MATH500,
            "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
            500,
            LATEX,
            BOXED,
            lambda r: r["problem"],
            lambda r: r["answer"],
            ("problem", "answer"),
        ),
        _qwen(
            "aime24",
            "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
            30,
            NUMBER,
            lambda r: r["problem"],
            lambda r: r["answer"],
            "problem",
            "answer",
        ),
        _qwen(
            "amc23",
            "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4",
            40,
            NUMBER,
            lambda r: r["question"],
            lambda r: number_text(r["answer"]),
            "question",
            "answer",
        ),
        _qwen(
            "minerva_math",
            "0e656b430d3a0a1dab6aa853f453ba3805e28e2cabe4fc72486a897cc09d8ba2",
            272,
            LATEX,
            lambda r: r["problem"],
            lambda r: last_boxed_content(r["solution"]),
            "problem",
            "solution",
        ),
        _qwen(
            "olympiadbench",
            "bb8c1e38a16ea9eacb77530315a674d883f267fbff79183effc53681b4fcc416",
            675,
            LATEX,
            lambda r: r["question"],
            lambda r: ", ".join(without_dollars(answer) for answer in r["final_answer"]),
            "question",
            "final_answer",
        ),
        _qwen(
            "college_math",
            "91131bc4a355b884fc63ef7c4f048c35adb030004a4cb07b1475698f120aa4a6",
            2818,
            LATEX,
            lambda r: r["question"],
            lambda r: without_dollars(r["answer"]),
            "question",
            "answer",
        ),
        _qwen(
            "svamp",
            "d0826ff1264f3860e46fc4e71db9e31d2d188960db87090e22677f9493e67a0d",
            1000,
            NUMBER,
            svamp_question,
            lambda r: number_text(r["Answer"]),
            "Body",
            "Question",
            "Answer",
        ),
        _qwen(
            "asdiv",
            "5759580385e706f961a30d4c07d6925b35c3f7c86d6c50bc413957169693dad2",
            2215,
            NUMBER,
            lambda r: f"{r['body'].strip()} {r['question'].strip()}",
            # "9 (apples)": the unit in parentheses goes, as in the Qwen2.5-Math harness
            lambda r: re.sub(r"\(.*?\)", "", r["answer"]).strip(),
            "body",
            "question",
            "answer",
        ),
        _qwen(
            "mawps",
            "00ffe31161be8623a3d36741830edbba87a3aee0109f693810fe40b9d5d91b8b",
            2065,
            NUMBER,
            lambda r: r["input"],
            lambda r: number_text(r["target"]),
            "input",
            "target",
        ),
        Benchmark(
            "gsm8k",
            GSM8K_TEST,
            "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
            1319,
            NUMBER,
            ANSWER,
            lambda r: r["question"],
            lambda r: r["answer"].rpartition(ANSWER_DELIMITER)[2].strip(),
            ("question", "answer"),
            own_mirror=GSM8K_MIRROR_ENV_VAR,
        ),
    )
}
"""Every benchmark ``eval.benchmarks`` can name."""


def benchmark_location(benchmark: Benchmark, mirror: str | None) -> str:
    """Where ``benchmark``'s file is read: ``<mirror>/<name>/test.jsonl`` when a mirror is given (the
    ``eval.benchmark_mirror`` param, else ``$BENCHMARK_MIRROR``), else its pinned URL; a benchmark with a mirror of
    its own (:attr:`Benchmark.own_mirror`) is read there when that is set and the benchmark mirror has no copy."""
    mirror = mirror or os.environ.get(MIRROR_ENV_VAR)
    if mirror and is_url(mirror):
        return f"{mirror.rstrip('/')}/{benchmark.name}/test.jsonl"
    mirrored = Path(mirror) / benchmark.name / "test.jsonl" if mirror else None
    own = os.environ.get(benchmark.own_mirror) if benchmark.own_mirror else None
    if own and not (mirrored and mirrored.is_file()):
        return str(Path(own) / "test.jsonl")
    return str(mirrored) if mirrored else benchmark.url


@dataclass(frozen=True)
class BenchmarkRecord:
    """One upstream record as the benchmark reads it; ``problem`` says why no response could be graded right
    against its ``gold`` (None: one can)."""

    line: int
    question: str
    gold: str
    problem: str | None


def read_record(benchmark: Benchmark, line: str, location: str, number: int) -> BenchmarkRecord:
    """Line ``number`` of ``benchmark``'s file read; a malformed one raises :class:`DataFormatError` naming
    ``location:number``."""
    where = f"{location}:{number}"
    record = json_object(line, where)
    for key in benchmark.fields:
        if key not in record:
            raise DataFormatError(f"{where}: missing key '{key}' (benchmark {benchmark.name})")
    question, gold = benchmark.question(record), benchmark.gold(record)
    if not isinstance(question, str) or not question.strip():
        raise DataFormatError(f"{where}: no question (benchmark {benchmark.name} reads {', '.join(benchmark.fields)})")
    if not isinstance(gold, str) or not gold.strip():
        return BenchmarkRecord(number, question.strip(), "", "empty")
    gold = gold.strip()
    return BenchmarkRecord(number, question.strip(), gold, answer_problem(gold, benchmark.answer_format))


def read_benchmark(
    benchmark: Benchmark, mirror: str | None, max_bytes: int, scratch: Path
) -> Iterator[BenchmarkRecord]:
    """Every record of ``benchmark``'s file (a URL downloaded into ``scratch``), after checking its SHA-256."""
    location = benchmark_location(benchmark, mirror)
    missing = f"benchmark {benchmark.name}: eval.benchmark_mirror or ${MIRROR_ENV_VAR} holds <name>/test.jsonl"
    hint = f"set eval.benchmark_mirror or ${MIRROR_ENV_VAR} to a directory holding {benchmark.name}/test.jsonl"
    with local_file(location, scratch, max_bytes, missing, hint) as path:
        verify_sha256(path, benchmark.sha256, location, "its pinned SHA-256", release=f"benchmark {benchmark.name}")
        for number, line in file_lines(path, location):
            yield read_record(benchmark, line, location, number)


@dataclass
class Tally:
    """What :func:`benchmark_lines` read of a benchmark: its records, and those left out because no response could
    be graded right against their gold answer."""

    records: int = 0
    ungradable: int = 0


def benchmark_lines(benchmark: Benchmark, mirror: str | None, max_bytes: int, tally: Tally, scratch: Path) -> Lines:
    """``benchmark``'s gradable records as GSM8K lines (each with its upstream ``source_line``), with their
    questions; ``tally`` counts what was read and left out."""
    for record in read_benchmark(benchmark, mirror, max_bytes, scratch):
        tally.records += 1
        if record.problem:
            tally.ungradable += 1
            continue
        extra = {SOURCE_LINE: record.line}
        yield gsm8k_line(record.question, "", record.gold, benchmark.answer_format, extra), record.question


def benchmark_summary(tallies: dict[str, Tally], contaminated: dict[str, list[int]], decontaminate: bool) -> dict:
    """What the download stage found of each benchmark, for the report: its ``answer_format``, its upstream
    ``records``, the ``ungradable``
    ones left out, the ``contaminated`` questions (:mod:`reasonrl.contamination`) by their upstream line, and the
    ``questions`` written (less the contaminated ones when ``decontaminate``)."""
    summary = {}
    for name, tally in tallies.items():
        lines = contaminated.get(name, [])
        written = tally.records - tally.ungradable - (len(lines) if decontaminate else 0)
        summary[name] = {
            "answer_format": BENCHMARKS[name].answer_format,
            "records": tally.records,
            "ungradable": tally.ungradable,
            "questions": written,
            "contaminated": len(lines),
            "contaminated_lines": lines,
        }
    return {"ngram": NGRAM, "decontaminate": decontaminate, "benchmarks": summary}


def summary_lines(summary: dict) -> list[str]:
    """One line per benchmark of :func:`benchmark_summary`, as the download stage prints them."""
    lines = []
    for name, entry in summary["benchmarks"].items():
        contaminated = entry["contaminated"]
        line = f"benchmark {name}: {entry['questions']} questions of {entry['records']}"
        if entry["ungradable"]:
            line += (
                f"; {entry['ungradable']} left out, whose gold answer the {entry['answer_format']} grader cannot read"
            )
        if contaminated:
            shown = ", ".join(map(str, entry["contaminated_lines"][:10])) + (", …" if contaminated > 10 else "")
            line += (
                f"; {contaminated} share a {summary['ngram']}-gram with the train file or are asked in it (lines "
                f"{shown}), {'left out' if summary['decontaminate'] else 'kept (eval.decontaminate: true drops them)'}"
            )
        lines.append(line)
    return lines

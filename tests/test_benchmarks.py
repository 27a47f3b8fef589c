"""Issue 33: the standard benchmarks by name. Each is read whole from its pinned file (through ``$BENCHMARK_MIRROR``,
else downloaded once into pytest's cache), its record count checked, every gold answer it keeps read by its grader
and a few known answers graded right and wrong; MATH-500, whose file is a Git LFS object with no offline copy, on
hand-made records in its schema, through the same code."""

import dataclasses
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest
import yaml

from reasonrl.benchmarks import (
    BENCHMARKS,
    MIRROR_ENV_VAR,
    Benchmark,
    benchmark_location,
    read_benchmark,
)
from reasonrl.contamination import words
from reasonrl.data import LATEX, TEST_SETS_INDEX, DataFormatError, load_gsm8k
from reasonrl.data import MIRROR_ENV_VAR as GSM8K_MIRROR_ENV_VAR
from reasonrl.grading import ground_truth_value
from reasonrl.prompts import EXTRACTIONS
from reasonrl.rewards import MATH_VERIFY, prompt_reward, rewards_for
from reasonrl.symbolic import gold_parses

REPO = Path(__file__).resolve().parents[1]
CAP = 10**9
RECORDS = {
    "aime24": 30,
    "amc23": 40,
    "svamp": 1000,
    "asdiv": 2215,
    "mawps": 2065,
    "minerva_math": 272,
    "olympiadbench": 675,
    "college_math": 2818,
}
"""Lines of each upstream file (Qwen2.5-Math at a45202b)."""
UNGRADABLE = {
    "aime24": 0,
    "amc23": 0,
    "svamp": 0,
    "asdiv": 118,
    "mawps": 0,
    "minerva_math": 5,
    "olympiadbench": 3,
    "college_math": 418,
}
"""Records left out for a gold answer their grader cannot read (whole): ASDiv's names, yes/no, clock times and
ratios; Minerva's and OlympiadBench's few formulas math-verify cannot parse; college_math's prose, several labelled
answers, conditions and series. docs/benchmarks.md states them."""
KNOWN = {
    # benchmark: (upstream line, its question starts, answers graded right, answers graded wrong)
    "aime24": (1, "Every morning Aya goes for", ["204", "$204$"], ["205", "20.4"]),
    "amc23": (1, "Cities $A$ and $B$ are $45$ miles apart.", ["27", "27.0 miles"], ["18"]),
    "svamp": (1, "There are 87 oranges and 290 bananas in Philip's collection. If the bananas", ["145"], ["290"]),
    "asdiv": (1, "Seven red apples and two green apples are in the basket. How many", ["9", "9 apples"], ["7"]),
    "mawps": (1, "Joan found 70 seashells on the beach.", ["43"], ["27", "70"]),
    "minerva_math": (1, "Each of the two Magellan telescopes", ["1.6", "1.60"], ["16", "1.5"]),
    "olympiadbench": (2, "Given a positive integer $n$", ["\\frac{1}{2(n+1)}", "\\frac{1}{2n+2}"], ["\\frac{1}{2n}"]),
    "college_math": (1, "Simplify: $-10-4(n-5)$", ["-4n+10", "10 - 4n"], ["10+4n", "-4n"]),
}
RESPONSE = "I worked it out. </think> <answer> {} </answer>"


@pytest.fixture(scope="module")
def records(benchmark_mirror, tmp_path_factory):
    """Every record of each mirrored benchmark, read once (a LaTeX set's gold answers take seconds to parse)."""
    scratch = tmp_path_factory.mktemp("scratch")
    return {name: list(read_benchmark(BENCHMARKS[name], str(benchmark_mirror), CAP, scratch)) for name in RECORDS}


@pytest.mark.parametrize("name", RECORDS)
def test_every_record_is_read_and_every_gold_answer_kept_is_gradable(records, name):
    benchmark, read = BENCHMARKS[name], records[name]
    assert len(read) == benchmark.records == RECORDS[name] and benchmark.extraction in EXTRACTIONS
    assert [record.line for record in read] == list(range(1, RECORDS[name] + 1))
    assert all(record.question for record in read)
    kept = [record.gold for record in read if record.problem is None]
    if benchmark.answer_format == LATEX:
        assert all(gold_parses(gold) for gold in kept)  # parsed when read: cached
    else:
        assert all(ground_truth_value(gold) is not None for gold in kept)
    assert len(read) - len(kept) == UNGRADABLE[name]


@pytest.mark.parametrize("name", KNOWN)
def test_known_answers_are_graded_right_and_wrong(records, name):
    """With r1_zero's reward as final_eval grades a set in the benchmark's answer format (math-verify for LaTeX)."""
    line, question, right, wrong = KNOWN[name]
    record = records[name][line - 1]
    assert record.question.startswith(question) and record.problem is None
    reward = prompt_reward("r1_zero", rewards_for(BENCHMARKS[name].answer_format, {"r1_zero": "r1_zero"}))
    assert [reward(RESPONSE.format(answer), record.gold)["reward"] for answer in right + wrong] == [1.0] * len(
        right
    ) + [0.0] * len(wrong)


# (benchmark, upstream line, whether its gold is kept, answers graded right, answers graded wrong)
GOLDS = [
    ("minerva_math", 269, False, [], []),  # \frac{1}{3} E_{1}+\frac{2}{3} E_{2}: math-verify alone reads 2/3 of it
    ("college_math", 1603, False, [], []),  # \max at x=2, min at x=4: read as 4
    ("college_math", 2145, True, ["0.343, 0.441, 0.189, 0.027"], ["0.027"]),  # .343,.441, .189, .027.: read whole
    ("olympiadbench", 140, True, ["62.5", "62.5\\%"], ["0.625"]),  # 62.5%
    ("minerva_math", 39, True, ["-1/3", "-\\frac{1}{3}"], ["-1", "1/3"]),  # -1./3
    ("college_math", 2357, True, ["3\\sqrt{3}", "\\sqrt{27}"], ["27"]),  # \sqrt{27}.
    # 0.6666666667: two thirds, rounded
    ("mawps", 295, True, ["2/3", "\\frac{2}{3}", "\\frac23", "0.6666666667"], ["0.67", "0.6667", "1/3"]),
]


@pytest.mark.parametrize(("name", "line", "kept", "right", "wrong"), GOLDS)
def test_a_gold_is_kept_when_its_grader_reads_all_of_it(records, name, line, kept, right, wrong):
    """Where math-verify reads a gold only in part it is left out; where a percent sign, a closing full stop or a
    point before a slash alone stood in its way, it is kept; an exact fraction is right against a rounded gold. Graded
    as final_eval grades the benchmark."""
    record = records[name][line - 1]
    assert (record.problem is None) == kept
    benchmark = BENCHMARKS[name]
    specs = rewards_for(benchmark.answer_format, {"r1_zero": "r1_zero"})
    reward = prompt_reward("r1_zero", specs, extraction=benchmark.extraction)
    graded = [reward(RESPONSE.format(answer), record.gold)["reward"] for answer in right + wrong]
    assert graded == [1.0] * len(right) + [0.0] * len(wrong)


def test_every_gold_kept_over_several_lines_is_graded_right_against_itself(records):
    """college_math writes matrices and pairs of solutions over several lines (59 of the golds kept): the gold
    itself, boxed by a model as its answer, is right. Every fourth of them, spread over the file (all 59 take 12 s)."""
    benchmark = BENCHMARKS["college_math"]
    reward = prompt_reward("question_only", {"question_only": MATH_VERIFY}, extraction=benchmark.extraction)
    golds = [record.gold for record in records["college_math"] if record.problem is None and "\n" in record.gold]
    assert len(golds) == 59
    assert [gold for gold in golds[::4] if reward(f"So it is $\\boxed{{{gold}}}$.", gold)["reward"] != 1.0] == []


def test_the_docs_state_what_each_benchmark_leaves_out(records):
    """docs/benchmarks.md's table: each benchmark's records, the gold answers left out and the questions kept, as
    read; ASDiv's left out include its ratios (5:6)."""
    page = (REPO / "docs" / "benchmarks.md").read_text()
    cells = (line.split("|")[1:-1] for line in page.splitlines())
    rows = {row[0].strip("` "): row for row in cells if len(row) == 7}  # the counts table's

    def number(cell: str) -> int:
        return int(re.match(r"\s*([\d,]+)", cell)[1].replace(",", ""))

    for name, read in records.items():
        left_out = sum(record.problem is not None for record in read)
        row = rows[name]
        assert (number(row[3]), number(row[4]), number(row[5])) == (len(read), left_out, len(read) - left_out), name
    asked = [record for record in records["asdiv"] if "ratio" in record.question]
    ratios = [record.gold for record in asked if record.problem and re.fullmatch(r"\d+:\d+", record.gold)]
    assert len(ratios) == 43 and "ratio" in rows["asdiv"][4]


MATH500 = [
    {
        "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
        "solution": "We have that $r = 3$ and $\\theta = \\frac{\\pi}{2}$, so "
        "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$",
        "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
        "subject": "Precalculus",
        "level": 2,
        "unique_id": "test/precalculus/807.json",
    },
    {
        "problem": "What is $1^{(2^{235423523})}$?",
        "solution": "One raised to any power is one, so our answer is $\\boxed{1}.$",
        "answer": "1",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1747.json",
    },
    {
        "problem": "Which of the following is a description of this set?",
        "solution": "It is the empty set.",
        "answer": "There is no such set.",
        "subject": "Algebra",
        "level": 3,
        "unique_id": "test/algebra/1.json",
    },
]
"""Records in MATH-500's schema: two from its file, one whose prose answer no grader reads."""


def write_math500(directory: Path) -> Benchmark:
    """The records above as ``<directory>/math500/test.jsonl``; MATH-500's adapter pinned to that file."""
    (directory / "math500").mkdir(parents=True)
    text = "".join(json.dumps(record) + "\n" for record in MATH500)
    (directory / "math500" / "test.jsonl").write_text(text)
    return dataclasses.replace(BENCHMARKS["math500"], sha256=hashlib.sha256(text.encode()).hexdigest(), records=3)


def test_math500_reads_problem_and_answer_graded_by_math_verify(tmp_path):
    benchmark = write_math500(tmp_path / "mirror")
    read = list(read_benchmark(benchmark, str(tmp_path / "mirror"), CAP, tmp_path))
    assert [(r.line, r.question, r.gold) for r in read[:2]] == [(1, MATH500[0]["problem"], MATH500[0]["answer"]),
                                                               (2, MATH500[1]["problem"], "1")]  # fmt: skip
    assert [record.problem for record in read] == [None, None, "not a formula math-verify can read"]
    reward = prompt_reward("r1_zero", rewards_for(benchmark.answer_format, {"r1_zero": "r1_zero"}))
    assert reward(RESPONSE.format("(3, \\frac{\\pi}{2})"), read[0].gold)["reward"] == 1.0
    assert reward(RESPONSE.format("(3, \\frac{\\pi}{3})"), read[0].gold)["reward"] == 0.0


def test_a_file_other_than_the_pinned_one_is_refused(tmp_path):
    write_math500(tmp_path / "mirror")
    with pytest.raises(DataFormatError, match=r"math500/test.jsonl: SHA-256 [0-9a-f]{64} does not match its pinned "
                       r"SHA-256 = 35dc4108.*; the file is corrupt or not benchmark math500$"):  # fmt: skip
        list(read_benchmark(BENCHMARKS["math500"], str(tmp_path / "mirror"), CAP, tmp_path))


def test_a_malformed_record_names_its_file_and_line(tmp_path):
    benchmark = write_math500(tmp_path / "mirror")
    path = tmp_path / "mirror" / "math500" / "test.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], json.dumps({"problem": "Q?"})]) + "\n")
    benchmark = dataclasses.replace(benchmark, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    with pytest.raises(DataFormatError, match=r"math500/test.jsonl:2: missing key 'answer' \(benchmark math500\)$"):
        list(read_benchmark(benchmark, str(tmp_path / "mirror"), CAP, tmp_path))


def test_the_source_is_the_param_then_the_environment_then_the_pinned_url(monkeypatch):
    math500 = BENCHMARKS["math500"]
    monkeypatch.delenv(MIRROR_ENV_VAR, raising=False)
    assert benchmark_location(math500, None) == math500.url
    assert math500.url.startswith("https://media.githubusercontent.com/media/openai/prm800k/7ecc794")
    monkeypatch.setenv(MIRROR_ENV_VAR, "/env")
    assert benchmark_location(math500, None) == "/env/math500/test.jsonl"
    assert benchmark_location(math500, "/param") == "/param/math500/test.jsonl"
    assert benchmark_location(math500, "http://host/m/") == "http://host/m/math500/test.jsonl"


def test_gsm8k_is_read_from_the_benchmark_mirror_else_the_gsm8k_mirror_else_its_pinned_url(monkeypatch, tmp_path):
    gsm8k = BENCHMARKS["gsm8k"]
    monkeypatch.delenv(MIRROR_ENV_VAR, raising=False)
    monkeypatch.delenv(GSM8K_MIRROR_ENV_VAR, raising=False)
    assert benchmark_location(gsm8k, None) == gsm8k.url
    assert gsm8k.url.startswith("https://raw.githubusercontent.com/openai/grade-school-math/b52325a")
    monkeypatch.setenv(GSM8K_MIRROR_ENV_VAR, "/gsm8k")
    assert benchmark_location(gsm8k, None) == "/gsm8k/test.jsonl"
    assert benchmark_location(gsm8k, str(tmp_path)) == "/gsm8k/test.jsonl"  # the benchmark mirror has no copy
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").touch()
    assert benchmark_location(gsm8k, str(tmp_path)) == str(tmp_path / "gsm8k" / "test.jsonl")
    assert benchmark_location(BENCHMARKS["svamp"], None) == BENCHMARKS["svamp"].url  # GSM8K's mirror is its own


def test_gsm8k_reads_every_test_question_and_its_final_answer(monkeypatch, tmp_path, gsm8k_mirror):
    monkeypatch.setenv(GSM8K_MIRROR_ENV_VAR, str(gsm8k_mirror))
    read = list(read_benchmark(BENCHMARKS["gsm8k"], str(tmp_path / "no copy"), CAP, tmp_path))
    test = load_gsm8k(gsm8k_mirror / "test.jsonl")
    assert len(read) == BENCHMARKS["gsm8k"].records == len(test) == 1319
    assert [record.question for record in read] == [example.question for example in test]
    assert all(record.problem is None for record in read)
    assert [ground_truth_value(record.gold) for record in read] == [ground_truth_value(e.answer) for e in test]
    reward = prompt_reward("r1_zero", rewards_for(BENCHMARKS["gsm8k"].answer_format, {"r1_zero": "r1_zero"}))
    assert read[0].question.startswith("Janet\u2019s ducks lay 16 eggs per day")
    assert [reward(RESPONSE.format(answer), read[0].gold)["reward"] for answer in ("18", "$18", "9")] == [1, 1, 0]


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_a_benchmark_is_downloaded_from_a_url_by_the_same_code(tmp_path):
    """MATH-500's hand-made file served over HTTP on localhost: downloaded, checked and read as a local copy is."""
    benchmark = write_math500(tmp_path / "www")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(tmp_path / "www")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        assert [record.gold for record in read_benchmark(benchmark, url, CAP, scratch)][:2] == [
            MATH500[0]["answer"],
            "1",
        ]
        assert not any(scratch.iterdir())  # the download is gone
    finally:
        server.shutdown()
        server.server_close()


def test_the_download_stage_screens_benchmarks_against_gsm8k_train(
    tmp_path, full_scale_params, gsm8k_mirror, benchmark_mirror
):
    """Numeric sets only: a LaTeX set's gold answers take a minute to parse, which the tests above pay once."""
    tree = yaml.safe_load(full_scale_params)
    tree["data"]["mirror"] = str(gsm8k_mirror)
    benchmarks = {"benchmarks": ["mawps", "aime24"], "benchmark_mirror": str(benchmark_mirror), "decontaminate": True}
    tree["eval"] |= benchmarks
    params, sets, summary_path = tmp_path / "params.yaml", tmp_path / "test_sets", tmp_path / "benchmarks.json"
    params.write_text(yaml.safe_dump(tree, sort_keys=False))
    command = [sys.executable, "stages/download.py", "--params", str(params), "--out", str(tmp_path / "gsm8k")]
    command += ["--test-sets", str(sets), "--benchmarks-summary", str(summary_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["ngram"] == 13 and summary["decontaminate"] is True
    mawps, aime24 = summary["benchmarks"]["mawps"], summary["benchmarks"]["aime24"]
    contaminated = mawps["contaminated"]
    assert contaminated == len(mawps["contaminated_lines"]) > 0  # MAWPS templates that GSM8K's authors reused
    written = [json.loads(line) for line in (sets / "mawps.jsonl").read_text().splitlines()]
    assert (
        len(written) == mawps["questions"] == 2065 - contaminated
        and len(load_gsm8k(sets / "mawps.jsonl")) == 2065 - contaminated
    )
    assert not {line["source_line"] for line in written} & set(mawps["contaminated_lines"])
    # each one left out shares 13 words in a row with a GSM8K train example (val included): checked by brute force
    train = [json.loads(line) for line in (gsm8k_mirror / "train.jsonl").read_text().splitlines()]
    train_grams = {gram for example in train for gram in grams(example["question"] + "\n" + example["answer"])}
    upstream = (benchmark_mirror / "mawps" / "test.jsonl").read_text().splitlines()
    assert all(grams(json.loads(upstream[line - 1])["input"]) & train_grams for line in mawps["contaminated_lines"])
    assert aime24 == {"answer_format": "number", "records": 30, "ungradable": 0, "questions": 30, "contaminated": 0,
                      "contaminated_lines": []}  # fmt: skip
    assert f"benchmark mawps: {2065 - contaminated} questions of 2065; {contaminated} share a 13-gram" in result.stdout
    index = json.loads((sets / TEST_SETS_INDEX).read_text())
    assert index == {"mawps": 2065 - contaminated, "aime24": 30}  # the index says what the directory holds


def grams(text: str) -> set[tuple[str, ...]]:
    tokens = words(text)
    return {tuple(tokens[start : start + 13]) for start in range(len(tokens) - 12)}

"""GSM8K parsing and the conversion of a user's own records: answer extraction and errors that name file and line."""

import json

import pytest

from reasonrl.data import DataFormatError, GSM8KExample, JsonlFields, convert_record, load_gsm8k, parse_record
from reasonrl.grading import split_answer, strip_thousands_separators


def test_split_answer_takes_text_after_last_delimiter_without_thousands_separators():
    reasoning, answer = split_answer("He pays 1,000 + 234 = <<1000+234=1234>>1,234.\n#### 1,234")
    assert reasoning == "He pays 1,000 + 234 = <<1000+234=1234>>1,234."
    assert answer == "1234"
    assert split_answer("a #### b\n#### -3")[1] == "-3"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1,000", "1000"), ("12,345,678", "12345678"), ("3, 4", "3, 4"), ("1,00", "1,00"), ("1,0000", "1,0000")],
)
def test_strip_thousands_separators(text, expected):
    assert strip_thousands_separators(text) == expected


def test_mirror_files_parse_completely(gsm8k_mirror):
    train = load_gsm8k(gsm8k_mirror / "train.jsonl")
    test = load_gsm8k(gsm8k_mirror / "test.jsonl")
    assert (len(train), len(test)) == (7473, 1319)
    assert train[0].answer == "72"
    assert train[0].question.startswith("Natalia sold clips")
    assert all(example.answer for example in train + test)


GOOD = json.dumps({"question": "q?", "answer": "r\n#### 5"})


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "invalid JSON"),
        (json.dumps({"answer": "#### 5"}), "missing key 'question'"),
        (json.dumps({"question": "q"}), "missing key 'answer'"),
        (json.dumps({"question": "q", "answer": "5"}), "no '####'"),
        (json.dumps({"question": "q", "answer": "r ####   "}), "nothing after '####'"),
        (json.dumps({"question": "", "answer": "#### 5"}), "'question' must be a non-empty string"),
        (json.dumps(["q", "a"]), "expected a JSON object"),
        ("", "invalid JSON"),
        # Issue 20: ground truths no response could ever match.
        (json.dumps({"question": "q", "answer": "r\n#### twelve"}), "'twelve', is not one number the grader can"),
        (json.dumps({"question": "q", "answer": "r\n#### 1/0"}), "'1/0', is not one number the grader can"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join([GOOD, GOOD, bad_line, GOOD]) + "\n")
    with pytest.raises(DataFormatError, match=message) as error:
        load_gsm8k(path)
    assert str(error.value).startswith(f"{path}:3: ")


def test_parse_record_default_location():
    with pytest.raises(DataFormatError, match=r"^<string>:1: invalid JSON"):
        parse_record("nope")


# ---------------------------------------------------------------------------------------------------------------
# Issue 23: a user's own jsonl files, converted into GSM8K lines

BOXED = JsonlFields("problem", "solution", "boxed")


@pytest.mark.parametrize(
    ("fields", "record", "reasoning", "answer"),
    [
        (JsonlFields("q", "a", "gsm8k"), {"q": " Q? ", "a": "2 + 3 = 5\n#### 5"}, "2 + 3 = 5", "5"),
        (JsonlFields("q", "a", "number"), {"q": "Q?", "a": "1,250"}, "", "1250"),
        (JsonlFields("q", "a", "number"), {"q": "Q?", "a": -2.5}, "", "-2.5"),
        (BOXED, {"problem": "Q?", "solution": "So.\nIt is \\boxed{\\frac{1}{2}}."}, "So.\nIt is",
         "\\frac{1}{2}"),
        (BOXED, {"problem": "Q?", "solution": "\\boxed{3} is wrong, \\boxed{4}", "id": 7}, "\\boxed{3} is wrong,", "4"),
    ],
)  # fmt: skip
def test_own_records_become_gsm8k_lines_with_the_fields_mapped(fields, record, reasoning, answer):
    line, question = convert_record(json.dumps(record), fields, "own.jsonl", 1)
    assert parse_record(line) == GSM8KExample("Q?", reasoning, answer) and question == "Q?"
    assert set(json.loads(line)) == {"question", "answer"}


@pytest.mark.parametrize(
    ("fields", "bad_record", "message"),
    [
        (BOXED, {"question": "Q?", "solution": "\\boxed{4}"}, "missing key 'problem'"),
        (BOXED, {"problem": "Q?", "solution": "4"}, r"'solution' has no closed, non-empty \\boxed\{...\}"),
        (BOXED, {"problem": "Q?", "solution": "\\boxed{4"}, r"'solution' has no closed"),
        (BOXED, {"problem": "Q?", "solution": "\\boxed{3 or 4}"}, r"from .solution. \(answer_format boxed\), "
         "'3 or 4', is not one number the grader can compare"),
        (BOXED, {"problem": ["Q?"], "solution": "\\boxed{4}"}, "'problem' must be a non-empty string"),
        (JsonlFields("q", "a", "number"), {"q": "Q?", "a": True}, "'a' must be a non-empty string or a JSON number"),
        (JsonlFields("q", "a", "number"), {"q": "Q?", "a": "5 apples and 6"}, "'5 apples and 6', is not one number"),
        (JsonlFields("q", "a", "gsm8k"), {"q": "Q?", "a": "5"}, "'a' has no '####' before the final answer"),
    ],
)  # fmt: skip
def test_a_bad_own_record_names_file_and_line(tmp_path, fields, bad_record, message):
    answers = {"gsm8k": "#### 4", "number": "4", "boxed": "\\boxed{4}"}
    good = json.dumps({fields.question_field: "Q?", fields.answer_field: answers[fields.answer_format]})
    lines = [good, good, json.dumps(bad_record)]
    with pytest.raises(DataFormatError, match=message) as error:
        [convert_record(line, fields, "own.jsonl", number) for number, line in enumerate(lines, start=1)]
    assert str(error.value).startswith("own.jsonl:3: ") and "\n" not in str(error.value)


# Issue 33: answers in LaTeX, graded by math-verify.

LATEX_FIELDS = JsonlFields("problem", "answer", "latex")


@pytest.mark.parametrize(
    ("record", "reasoning", "answer"),
    [
        ({"problem": "Q?", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)"}, "", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ({"problem": "Q?", "answer": "(1,234)"}, "", "(1,234)"),  # a pair: its comma separates no thousands
        ({"problem": "Q?", "answer": "So $r=3$: \\boxed{(3, \\pi)}"}, "So $r=3$:", "(3, \\pi)"),  # a solution
        ({"problem": "Q?", "answer": 2.5}, "", "2.5"),
    ],
)
def test_a_latex_answer_is_kept_as_written_and_marked(record, reasoning, answer):
    line, _ = convert_record(json.dumps(record), LATEX_FIELDS, "own.jsonl", 1)
    assert json.loads(line)["answer_format"] == "latex"
    assert parse_record(line) == GSM8KExample("Q?", reasoning, answer)


def test_a_latex_answer_math_verify_cannot_read_names_file_and_line():
    message = (
        r"^own.jsonl:4: the answer read from 'answer' \(answer_format latex\), 'There is no solution.', is not a "
        r"formula math-verify can read: no response could ever"
    )
    with pytest.raises(DataFormatError, match=message):
        convert_record(json.dumps({"problem": "Q?", "answer": "There is no solution."}), LATEX_FIELDS, "own.jsonl", 4)

"""GSM8K parsing: answer extraction and errors that name file and line."""

import json

import pytest

from reasonrl.data import DataFormatError, load_gsm8k, parse_record
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

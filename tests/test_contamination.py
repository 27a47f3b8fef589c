"""Issue 33: benchmark questions the training data contaminates (a shared run of 13 words, or the question asked
outright), found while the download stage streams the train file, counted and, with ``eval.decontaminate``, left
out."""

import json
from functools import partial

from reasonrl.contamination import NGRAM, Overlap, ngrams, words
from reasonrl.data import Lines, given_lines, gsm8k_line, load_gsm8k, question_key, write_data

THIRTEEN = "one two three four five six seven eight nine ten eleven twelve thirteen"


def test_words_are_compared_normalised():
    assert words("Tom's 3 APPLES, ﬁne.") == ["tom", "s", "3", "apples", "fine"]  # NFKC: the ligature
    assert ngrams(THIRTEEN) == ngrams(THIRTEEN.upper().replace(" ", " ,  ")) and len(ngrams(THIRTEEN)) == 1
    assert ngrams("one two") == set() and len(ngrams(THIRTEEN + " fourteen")) == 2 and NGRAM == 13


def overlap_of(questions: list[str], training: list[tuple[str, str]]) -> list[int]:
    overlap = Overlap()
    for position, question in enumerate(questions):
        overlap.add("bench", position, question, question_key(question))
    for question, text in training:
        overlap.scan(question_key(question), text)
    return overlap.found()["bench"]


def test_a_question_is_contaminated_by_a_shared_13_gram_or_by_being_asked():
    twelve = THIRTEEN.rsplit(" ", 1)[0]
    questions = [
        f"Alice said: {THIRTEEN}, how many?",  # its 13 words stand in a training text
        f"Bob said: {twelve}, how many?",  # 12 of them only
        "How many apples?",  # short: asked word for word, case and spacing aside
        "How many pears?",
    ]
    training = [("Unrelated question?", f"Reasoning: {THIRTEEN.upper()}. #### 1"), ("how  many APPLES?", "#### 2")]
    assert overlap_of(questions, training) == [0, 2]
    assert overlap_of(questions, []) == []


def benchmark(lines: list[tuple[str, str]], scratch: object) -> Lines:
    """A benchmark's lines as :func:`reasonrl.benchmarks.benchmark_lines` yields them, each with its upstream line."""
    for number, (question, gold) in enumerate(lines, start=1):
        yield gsm8k_line(question, "", gold, "number", {"source_line": number * 10}), question


def test_the_download_finds_contaminated_benchmark_questions_and_may_leave_them_out(tmp_path):
    train = [json.dumps({"question": f"Q{i}: how many?", "answer": f"#### {i}"}) for i in range(20)]
    train[7] = json.dumps({"question": "Q7?", "answer": f"As in {THIRTEEN}. #### 7"})
    questions = [("Fresh question one?", "1"), (f"Quoted: {THIRTEEN}?", "2"), ("Q3: HOW many?", "3"), ("New?", "4")]
    for decontaminate in (False, True):
        out = tmp_path / str(decontaminate)
        written = write_data(
            partial(given_lines, train),
            partial(given_lines, [json.dumps({"question": "Held out?", "answer": "#### 1"})]),
            {},
            5,
            0,
            out / "gsm8k",
            out / "test_sets",
            {"bench": partial(benchmark, questions)},
            decontaminate,
        )
        assert written.contaminated == {"bench": [20, 30]}  # by their upstream lines
        kept = [example.question for example in load_gsm8k(out / "test_sets" / "bench.jsonl")]
        expected = [q for q, _ in questions if not decontaminate or q in ("Fresh question one?", "New?")]
        assert kept == expected and written.counts["benchmark bench"] == len(expected)
        assert written.counts["train"] + written.counts["val"] == 20

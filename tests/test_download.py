"""download stage: checksum, validation, train/val split, a user's own data, and no output left behind on failure."""

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
from pipeline_repo import EXAMPLE_DATA, EXAMPLE_FIELDS, EXAMPLE_SHA256

from reasonrl.config import ConfigError, load_params
from reasonrl.data import (
    TEST_SETS_INDEX,
    DataFormatError,
    JsonlFields,
    given_lines,
    gsm8k_lines,
    jsonl_file_lines,
    load_gsm8k,
    resolve_source,
    split_train_val,
    write_data,
)
from reasonrl.errors import UserError
from reasonrl.presets import apply_to_file
from reasonrl.synthetic import arithmetic_lines

REPO = Path(__file__).resolve().parents[1]
OFFICIAL = {
    "train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
}


CAP = 10**9


def download_gsm8k(source: str, sha256: dict[str, str], val_size: int, split_seed: int, out_dir: Path):
    """GSM8K from ``source`` into ``out_dir`` as the download stage writes it (no test sets, beside it)."""
    train, test = (partial(gsm8k_lines, source, sha256[split], split, CAP) for split in ("train", "test"))
    return write_data(train, test, {}, val_size, split_seed, out_dir, out_dir.parent / "test_sets")


def test_mirror_download_verifies_and_splits(gsm8k_mirror, tmp_path):
    out = tmp_path / "gsm8k"
    written = download_gsm8k(str(gsm8k_mirror), OFFICIAL, val_size=500, split_seed=0, out_dir=out)
    assert written.counts == {"train": 6973, "val": 500, "test": 1319}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gsm8k", "test_sets"]  # no staging directory left
    # The split as the in-memory split made it: the same shuffle.
    lines = (gsm8k_mirror / "train.jsonl").read_text(encoding="utf-8").split("\n")[:-1]
    train, val = split_train_val(lines, 500, 0)
    assert (out / "train.jsonl").read_text(encoding="utf-8") == "".join(line + "\n" for line in train)
    assert (out / "val.jsonl").read_text(encoding="utf-8") == "".join(line + "\n" for line in val)
    train, val = load_gsm8k(out / "train.jsonl"), load_gsm8k(out / "val.jsonl")
    assert not {e.question for e in train} & {e.question for e in val}
    original = (gsm8k_mirror / "train.jsonl").read_text().splitlines()
    assert sorted((out / "train.jsonl").read_text().splitlines() + (out / "val.jsonl").read_text().splitlines()) == (
        sorted(original)
    )
    assert (out / "test.jsonl").read_bytes() == (gsm8k_mirror / "test.jsonl").read_bytes()


def test_split_is_deterministic_and_seeded():
    lines = [str(i) for i in range(100)]
    assert split_train_val(lines, 10, seed=1) == split_train_val(lines, 10, seed=1)
    assert split_train_val(lines, 10, seed=1)[1] != split_train_val(lines, 10, seed=2)[1]
    with pytest.raises(ConfigError, match="^data.val_size: must be less than the 100 train examples"):
        split_train_val(lines, 100, seed=0)


def write_mirror(directory: Path, train_lines: list[str]) -> dict[str, str]:
    directory.mkdir()
    good = json.dumps({"question": "How many?", "answer": "2 + 2 = 4\n#### 4"})
    contents = {"train": "\n".join(train_lines) + "\n", "test": good + "\n"}
    for split, text in contents.items():
        (directory / f"{split}.jsonl").write_text(text)
    return {split: hashlib.sha256(text.encode()).hexdigest() for split, text in contents.items()}


def test_checksum_mismatch_is_refused_and_leaves_nothing(tmp_path):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    hashes = write_mirror(tmp_path / "mirror", [good] * 3)
    out = tmp_path / "out" / "gsm8k"
    with pytest.raises(DataFormatError, match=r"train.jsonl: SHA-256 [0-9a-f]{64} does not match data.sha256.train"):
        download_gsm8k(str(tmp_path / "mirror"), {**hashes, "train": "0" * 64}, 1, 0, out)
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_malformed_line_is_refused_with_file_and_line_and_leaves_nothing(tmp_path):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    hashes = write_mirror(tmp_path / "mirror", [good, good, json.dumps({"question": "q", "answer": "no marker"})])
    out = tmp_path / "out" / "gsm8k"
    with pytest.raises(DataFormatError, match=r"mirror/train.jsonl:3: answer has no '####'"):
        download_gsm8k(str(tmp_path / "mirror"), hashes, 1, 0, out)
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_val_size_of_the_whole_train_file_is_a_params_error_and_leaves_nothing(tmp_path):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    hashes = write_mirror(tmp_path / "mirror", [good] * 3)
    out = tmp_path / "out" / "gsm8k"
    with pytest.raises(UserError, match=r"^data.val_size: must be less than the 3 train examples .*, got 3$"):
        download_gsm8k(str(tmp_path / "mirror"), hashes, 3, 0, out)
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_source_precedence(monkeypatch):
    monkeypatch.setenv("GSM8K_MIRROR", "/env/mirror")
    assert resolve_source("/param/mirror", "https://x") == "/param/mirror"
    assert resolve_source(None, "https://x") == "/env/mirror"
    monkeypatch.delenv("GSM8K_MIRROR")
    assert resolve_source(None, "https://x") == "https://x"


def test_stage_script_reports_user_errors_in_one_line(tmp_path, full_scale_params):
    params = tmp_path / "params.yaml"
    params.write_text(full_scale_params.replace("val_size: 500", "val_size: -3"))
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "stages/download.py"),
            "--params",
            str(params),
            "--out",
            str(tmp_path / "d"),
            "--test-sets",
            str(tmp_path / "t"),
            "--benchmarks-summary",
            str(tmp_path / "benchmarks.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {params}: data.val_size: must be ≥ 1, got -3"
    assert not (tmp_path / "d").exists()


# Issue 23: your own data, on the example shipped in examples/word_problems.


def own_data_params(tmp_path: Path, full_scale_params: str, **changes: object) -> Path:
    """params.yaml reading the example: its train and test as data, its shifted set as an extra test set."""
    tree = yaml.safe_load(full_scale_params)
    tree["data"] |= {"name": "jsonl", "val_size": 20}
    tree["data"]["jsonl"] = {
        split: {"path": f"{EXAMPLE_DATA}/{split}.jsonl", "sha256": EXAMPLE_SHA256[split]} for split in ("train", "test")
    } | EXAMPLE_FIELDS
    shifted = {"name": "shifted", "path": f"{EXAMPLE_DATA}/shifted.jsonl", "sha256": EXAMPLE_SHA256["shifted"]}
    tree["eval"]["test_sets"] = [shifted | EXAMPLE_FIELDS | changes]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def run_download(params: Path, out: Path) -> subprocess.CompletedProcess:
    """The download stage as DVC runs it: from the repository root, where relative data paths start; the test sets
    go to ``<out>/../test_sets``."""
    command = [sys.executable, "stages/download.py", "--params", str(params), "--out", str(out)]
    command += [
        "--test-sets",
        str(out.parent / "test_sets"),
        "--benchmarks-summary",
        str(out.parent / "benchmarks.json"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)


def test_own_data_and_test_sets_are_verified_and_converted_to_gsm8k_lines(tmp_path, full_scale_params):
    out = tmp_path / "gsm8k"
    result = run_download(own_data_params(tmp_path, full_scale_params), out)
    assert result.returncode == 0, result.stderr
    assert "train 280, val 20, test 60, test set shifted 60" in result.stdout
    train, test = load_gsm8k(out / "train.jsonl"), load_gsm8k(out / "test.jsonl")
    shifted = load_gsm8k(tmp_path / "test_sets" / "shifted.jsonl")
    assert (len(train), len(test), len(shifted)) == (280, 60, 60)
    assert json.loads((tmp_path / "test_sets" / TEST_SETS_INDEX).read_text(encoding="utf-8")) == {"shifted": 60}
    first = json.loads((REPO / EXAMPLE_DATA / "test.jsonl").read_text().splitlines()[0])
    assert test[0].question == first["problem"]
    assert f"\\boxed{{{test[0].answer}}}" in first["solution"] and test[0].reasoning in first["solution"]
    # Off the training distribution: more steps (a reasoning line each) than any training example has.
    assert min(len(e.reasoning.splitlines()) for e in shifted) > max(len(e.reasoning.splitlines()) for e in train)


def test_without_test_sets_their_directory_holds_the_index_alone(tmp_path):
    """DVC warns "'data/test_sets' is empty" each time it saves or hashes an empty output directory: under the
    default params (no eval.test_sets) the directory holds the index, ``{}``."""
    train, test = (partial(given_lines, arithmetic_lines(size, seed, 2, 9)) for seed, size in ((0, 30), (1, 10)))
    write_data(train, test, {}, 5, 0, tmp_path / "gsm8k", tmp_path / "test_sets")
    assert [path.name for path in (tmp_path / "test_sets").iterdir()] == [TEST_SETS_INDEX]
    assert json.loads((tmp_path / "test_sets" / TEST_SETS_INDEX).read_text(encoding="utf-8")) == {}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sha256": "0" * 64}, r"shifted.jsonl: SHA-256 36f0.* does not match eval.test_sets\[0\].sha256 = 0{64}; "),
        ({"path": "examples/nowhere.jsonl"}, r"examples/nowhere.jsonl: no such file \(eval.test_sets\[0\].path; "),
        ({"answer_format": "number"}, r"shifted.jsonl:1: the answer read from 'solution' \(answer_format number\)"),
    ],
)
def test_a_bad_test_set_stops_the_download_in_one_line_and_leaves_nothing(
    tmp_path, full_scale_params, changes, message
):
    out = tmp_path / "gsm8k"
    result = run_download(own_data_params(tmp_path, full_scale_params, **changes), out)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert re.search(message, result.stderr), result.stderr
    assert not out.exists() and not (tmp_path / "test_sets").exists()


# Issue 29: own data streamed (memory flat in file size), a cap on URL downloads, held-out questions found in train.

FIELDS = {"question_field": "question", "answer_field": "answer", "answer_format": "gsm8k"}


def write_own(path: Path, megabytes: float, first: int = 0, questions: dict[int, str] | None = None) -> str:
    """A GSM8K-style file of about ``megabytes`` (lines of ~4 KB of reasoning), written in chunks; its SHA-256."""
    reasoning = "Tom counts 2 + 3 = <<2+3=5>>5 apples again. " * 90
    lines, size, number = [], 0, first
    with path.open("w", encoding="utf-8") as out:
        while size < megabytes * 1e6:
            question = (questions or {}).get(number, f"Problem {number}: how many apples does Tom have?")
            lines.append(json.dumps({"question": question, "answer": f"{reasoning}\n#### 5"}) + "\n")
            size, number = size + len(lines[-1]), number + 1
            if len(lines) == 1000:
                out.writelines(lines)
                lines = []
        out.writelines(lines)
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def own_params(tmp_path: Path, full_scale_params: str, files: dict[str, tuple[str, str]], **data: object) -> Path:
    tree = yaml.safe_load(full_scale_params)
    tree["data"] |= {"name": "jsonl", "val_size": 5, **data}
    tree["data"]["jsonl"] = {split: {"path": path, "sha256": sha} for split, (path, sha) in files.items()} | FIELDS
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


# VmHWM: the peak of this process's own memory map (ru_maxrss would also count the parent's, from before the exec).
PEAK = (
    "import re, runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
    "print(re.search(r'VmHWM:.*', open('/proc/self/status').read()).group(), file=sys.stderr)"
)


def test_own_data_is_converted_in_memory_flat_in_the_file_size(tmp_path, full_scale_params):
    """The stage's peak resident memory on a 20 MB and an 80 MB train file: the same within a few MB (it read each
    file whole, four copies at once, before)."""
    peaks = {}
    test = (str(tmp_path / "test.jsonl"), write_own(tmp_path / "test.jsonl", 0.1, first=10**6))
    for megabytes in (20, 80):
        train = tmp_path / f"train{megabytes}.jsonl"
        params = own_params(
            tmp_path, full_scale_params, {"train": (str(train), write_own(train, megabytes)), "test": test}
        )
        out = tmp_path / f"out{megabytes}"
        command = [sys.executable, "-c", PEAK, "stages/download.py", "--params", str(params), "--out", str(out)]
        command += ["--test-sets", str(tmp_path / f"sets{megabytes}")]
        command += ["--benchmarks-summary", str(tmp_path / f"benchmarks{megabytes}.json")]
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        peaks[megabytes] = int(re.search(r"VmHWM:\s*(\d+) kB", result.stderr).group(1)) / 1024
        assert (out / "train.jsonl").stat().st_size + (out / "val.jsonl").stat().st_size > megabytes * 1e6 * 0.9
        train.unlink()
    assert peaks[80] - peaks[20] < 8, peaks  # MiB: 60 MB more of file


class Files(http.server.SimpleHTTPRequestHandler):
    """Serves a directory; under ``/unannounced/`` without a Content-Length (the body ends when the connection
    closes), as some servers send."""

    def do_GET(self) -> None:
        if not self.path.startswith("/unannounced/"):
            return super().do_GET()
        body = Path(self.translate_path(self.path.removeprefix("/unannounced"))).read_bytes()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path):
    """A directory served over HTTP on localhost from a thread, and its URL."""
    directory = tmp_path / "www"
    directory.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Files, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield directory, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_url_larger_than_data_max_download_bytes_is_refused_and_leaves_the_outputs(served, tmp_path):
    directory, url = served
    sha256 = {"train": write_own(directory / "train.jsonl", 0.3), "test": write_own(directory / "test.jsonl", 0.02)}
    fields = JsonlFields(**FIELDS)

    def splits(base: str, cap: int) -> list[partial]:
        return [
            partial(jsonl_file_lines, f"{base}/{split}.jsonl", sha256[split], fields, f"data.jsonl.{split}", cap)
            for split in ("train", "test")
        ]

    out, sets = tmp_path / "gsm8k", tmp_path / "test_sets"
    assert write_data(*splits(url, 10**6), {}, 5, 0, out, sets).counts["val"] == 5  # under the cap: as a local file
    before = (out / "train.jsonl").read_bytes()
    for base, how in ((url, r"it announces \d+"), (f"{url}/unannounced", "more arrived")):
        message = rf"^{re.escape(base)}/train.jsonl: larger than data.max_download_bytes = 100000 bytes \({how}\); "
        with pytest.raises(DataFormatError, match=message + "raise data.max_download_bytes to download it$"):
            write_data(*splits(base, 100_000), {}, 5, 0, out, sets)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["gsm8k", "test_sets", "www"]  # no download left
        assert (out / "train.jsonl").read_bytes() == before


def test_max_download_bytes_is_validated(params_file):
    apply_to_file({"data.max_download_bytes": 0}, params_file)
    with pytest.raises(ConfigError, match=r"data.max_download_bytes: must be ≥ 1, got 0$"):
        load_params(params_file)


def test_held_out_questions_asked_in_the_train_file_are_counted_in_a_warning(tmp_path, full_scale_params):
    """Compared ignoring case and spacing: the test file asks 2 of the training questions, the extra test set is the
    train file itself."""
    train = (str(tmp_path / "train.jsonl"), write_own(tmp_path / "train.jsonl", 0.05))
    asked = {
        10**6: "  PROBLEM 3:  how many APPLES does tom have?",
        10**6 + 1: "Problem 7: how many apples does Tom have?",
    }
    test = (str(tmp_path / "test.jsonl"), write_own(tmp_path / "test.jsonl", 0.02, first=10**6, questions=asked))
    params = own_params(tmp_path, full_scale_params, {"train": train, "test": test})
    tree = yaml.safe_load(params.read_text())
    tree["eval"]["test_sets"] = [{"name": "test", "path": train[0], "sha256": train[1]} | FIELDS]  # no clash
    params.write_text(yaml.safe_dump(tree, sort_keys=False))
    result = run_download(params, tmp_path / "gsm8k")
    assert result.returncode == 0, result.stderr
    assert "train 8, val 5, test 5, test set test 13" in result.stdout
    assert result.stderr.splitlines() == [
        f"warning: {count} of the {size} {name} questions are asked in the train file too (compared ignoring case and "
        "spacing): their scores measure recall more than reasoning"
        for count, size, name in ((2, 5, "test"), (13, 13, "test set test"))
    ]

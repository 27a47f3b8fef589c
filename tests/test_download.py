"""download stage: checksum, validation, train/val split, and no output left behind on failure."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.config import ConfigError
from reasonrl.data import DataFormatError, download_gsm8k, load_gsm8k, resolve_source, split_train_val
from reasonrl.errors import UserError

REPO = Path(__file__).resolve().parents[1]
OFFICIAL = {
    "train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
}


def test_mirror_download_verifies_and_splits(gsm8k_mirror, tmp_path):
    out = tmp_path / "gsm8k"
    counts = download_gsm8k(str(gsm8k_mirror), OFFICIAL, val_size=500, split_seed=0, out_dir=out)
    assert counts == {"train": 6973, "val": 500, "test": 1319}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gsm8k"]  # no staging directory left
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
        [sys.executable, str(REPO / "stages/download.py"), "--params", str(params), "--out", str(tmp_path / "d")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {params}: data.val_size: must be ≥ 1, got -3"
    assert not (tmp_path / "d").exists()

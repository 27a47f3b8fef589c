"""``make demo``'s steps around DVC (reasonrl.demo): params.yaml checked and the preset written in, and the headline
table it ends with. The whole flow, through make and DVC, runs in tests/test_ablation_e2e.py."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from reasonrl.demo import DemoError, format_duration, format_p, headline_table, prepare_params
from reasonrl.evaluation import summarize
from reasonrl.presets import apply_to_file, load_preset
from reasonrl.report.tables import format_accuracy
from reasonrl.routes import ROUTES


def graded(right: int, total: int = 40) -> list[dict]:
    return [
        {"question_index": q, "question": f"q{q}", "reward": float(q < right), "format_reward": 1.0, "length": 5}
        for q in range(total)
    ]


def write_reports(reports, p_values: dict[str, float], seconds: dict[str, float]) -> dict:
    """The files the table reads, as final_eval and the training stages write them."""
    final = {route: summarize(graded(right)) for route, right in zip(ROUTES, (0, 12, 17, 18), strict=True)}
    for route, reference in (("sft", "base"), ("ei", "sft"), ("grpo", "sft")):
        final[route]["paired"] = {"reference": reference, "test": "mcnemar_exact", "p_value": p_values[route]}
    (reports / "final").mkdir(parents=True)
    (reports / "final" / "metrics.json").write_text(json.dumps(final))
    for route, value in seconds.items():
        (reports / route).mkdir()
        (reports / route / "metrics.json").write_text(json.dumps({"wall_clock_seconds": value}))
    return final


def test_the_headline_table_has_intervals_small_p_values_and_wall_clock(tmp_path):
    p_values = {"sft": 1.4e-48, "ei": 3.5e-07, "grpo": 0.2188}
    final = write_reports(tmp_path, p_values, {"sft": 151.4, "ei": 59.6, "grpo": 3723.0})
    caption, blank, header, *rows = headline_table(tmp_path).splitlines()
    assert caption.startswith("Test accuracy on 40 answers to 40 test questions, with its 95% Wilson score interval")
    assert blank == "" and header.split("  ")[0] == "route" and "training wall clock" in header
    cells = [re.split(r" {2,}", row) for row in rows]
    assert [row[0] for row in cells] == list(ROUTES)
    assert cells[0] == ["base", format_accuracy(final["base"]), "—", "—", "—"]
    assert cells[1] == ["sft", format_accuracy(final["sft"]), "base", "1.4e-48", "2 min 31 s"]
    assert cells[2][2:] == ["sft", "3.5e-07", "1 min 00 s"]  # DVC's own tables round this p-value to 0.0
    assert cells[3][2:] == ["sft", "0.22", "62 min 03 s"]
    for column in ("test accuracy", "paired test against", "p ", "training wall clock"):  # aligned columns
        start = header.index(column)
        assert all(row[start - 2 : start] == "  " and row[start] != " " for row in rows), column


def test_p_values_keep_two_significant_digits_and_durations_read_as_minutes():
    assert [format_p(p) for p in (3.5e-07, 1.4e-48, 0.2188, 1.0)] == ["3.5e-07", "1.4e-48", "0.22", "1"]
    assert [format_duration(s) for s in (None, 0.4, 59.4, 59.6, 151.4)] == ["—", "0 s", "59 s", "1 min 00 s",
                                                                            "2 min 31 s"]  # fmt: skip


@pytest.fixture
def committed_params(tmp_path, monkeypatch, full_scale_params):
    """A git repository whose commit holds the full-scale params.yaml; the current directory."""
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(full_scale_params, encoding="utf-8")
    for command in (["init", "-q"], ["add", "params.yaml"], ["commit", "-qm", "params"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *command], check=True, timeout=60)
    return params


def value_at(path, key):
    value = yaml.safe_load(path.read_text(encoding="utf-8"))
    for part in key.split("."):
        value = value[part]
    return value


def test_the_demo_params_are_the_committed_ones_with_the_preset_twice_in_a_row(committed_params):
    preset = load_preset("cpu")
    apply_to_file({"sft.max_steps": 7}, committed_params)  # a preset param set by hand: the preset's value wins
    for _ in range(2):
        prepare_params(Path("params.yaml"), "cpu")
        assert all(value_at(committed_params, key) == value for key, value in preset.items())


def test_what_an_experiment_left_in_params_yaml_is_refused_by_name(committed_params, full_scale_params):
    apply_to_file({"grpo.loss_type": "no_baseline"}, committed_params)  # as `dvc exp run -S` leaves it
    before = committed_params.read_text(encoding="utf-8")
    with pytest.raises(DemoError) as refused:
        prepare_params(Path("params.yaml"), "cpu")
    assert str(refused.value).startswith(
        'params.yaml sets grpo.loss_type: "no_baseline", unlike the committed params with the cpu preset, which the '
        "demo runs: an experiment run here (`dvc exp run -S`) leaves its values in params.yaml. "
    )
    assert "`git checkout params.yaml` restores the committed params" in str(refused.value)
    assert "`dvc exp apply demo` brings back the recorded demo" in str(refused.value)
    assert committed_params.read_text(encoding="utf-8") == before  # nothing written
    committed_params.write_text(full_scale_params, encoding="utf-8")
    apply_to_file({"model.name": "tiny"}, committed_params)  # a preset's param, with no preset asked for
    with pytest.raises(DemoError, match=r'^params.yaml sets model.name: "tiny", unlike the committed params as they'):
        prepare_params(Path("params.yaml"), None)


def test_params_outside_a_git_commit_are_named(tmp_path, monkeypatch, full_scale_params):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(full_scale_params, encoding="utf-8")
    with pytest.raises(DemoError, match=r"^params.yaml: not in a git commit \(.*\); the demo is a DVC experiment"):
        prepare_params(Path("params.yaml"), "cpu")

"""GRPO stage resume: kill -9 mid-run, rerun, and end with exactly the weights of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from reasonrl.presets import apply_to_file, load_preset
from reasonrl.synthetic import arithmetic_lines

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
OVERRIDES = {
    "eval.max_tokens": 16,
    "grpo.init_model": "base",
    "grpo.n_grpo_steps": 6,
    "grpo.checkpoint_every": 2,
    "grpo.eval_every": 3,
    "grpo.eval_examples": 4,
    "grpo.rollout_batch_size": 16,
    "grpo.group_size": 4,
    "grpo.train_batch_size": 8,
    "grpo.gradient_accumulation_steps": 2,
    "grpo.epochs_per_rollout_batch": 2,
    "grpo.loss_type": "grpo_clip",
    "grpo.max_tokens": 16,
}


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory, tiny_model_dir, full_scale_params):
    root = tmp_path_factory.mktemp("grpo_stage")
    data = root / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("\n".join(arithmetic_lines(64, 0, 1, 9)) + "\n")
    (data / "val.jsonl").write_text("\n".join(arithmetic_lines(8, 1, 1, 9)) + "\n")
    params = root / "params.yaml"
    params.write_text(full_scale_params)
    apply_to_file({**load_preset("cpu"), **OVERRIDES}, params)
    return root, params, data, tiny_model_dir


def stage_command(params: Path, data: Path, model: Path, out: Path) -> list[str]:
    return [
        sys.executable, str(REPO / "stages/grpo.py"), "--params", str(params),
        "--base", str(model), "--sft", str(model), "--ei", str(model), "--data", str(data),
        "--out", str(out / "grpo"), "--checkpoints", str(out / "checkpoints"),
        "--metrics", str(out / "metrics.json"), "--live", str(out / "live"),
    ]  # fmt: skip


def test_resume_after_kill_matches_uninterrupted_run(stage_inputs):
    root, params, data, model = stage_inputs
    uninterrupted, resumed = root / "uninterrupted", root / "resumed"
    subprocess.run(stage_command(params, data, model, uninterrupted), check=True, capture_output=True)

    process = subprocess.Popen(
        stage_command(params, data, model, resumed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while not list((resumed / "checkpoints").glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the stage finished before it could be killed"
    killed_at = sorted(p.name for p in (resumed / "checkpoints").glob("step-*"))
    assert killed_at and not (resumed / "grpo" / "final").exists()

    rerun = subprocess.run(stage_command(params, data, model, resumed), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {resumed / 'checkpoints' / killed_at[-1]}" in rerun.stdout + rerun.stderr

    for kind in ("final", "best"):
        expected = load_file(uninterrupted / "grpo" / kind / "model.safetensors")
        actual = load_file(resumed / "grpo" / kind / "model.safetensors")
        assert expected.keys() == actual.keys()
        for name in expected:
            assert (expected[name] == actual[name]).all(), f"{kind}/{name} differs after resume"
    assert json.loads((uninterrupted / "metrics.json").read_text()) == json.loads(
        (resumed / "metrics.json").read_text()
    )
    # the resumed curves continue the killed run's: one row per optimizer step, none repeated
    rows = (resumed / "live/plots/metrics/train/loss.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[0] for row in rows] == [str(step) for step in range(1, 6 * 2 * 2 + 1)]


def test_checkpoint_of_other_params_is_not_resumed(stage_inputs):
    root, params, data, model = stage_inputs
    out = root / "changed"
    subprocess.run(stage_command(params, data, model, out), check=True, capture_output=True)
    changed = root / "changed_params.yaml"
    changed.write_text(params.read_text())
    apply_to_file({"grpo.learning_rate": 5e-5, "grpo.n_grpo_steps": 4}, changed)
    (out / "checkpoints" / "step-000004").exists() or pytest.fail("expected a checkpoint from the first run")
    rerun = subprocess.run(stage_command(changed, data, model, out), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "was made with other params; starting afresh" in rerun.stdout + rerun.stderr

"""SFT resume (issue 23, item 5) and the policies kept for later (item 6): the sft stage killed with SIGKILL once a
checkpoint is on disk, rerun, ends with exactly the weights, card, metrics, curves and kept policies of an
uninterrupted run. (Expert iteration's crash-and-resume runs in-process, in test_generation_phases.py, where a reward
that keeps every rollout makes its rounds train.)"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from side_by_side import ONE_THREAD, alongside, started_to_be_killed
from transformers import AutoModelForCausalLM

from reasonrl.models import MODEL_CARD
from reasonrl.presets import apply_to_file, load_preset
from reasonrl.synthetic import arithmetic_lines

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
OVERRIDES = {
    "eval.max_tokens": 16,
    "sft.max_steps": 40,
    "sft.batch_size": 8,
    "sft.microbatch_size": 8,
    "sft.checkpoint_every": 10,
    "sft.eval_every": 20,
    "sft.eval_examples": 4,
    "sft.keep_every": 20,
    # A decaying rate after a warm-up (8% of 40 steps): the resumed run must take the schedule up where it was.
    "sft.lr_schedule": "cosine",
    "sft.warmup_ratio": 0.08,
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir, full_scale_params):
    root = tmp_path_factory.mktemp("sft_resume")
    data = root / "data"
    data.mkdir()
    (data / "val.jsonl").write_text("\n".join(arithmetic_lines(8, 1, 1, 9)) + "\n")
    pairs = root / "pairs"
    pairs.mkdir()
    with (pairs / "filtered.jsonl").open("w") as stream:
        # the bare question as the prompt: the r1_zero template would make each step several times longer
        for record in map(json.loads, arithmetic_lines(256, 0, 1, 9)):
            reasoning, answer = record["answer"].split("\n#### ")
            response = f" {reasoning} </think> <answer> {answer} </answer>"
            stream.write(json.dumps({"prompt": record["question"], "response": response}) + "\n")
    params = root / "params.yaml"
    params.write_text(full_scale_params)
    apply_to_file({**load_preset("cpu"), **OVERRIDES}, params)
    return root, params, data, pairs


def sft_command(inputs, model: Path, out: Path) -> list[str]:
    _, params, data, pairs = inputs
    return [
        sys.executable, str(REPO / "stages/sft.py"), "--params", str(params), "--model", str(model),
        "--pairs", str(pairs), "--data", str(data), "--out", str(out / "model"),
        "--checkpoints", str(out / "checkpoints"), "--kept", str(out / "kept"),
        "--metrics", str(out / "metrics.json"), "--cost", str(out / "cost.json"), "--live", str(out / "live"),
    ]  # fmt: skip


def kill_and_rerun(command: list[str], checkpoint: Path) -> str:
    """Run ``command``, SIGKILL it once ``checkpoint`` is on disk, rerun it to the end; the rerun's log."""
    process = started_to_be_killed(command)
    deadline = time.monotonic() + 300
    while not checkpoint.is_dir() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the stage finished before it could be killed"
    rerun = subprocess.run(command, capture_output=True, text=True, env=ONE_THREAD)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    return rerun.stdout + rerun.stderr


def assert_same_run(uninterrupted: Path, resumed: Path, curve: str, rows: int) -> None:
    expected, actual = (load_file(run / "model/model.safetensors") for run in (uninterrupted, resumed))
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected), "the weights differ after resume"
    cards = [(run / "model" / MODEL_CARD).read_text(encoding="utf-8") for run in (uninterrupted, resumed)]
    assert cards[0] == cards[1] and "95% interval [" in cards[0]
    expected, actual = (json.loads((run / "metrics.json").read_text()) for run in (uninterrupted, resumed))
    assert expected.pop("wall_clock_seconds") > 0 and actual.pop("wall_clock_seconds") > 0
    assert expected == actual
    # the resumed curves continue the killed run's: one row per step, none repeated, the values the same
    tables = [(run / "live/plots/metrics" / curve).read_text().splitlines()[1:] for run in (uninterrupted, resumed)]
    assert [row.split("\t")[0] for row in tables[1]] == [str(step) for step in range(1, rows + 1)]
    assert tables[0] == tables[1]
    # a completed run leaves no checkpoint behind
    assert not list((resumed / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def sft_runs(inputs, tiny_model_dir):
    root = inputs[0]
    uninterrupted, resumed = root / "sft_uninterrupted", root / "sft_resumed"
    with alongside(sft_command(inputs, tiny_model_dir, uninterrupted), root / "sft_uninterrupted.log"):
        log = kill_and_rerun(sft_command(inputs, tiny_model_dir, resumed), resumed / "checkpoints/step-000010")
    return uninterrupted, resumed, log


def test_sft_resumes_after_kill_as_an_uninterrupted_run(sft_runs, tiny_model_dir):
    """Killed once step 10's checkpoint is on disk (of 40): the rerun resumes from a checkpoint, and its best model,
    card, metrics and curves are the uninterrupted run's."""
    uninterrupted, resumed, log = sft_runs
    resumed_at = int(log.split("SFT: resuming from ")[1].split("(step ")[1].split(")")[0])
    assert 10 <= resumed_at < 40
    assert_same_run(uninterrupted, resumed, "train/loss.tsv", 40)
    card = (resumed / "model" / MODEL_CARD).read_text()
    # The params file is in no git repository: the card lists every param, by section.
    assert "\n### sft\n" in card and "| `sft.lr_schedule` | `cosine` |" in card
    init, final = load_file(tiny_model_dir / "model.safetensors"), load_file(resumed / "model/model.safetensors")
    assert any(not torch.equal(init[name], final[name]) for name in init), "weights never moved"


def test_sft_keeps_the_policy_every_keep_every_steps(sft_runs):
    """``sft.keep_every: 20`` of 40 steps: step_000020 and step_000040, each a plain HF directory with a card that
    ``from_pretrained`` loads; the resumed run's equal the uninterrupted run's."""
    uninterrupted, resumed, _ = sft_runs
    names = ["step_000020", "step_000040"]
    assert sorted(path.name for path in (resumed / "kept").iterdir()) == names
    for name in names:
        kept = resumed / "kept" / name
        assert f"the policy after optimizer step {int(name[5:])}" in (kept / MODEL_CARD).read_text(encoding="utf-8")
        model = AutoModelForCausalLM.from_pretrained(kept)
        expected = load_file(uninterrupted / "kept" / name / "model.safetensors")
        assert all(torch.equal(tensor, expected[key]) for key, tensor in model.state_dict().items() if key in expected)
        assert load_file(kept / "model.safetensors").keys() == expected.keys()

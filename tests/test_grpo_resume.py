"""GRPO resume: kill -9 mid-run, rerun past a newest checkpoint cut short, and end with exactly the weights of an
uninterrupted run; a completed run leaves nothing to resume; a checkpoint made from other inputs (model, params,
data) is never resumed, nor one whose rollouts in flight were edited or are not the ones its step needs."""

import contextlib
import copy
import io
import json
import os
import shutil
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

from reasonrl.cli import open_live
from reasonrl.config import EngineConfig, EvalConfig, GRPOConfig, TinyModelSpec
from reasonrl.data import parse_lines
from reasonrl.grpo import TrainingState, grpo_checkpoints, run_grpo
from reasonrl.presets import apply_to_file, load_preset
from reasonrl.rollouts.drawing import draw_rollouts, step_seed
from reasonrl.rollouts.engine import RolloutEngine
from reasonrl.rollouts.sources import in_flight_versions
from reasonrl.rollouts.types import StepRollouts
from reasonrl.synthetic import arithmetic_lines
from reasonrl.tiny_model import build_tiny_model
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.policy import load_policy

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
    # The tiny random model earns no reward, hence no advantage: without a KL penalty every optimizer step would be
    # skipped (no signal) and the weights never move; weight decay moves them off the reference in the first step.
    "grpo.kl_coef": 0.04,
    "grpo.weight_decay": 0.1,
    # A decaying rate after a warm-up that ends in the first checkpoint's interval: the resumed run must take it up.
    "grpo.lr_schedule": "cosine",
    "grpo.warmup_steps": 3,
    # Policies kept for later at steps 3 and 6: one before the kill, one after the resume.
    "grpo.keep_every": 3,
    # The KL reference becomes the policy after steps 3 and 6: the first resume (from step 2) must take the refresh up,
    # the asynchronous one (from step 4) must restore the refreshed reference from its checkpoint.
    "grpo.ref_update_every": 3,
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
    models = root / "models"  # the stage starts from models/<grpo.init_model>
    models.mkdir()
    (models / "base").symlink_to(tiny_model_dir)
    return root, params, data, models


def stage_command(params: Path, data: Path, models: Path, out: Path) -> list[str]:
    return [
        sys.executable, str(REPO / "stages/grpo.py"), "--params", str(params),
        "--models", str(models), "--data", str(data),
        "--out", str(out / "grpo"), "--checkpoints", str(out / "checkpoints"), "--kept", str(out / "kept"),
        "--metrics", str(out / "metrics.json"), "--cost", str(out / "cost.json"), "--live", str(out / "live"),
    ]  # fmt: skip


def wait_for(path: Path, deadline: float) -> None:
    while not path.is_dir() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_resume_after_kill_matches_uninterrupted_run(stage_inputs):
    """Killed once step 4's checkpoint is in place, with step 2's put back beside it (as a kill between the rename
    and the clean-up leaves it) and step 4's file cut short (as a crash before it reached the disk): the rerun
    names the bad file, resumes from step 2 and ends as the uninterrupted run."""
    root, params, data, model = stage_inputs
    uninterrupted, resumed = root / "uninterrupted", root / "resumed"
    with alongside(stage_command(params, data, model, uninterrupted), root / "uninterrupted.log"):
        process = started_to_be_killed(stage_command(params, data, model, resumed))
        checkpoints, deadline = resumed / "checkpoints", time.monotonic() + 300
        wait_for(checkpoints / "step-000002", deadline)
        shutil.copytree(checkpoints / "step-000002", root / "step-000002")  # before step 4's replaces it
        wait_for(checkpoints / "step-000004", deadline)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL, "the stage finished before it could be killed"
        assert (checkpoints / "step-000004").is_dir() and not (resumed / "grpo" / "final").exists()
        shutil.copytree(root / "step-000002", checkpoints / "step-000002", dirs_exist_ok=True)
        os.truncate(checkpoints / "step-000004/checkpoint.pt", 1000)

        rerun = subprocess.run(
            stage_command(params, data, model, resumed), capture_output=True, text=True, env=ONE_THREAD
        )
    # a completed run leaves no checkpoint behind: a rerun starts afresh, it does not resume a finished run
    assert (uninterrupted / "checkpoints").is_dir() and not list((uninterrupted / "checkpoints").iterdir())
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    log = rerun.stdout + rerun.stderr
    assert f"GRPO: {checkpoints / 'step-000004/checkpoint.pt'} is damaged: 1,000 bytes, " in log
    assert f"; set aside as {checkpoints / 'step-000004.damaged'}; trying the previous checkpoint\n" in log
    assert f"resuming from {checkpoints / 'step-000002'} (step 2)" in log

    for kind in ("final", "best"):
        expected = load_file(uninterrupted / "grpo" / kind / "model.safetensors")
        actual = load_file(resumed / "grpo" / kind / "model.safetensors")
        assert expected.keys() == actual.keys()
        for name in expected:
            assert (expected[name] == actual[name]).all(), f"{kind}/{name} differs after resume"
    # The cards match too: the best step's validation interval survives the resume.
    for kind in ("final", "best"):
        card = (resumed / "grpo" / kind / "README.md").read_text(encoding="utf-8")
        assert card == (uninterrupted / "grpo" / kind / "README.md").read_text(encoding="utf-8")
        # the params file is in no git repository: the card lists every param, by section
        assert "95% interval [" in card and "\n### grpo\n" in card and "| `grpo.lr_schedule` | `cosine` |" in card
    init, final = load_file(model / "base/model.safetensors"), load_file(resumed / "grpo/final/model.safetensors")
    assert any(not torch.equal(init[name], final[name]) for name in init.keys() & final.keys()), "weights never moved"
    expected, actual = (json.loads((run / "metrics.json").read_text()) for run in (uninterrupted, resumed))
    assert expected.pop("wall_clock_seconds") > 0 and actual.pop("wall_clock_seconds") > 0  # the clock differs
    assert expected == actual
    # the resumed curves continue the killed run's: one row per optimizer step, none repeated
    rows = (resumed / "live/plots/metrics/train/loss.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[0] for row in rows] == [str(step) for step in range(1, 6 * 2 * 2 + 1)]
    # the policies kept every 3 steps: plain HF directories with a card, the uninterrupted run's weights
    assert sorted(path.name for path in (resumed / "kept").iterdir()) == ["step_000003", "step_000006"]
    for name in ("step_000003", "step_000006"):
        kept = resumed / "kept" / name
        assert f"the policy after step {int(name[5:])}" in (kept / "README.md").read_text(encoding="utf-8")
        loaded = AutoModelForCausalLM.from_pretrained(kept).state_dict()
        expected = load_file(uninterrupted / "kept" / name / "model.safetensors")
        assert all(torch.equal(loaded[key], tensor) for key, tensor in expected.items())
    final = load_file(uninterrupted / "grpo/final/model.safetensors")
    kept = load_file(uninterrupted / "kept/step_000006/model.safetensors")
    assert all(torch.equal(kept[key], tensor) for key, tensor in final.items())


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """One engine for every library run: ``run_grpo`` syncs its policy's weights into it before sampling."""
    return RolloutEngine(tiny_model_dir, EngineConfig(cpu_kv_cache_gib=1, max_model_len=1024, enforce_eager=True))


def run_library_grpo(engine, model_dir: Path, train, work: Path, learning_rate: float = 1e-4) -> str:
    """``run_grpo`` as the stage calls it, minus the clean-up: a checkpoint at step 2 stays. Returns its log."""
    policy, tokenizer = load_policy(model_dir, torch.device("cpu"))
    config = GRPOConfig(
        n_grpo_steps=3, learning_rate=learning_rate, rollout_batch_size=8, group_size=4,
        train_batch_size=8, gradient_accumulation_steps=2, max_tokens=12, eval_every=100, eval_examples=2,
        checkpoint_every=2,
    )  # fmt: skip
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        run_grpo(
            policy, tokenizer, engine, train, train[:2], config, EvalConfig(max_tokens=12),
            open_live=lambda resume: open_live(str(work / "live"), resume=resume), live_dir=work / "live",
            checkpoint_dir=work / "checkpoints", init_model_dir=model_dir,
        )  # fmt: skip
    return log.getvalue()


@pytest.mark.parametrize("change", ["init model", "params", "data"])
def test_a_checkpoint_made_from_other_inputs_is_not_resumed(engine, tmp_path, tiny_tokenizer, change):
    """Model A trains and leaves a checkpoint; then one input changes in place (model B written into the same
    directory, another learning rate, other data) and the next run must start afresh from the new inputs."""
    train = parse_lines(arithmetic_lines(16, 0, 1, 9), "train")
    model_dir = tmp_path / "model"
    build_tiny_model(tiny_tokenizer, TinyModelSpec(), seed=0).save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    run_library_grpo(engine, model_dir, train, tmp_path / "run")
    assert (tmp_path / "run/checkpoints/step-000002").is_dir()

    kwargs = {}
    if change == "init model":
        build_tiny_model(tiny_tokenizer, TinyModelSpec(), seed=1).save_pretrained(model_dir)
    elif change == "params":
        kwargs["learning_rate"] = 2e-4
    else:
        train = parse_lines(arithmetic_lines(16, 5, 1, 9), "train")
    log = run_library_grpo(engine, model_dir, train, tmp_path / "run", **kwargs)
    made_from = "made from other inputs (params, init model, data, code, prompt templates, reward or library versions)"
    assert made_from in log
    assert "resuming" not in log

    # the same inputs again do resume the checkpoint the second run left
    assert "resuming from" in run_library_grpo(engine, model_dir, train, tmp_path / "run", **kwargs)


def child_pids(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return children


def test_asynchronous_run_resumes_with_its_batches_in_flight(stage_inputs, tmp_path):
    """``max_staleness: 2``: killed (-9) once step 4's checkpoint is on disk, with the rollouts of steps 4 to 6
    drawn by older weights in it (and the KL reference refreshed after step 3), the stage's engine process ends on
    its own, and the rerun ends with exactly the weights, metrics and curves of an uninterrupted run."""
    root, _, data, model = stage_inputs
    params = tmp_path / "params.yaml"
    params.write_text((root / "params.yaml").read_text())
    apply_to_file({"grpo.max_staleness": 2, "grpo.rollout_is_cap": 2.0, "grpo.n_grpo_steps": 7}, params)
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    with alongside(stage_command(params, data, model, uninterrupted), tmp_path / "uninterrupted.log"):
        process = started_to_be_killed(stage_command(params, data, model, resumed))
        wait_for(resumed / "checkpoints" / "step-000004", time.monotonic() + 300)
        engines = child_pids(process.pid)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL, "the stage finished before it could be killed"
        saved = json.loads((resumed / "checkpoints/step-000004/state.json").read_text())
        # The KL reference there is the policy after step 3: neither the init model nor the checkpoint's own policy.
        tensors = torch.load(resumed / "checkpoints/step-000004/checkpoint.pt", weights_only=True)
        init, reference = load_file(model / "base/model.safetensors"), tensors["reference"]
        assert any(not torch.equal(init[name], reference[name]) for name in init)
        assert any(not torch.equal(tensors["policy"][name], reference[name]) for name in reference)
        # Steps 5 and 6 drawn by older weights are held; step 6's, drawn by the checkpoint's own, is requested anew.
        assert [drawn["step"] for drawn in saved["state"]["in_flight"]] == [4, 5]
        assert [drawn["version"] for drawn in saved["state"]["in_flight"]] == [2, 3]
        assert saved["state"]["to_request"] == [6]
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in engines) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert engines and not any(Path(f"/proc/{pid}").exists() for pid in engines), "the engine outlived its trainer"

        rerun = subprocess.run(
            stage_command(params, data, model, resumed), capture_output=True, text=True, env=ONE_THREAD
        )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {resumed / 'checkpoints/step-000004'} (step 4)" in rerun.stdout + rerun.stderr
    for kind in ("final", "best"):
        expected = load_file(uninterrupted / "grpo" / kind / "model.safetensors")
        actual = load_file(resumed / "grpo" / kind / "model.safetensors")
        assert all(torch.equal(expected[name], actual[name]) for name in expected), f"{kind} differs after resume"
    expected, actual = (json.loads((run / "metrics.json").read_text()) for run in (uninterrupted, resumed))
    assert expected.pop("wall_clock_seconds") > 0 and actual.pop("wall_clock_seconds") > 0
    assert expected == actual
    for curve in ("train/loss", "rollout/policy_lag", "train/is_weight_mean", "eval/accuracy"):
        expected, actual = ((run / f"live/plots/metrics/{curve}.tsv").read_text() for run in (uninterrupted, resumed))
        rows = [row.split("\t")[:2] for row in actual.splitlines()]
        assert rows == [row.split("\t")[:2] for row in expected.splitlines()], curve
    lags = (resumed / "live/plots/metrics/rollout/policy_lag.tsv").read_text().splitlines()[1:]
    assert [float(row.split("\t")[1]) for row in lags[::4]] == [0, 1, 2, 2, 2, 2, 2]  # 4 optimizer steps a step


ASYNC = GRPOConfig(
    n_grpo_steps=6, rollout_batch_size=8, group_size=4, train_batch_size=8, gradient_accumulation_steps=2,
    max_tokens=12, max_staleness=2, rollout_is_cap=2.0,
)  # fmt: skip


@pytest.fixture(scope="module")
def drawn(engine):
    """A step's rollouts, drawn by the engine, with the engine's log-probs: what a checkpoint holds in flight."""
    train = parse_lines(arithmetic_lines(16, 0, 1, 9), "train")
    with engine.serving():
        return draw_rollouts(engine, train, ASYNC, EvalConfig().stop, step_seed(ASYNC.seed, 0))


def checkpoint_in_flight(policy, directory: Path, step: int, drawn, versions: dict[int, int] | None = None) -> Path:
    """The checkpoint an asynchronous run of ``ASYNC`` writes after ``step`` steps, holding ``drawn`` as the
    rollouts of the steps ``versions`` maps to older policy versions (by default the ones it needs)."""
    versions = (
        in_flight_versions(step, ASYNC.asynchrony.max_staleness, ASYNC.n_grpo_steps) if versions is None else versions
    )
    state = TrainingState(
        step=step,
        in_flight=[StepRollouts(later, version, drawn, 0.5) for later, version in versions.items() if version < step],
        to_request=[later for later, version in versions.items() if version == step],
    )
    live = directory.parent / "live"
    live.mkdir(exist_ok=True)
    optimizer = torch.optim.AdamW(policy.parameters())
    grpo_checkpoints(directory, "fingerprint", policy, optimizer, BestCheckpoint(), live).save(state)
    return directory / f"step-{step:06d}"


def resume_async(policy, directory: Path, capsys) -> tuple[TrainingState, list[str]]:
    capsys.readouterr()
    optimizer = torch.optim.AdamW(policy.parameters())
    checkpoints = grpo_checkpoints(
        directory, "fingerprint", policy, optimizer, BestCheckpoint(), directory.parent / "live", config=ASYNC
    )
    state = checkpoints.resume()
    return state, capsys.readouterr().out.splitlines()


def edit_state(checkpoint: Path, edit) -> None:
    file = checkpoint / "state.json"
    saved = json.loads(file.read_text())
    edit(saved["state"])
    file.write_text(json.dumps(saved))


EDITS = {
    "step missing": lambda state: state["in_flight"].pop(0),
    "field missing": lambda state: state["in_flight"][0].pop("version"),
    "garbage": lambda state: state.update(in_flight="garbage"),
    "text changed": lambda state: [
        sample.update(text=sample["text"] + " x") for sample in state["in_flight"][0]["drawn"]["samples"]
    ],
    "token id changed": lambda state: state["in_flight"][1]["drawn"]["samples"][0]["token_ids"].append(0),
    "nothing to request": lambda state: state["to_request"].clear(),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("edit", EDITS)
def test_a_checkpoint_whose_rollouts_in_flight_were_edited_is_passed_over(tiny_model, drawn, tmp_path, capsys, edit):
    """Lag 2, checkpoints after steps 1 and 2, step 2's ``state.json`` edited in its rollouts in flight (steps 2 and
    3): the resume names the file in one line, sets the checkpoint aside, leaves the policy untouched by it and
    resumes step 1's checkpoint, its rollouts of steps 1 and 2 parsed; step 1's edited too: a fresh start."""
    policy, directory = copy.deepcopy(tiny_model), tmp_path / "checkpoints"
    shutil.copytree(checkpoint_in_flight(policy, directory, 1, drawn), tmp_path / "kept")
    at_step_1 = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(1.0)
    newest = checkpoint_in_flight(policy, directory, 2, drawn)
    shutil.copytree(tmp_path / "kept", directory / "step-000001")
    edit_state(newest, EDITS[edit])

    state, log = resume_async(policy, directory, capsys)
    assert log == [
        f"GRPO: {newest / 'state.json'}: its rollouts in flight do not match their digest in checkpoint.pt (edited?); "
        f"set aside as {directory / 'step-000002.damaged'}; trying the previous checkpoint",
        f"GRPO: resuming from {directory / 'step-000001'} (step 1)",
    ]
    assert all(torch.equal(tensor, at_step_1[name]) for name, tensor in policy.state_dict().items())
    assert [(rollouts.step, rollouts.version) for rollouts in state.in_flight] == [(1, 0), (2, 0)]
    assert state.in_flight[0].drawn == drawn and state.to_request == [3]

    edit_state(directory / "step-000001", EDITS[edit])
    state, log = resume_async(policy, directory, capsys)
    assert len(log) == 1 and state == TrainingState()
    assert log[0].endswith(f"(edited?); set aside as {directory / 'step-000001.damaged'}; starting afresh")


@pytest.mark.timeout(120)
def test_a_checkpoint_without_the_rollouts_its_step_needs_is_not_resumed(tiny_model, drawn, tmp_path, capsys):
    """Step 2's checkpoint as written, digest and all, but holding the rollouts of steps 2 and 4 (3's missing,
    4's drawn by weights it does not hold): refused in one line naming what it holds and what it needs."""
    directory = tmp_path / "checkpoints"
    checkpoint = checkpoint_in_flight(tiny_model, directory, 2, drawn, versions={2: 0, 4: 2})
    state, log = resume_async(copy.deepcopy(tiny_model), directory, capsys)
    assert log == [
        f"GRPO: {checkpoint / 'state.json'}: its rollouts in flight are of steps {{2: 0}} (step: policy version), to "
        f"request [4]; a run at step 2 holds {{2: 0, 3: 1}}, to request [4]; set aside as {checkpoint}.damaged; "
        "starting afresh"
    ]
    assert state == TrainingState()

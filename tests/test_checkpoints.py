"""The checkpoint store SFT and expert iteration share with GRPO (issue 23, item 5), without an engine: an SFT
checkpoint restores the weights, AdamW, the step count (the learning rate's place), the data order and the best
weights, so two steps then a resume and two more equal four uninterrupted steps; a checkpoint made from other inputs
(params, init model, data, code) is not resumed; one damaged on disk is set aside, not resumed; a full disk stops the
run in one line; the keep_every params and where the kept policies go."""

import copy
import re
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from dvc.env import DVC_EXP_BASELINE_REV, DVC_EXP_NAME, DVC_ROOT, DVC_STAGE

from reasonrl.atomic import LockedError
from reasonrl.code_deps import SOURCE
from reasonrl.config import ConfigError, EIConfig, EngineConfig, EvalConfig, GRPOConfig, SFTConfig, TinyModelSpec
from reasonrl.data import GSM8KExample, examples_digest
from reasonrl.errors import UserError
from reasonrl.expert_iteration import EI_STAGE, EIState
from reasonrl.sft import SFT_STAGE, Pair, SFTState, pairs_digest, sft_schedule, sft_steps
from reasonrl.tiny_model import build_tiny_model
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.checkpoints import (
    RunCheckpoints,
    checkpoint_lock,
    fingerprint,
    kept_directory,
    remove_checkpoints,
    resume,
    write_checkpoint,
)
from reasonrl.training.optimizer import make_optimizer

PAIRS = [
    Pair(f"User: {a} plus {b}?\nAssistant: <think>", f" {a} + {b} = {a + b} </think> <answer> {a + b} </answer>")
    for a in range(1, 5)
    for b in range(1, 4)
]  # 12 pairs: 3 steps of 4 per epoch, two epochs, so the resume crosses an epoch's reshuffle
CONFIG = SFTConfig(
    learning_rate=3e-3, batch_size=4, microbatch_size=2, epochs=2, lr_schedule="cosine", warmup_ratio=0.2
)


def train(policy, tokenizer, optimizer, schedule, start: int, stop: int) -> list[float]:
    steps = sft_steps(policy, tokenizer, optimizer, schedule, PAIRS, CONFIG, CONFIG.epochs, max_steps=stop, start=start)
    return [metrics["train/loss"] for metrics in steps]


def test_an_sft_checkpoint_resumes_to_the_uninterrupted_weights(tiny_model, tiny_tokenizer, tmp_path, capsys):
    """Four steps straight, against two steps, a checkpoint, a fresh policy resumed from it and steps 3-4 (the
    second epoch's first): the same losses and bit-identical weights; the best weights and curves come back."""
    schedule = sft_schedule(CONFIG, 6)
    uninterrupted = copy.deepcopy(tiny_model).train()
    optimizer = make_optimizer(uninterrupted, CONFIG.optimizer)
    losses = train(uninterrupted, tiny_tokenizer, optimizer, schedule, 0, 4)

    first = copy.deepcopy(tiny_model).train()
    optimizer = make_optimizer(first, CONFIG.optimizer)
    assert train(first, tiny_tokenizer, optimizer, schedule, 0, 2) == losses[:2]
    best = BestCheckpoint()
    best.offer(first, 0.5, 2, interval={"low": 0.1, "high": 0.9, "method": "wilson"})
    live = tmp_path / "live"
    (live / "plots").mkdir(parents=True)
    (live / "plots/loss.tsv").write_text("step\tloss\n1\t5.0\n2\t4.0\n")
    state = SFTState(step=2, best_accuracy=0.5, best_step=2, best_interval=best.interval)
    RunCheckpoints(tmp_path / "checkpoints", "inputs", "SFT", SFTState, first, optimizer, best, live).save(state)
    (live / "plots/loss.tsv").write_text("step\tloss\n1\t5.0\n2\t4.0\n3\t3.5\n")  # a step the killed run logged

    resumed = copy.deepcopy(tiny_model).train()
    optimizer = make_optimizer(resumed, CONFIG.optimizer)
    restored_best = BestCheckpoint()
    fresh = SFTState()
    checkpoints = tmp_path / "checkpoints"
    load = RunCheckpoints(checkpoints, "inputs", "SFT", SFTState, resumed, optimizer, restored_best, live).load

    state = resume(tmp_path / "checkpoints", "inputs", "SFT", load, fresh)
    assert capsys.readouterr().out == f"SFT: resuming from {tmp_path / 'checkpoints/step-000002'} (step 2)\n"
    assert state == SFTState(step=2, best_accuracy=0.5, best_step=2, best_interval=best.interval)
    assert (restored_best.accuracy, restored_best.step) == (0.5, 2)
    assert all(torch.equal(restored_best.state_dict[name], best.state_dict[name]) for name in best.state_dict)
    assert (live / "plots/loss.tsv").read_text() == "step\tloss\n1\t5.0\n2\t4.0\n"
    assert state.step == 2  # the schedule's place: the learning rate is a function of the step count
    assert train(resumed, tiny_tokenizer, optimizer, schedule, state.step, 4) == losses[2:]
    expected = uninterrupted.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in resumed.state_dict().items())

    # another fingerprint: not resumed, said so, and the checkpoint made from other inputs goes
    state = resume(tmp_path / "checkpoints", "other inputs", "SFT", load, fresh)
    out = capsys.readouterr().out
    assert out.startswith("SFT: ") and "was made from other inputs (params, init model, data, code" in out
    assert "starting afresh" in out and state is fresh
    assert not list((tmp_path / "checkpoints").iterdir())


def test_an_ei_checkpoint_restores_the_weights_the_best_round_and_the_counts(tiny_model, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    best = BestCheckpoint()
    best.offer(tiny_model, 0.25, 1)
    state = EIState(step=1, skipped_rounds=1, best_accuracy=0.25, best_step=1)
    tensors = {"policy": tiny_model.state_dict(), "best": best.state_dict}
    write_checkpoint(tmp_path / "checkpoints", 1, tensors, state, live, "inputs")
    other = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(1.0)
    restored_best = BestCheckpoint()
    checkpoints = RunCheckpoints(tmp_path / "checkpoints", "inputs", "EI", EIState, other, None, restored_best, live)
    loaded = checkpoints.load(tmp_path / "checkpoints/step-000001")
    assert loaded == state and (restored_best.accuracy, restored_best.step) == (0.25, 1)
    assert all(torch.equal(tensor, tiny_model.state_dict()[name]) for name, tensor in other.state_dict().items())
    remove_checkpoints(tmp_path / "checkpoints")
    assert not list((tmp_path / "checkpoints").iterdir())


def ei_checkpoints(policy, directory: Path, live: Path | None = None) -> RunCheckpoints:
    """An expert-iteration run's store (no optimizer): the smallest real checkpoint of the tiny policy."""
    live = live or directory.parent / "live"
    live.mkdir(exist_ok=True)
    return RunCheckpoints(directory, "inputs", "EI", EIState, policy, None, BestCheckpoint(), live)


def checkpoints_of_steps_1_and_2(tiny_model, directory: Path) -> dict[str, torch.Tensor]:
    """Checkpoints of steps 1 and 2 side by side (as a kill between step 2's rename and step 1's removal leaves
    them), of different weights; returns step 1's."""
    policy = copy.deepcopy(tiny_model)
    ei_checkpoints(policy, directory).save(EIState(step=1))
    shutil.copytree(directory / "step-000001", directory.parent / "step-000001")
    at_step_1 = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(1.0)
    ei_checkpoints(policy, directory).save(EIState(step=2))
    shutil.copytree(directory.parent / "step-000001", directory / "step-000001")
    return at_step_1


def flip_a_weight_exponent(file: Path) -> None:
    """Flip one exponent bit of the first float32 of the largest tensor in torch's zip ``file``, in place (that
    weight becomes 2^128 times larger): damage the zip's CRC-32 would show, but ``torch.load`` checks none."""
    with zipfile.ZipFile(file) as archive:
        entry = max((info for info in archive.infolist() if "/data/" in info.filename), key=lambda info: info.file_size)
    with file.open("r+b") as stream:
        stream.seek(entry.header_offset + 26)  # a local file header: 30 bytes, then its name and extra field
        name_length, extra_length = struct.unpack("<HH", stream.read(4))
        high_byte = entry.header_offset + 30 + name_length + extra_length + 3  # little-endian: sign and exponent
        stream.seek(high_byte)
        value = stream.read(1)[0]
        stream.seek(high_byte)
        stream.write(bytes([value ^ 0x40]))


def test_a_checkpoint_whose_weights_were_damaged_on_disk_is_passed_over(tiny_model, tmp_path, capsys):
    """One bit flipped in step 2's ``checkpoint.pt`` (``torch.load`` would load it as it is): the resume names the
    file, sets step 2's checkpoint aside and continues from step 1, with step 1's weights."""
    directory = tmp_path / "checkpoints"
    at_step_1 = checkpoints_of_steps_1_and_2(tiny_model, directory)
    newest = directory / "step-000002"
    flip_a_weight_exponent(newest / "checkpoint.pt")
    capsys.readouterr()

    policy = copy.deepcopy(tiny_model)
    state = ei_checkpoints(policy, directory).resume()
    assert capsys.readouterr().out.splitlines() == [
        f"EI: {newest / 'checkpoint.pt'} is damaged: its SHA-256 is not the one recorded when it was saved; set "
        f"aside as {directory / 'step-000002.damaged'}; trying the previous checkpoint",
        f"EI: resuming from {directory / 'step-000001'} (step 1)",
    ]
    assert state.step == 1
    assert all(torch.equal(tensor, at_step_1[name]) for name, tensor in policy.state_dict().items())


def tree_bytes(directory: Path) -> dict[Path, bytes]:
    return {path.relative_to(directory): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


@pytest.mark.parametrize("damage", ["bit flipped", "state.json cut short"])
def test_a_damaged_checkpoint_with_none_before_it_is_kept_aside(tiny_model, tmp_path, capsys, damage):
    """The only checkpoint damaged: the run starts afresh and says where it kept the checkpoint, as it was, for
    inspection (``step-000002.damaged``); the fresh run's checkpoints, its resume and the completed run's clean-up
    leave that one alone."""
    directory = tmp_path / "checkpoints"
    ei_checkpoints(copy.deepcopy(tiny_model), directory).save(EIState(step=2))
    checkpoint = directory / "step-000002"
    if damage == "bit flipped":
        bad = checkpoint / "checkpoint.pt"
        flip_a_weight_exponent(bad)
    else:
        bad = checkpoint / "state.json"
        bad.write_text(bad.read_text()[:40])
    as_damaged = tree_bytes(checkpoint)
    capsys.readouterr()

    policy = copy.deepcopy(tiny_model)
    state = ei_checkpoints(policy, directory).resume()
    aside = directory / "step-000002.damaged"
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"EI: {bad} ") and line.endswith(f"; set aside as {aside}; starting afresh")
    assert state == EIState()
    assert [path.name for path in directory.iterdir()] == [aside.name] and tree_bytes(aside) == as_damaged

    store = ei_checkpoints(policy, directory)
    store.save(EIState(step=1))
    store.save(EIState(step=2))
    assert sorted(path.name for path in directory.iterdir()) == ["step-000002", aside.name]
    assert ei_checkpoints(policy, directory).resume().step == 2
    assert capsys.readouterr().out == f"EI: resuming from {checkpoint} (step 2)\n"
    remove_checkpoints(directory)
    assert [path.name for path in directory.iterdir()] == [aside.name] and tree_bytes(aside) == as_damaged


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: room for one checkpoint of the tiny policy (2.3 MB of weights), not for the next beside it."""
    mount = tmp_path / "small_disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"the full disk is a small tmpfs, and mounting one is not permitted here: {mounted.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "--lazy", mount], check=True)  # lazy: a file a failed test left open


def test_a_full_disk_stops_the_run_naming_the_directory_and_the_free_space(tiny_model, small_disk, tmp_path, capsys):
    """Step 1's checkpoint fits, step 2's does not: one error naming the directory, the cause and the free space;
    no half-written checkpoint is left, step 1's stays whole and resumes."""
    directory = small_disk / "checkpoints"
    store = ei_checkpoints(copy.deepcopy(tiny_model), directory, tmp_path / "live")
    store.save(EIState(step=1))
    with pytest.raises(UserError) as full:
        store.save(EIState(step=2))
    said = re.fullmatch(
        rf"{re.escape(str(directory))}: no room for the checkpoint of step 2 \(No space left on device\): it takes "
        r"about ([\d.]+) MB, ([\d.]+) MB free there; free some space or give --checkpoints a directory on a larger "
        r"disk, then rerun \(it resumes from the newest checkpoint\)",
        str(full.value),
    )
    assert said, str(full.value)
    takes, free = float(said[1]) * 1e6, float(said[2]) * 1e6
    assert takes == pytest.approx((directory / "step-000001/checkpoint.pt").stat().st_size, rel=0.02)
    assert free == pytest.approx(shutil.disk_usage(directory).free, abs=0.05e6)
    assert [path.name for path in directory.iterdir()] == ["step-000001"]  # no temporary left
    capsys.readouterr()
    assert ei_checkpoints(copy.deepcopy(tiny_model), directory, tmp_path / "live").resume().step == 1
    assert capsys.readouterr().out == f"EI: resuming from {directory / 'step-000001'} (step 1)\n"


def test_a_full_disk_while_the_curves_are_copied_is_said_so_too(tiny_model, small_disk, tmp_path):
    """The tensors fit, the curves copied beside them do not (``shutil.copytree`` gathers the error as text): the
    same one error, and nothing of the checkpoint left."""
    directory, live = small_disk / "checkpoints", tmp_path / "live"
    live.mkdir()
    (live / "curve.tsv").write_bytes(b"0" * 3_000_000)
    store = ei_checkpoints(copy.deepcopy(tiny_model), directory, live)
    no_room = rf"{re.escape(str(directory))}: no room for the checkpoint of step 1 \(No space left on device\): "
    with pytest.raises(UserError, match=f"^{no_room}it takes about 5.3 MB, "):  # 2.3 MB of weights, 3 of curves
        store.save(EIState(step=1))
    assert not list(directory.iterdir())


def test_the_sft_and_ei_fingerprints_change_with_params_init_model_data_and_code(tmp_path, tiny_tokenizer):
    """Each input on its own changes the fingerprint: a param, the init model's weights rewritten in place, a pair or
    a training question, a validation question, a comment in a module the stage imports."""
    shutil.copytree(SOURCE / "reasonrl", tmp_path / "src/reasonrl", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "stages").mkdir()
    shutil.copy(SFT_STAGE, tmp_path / "stages/sft.py")
    shutil.copy(EI_STAGE, tmp_path / "stages/expert_iteration.py")
    model = tmp_path / "model"
    build_tiny_model(tiny_tokenizer, TinyModelSpec(), seed=0).save_pretrained(model)
    val = [GSM8KExample("What is 1 + 1?", "1 + 1 = 2", "2")]
    train = [GSM8KExample("What is 2 + 2?", "2 + 2 = 4", "4")]

    def fingerprints(config=None, ei_config=None, pairs=PAIRS, train=train, val=val) -> tuple[str, str]:
        common = EvalConfig(), EngineConfig(), model
        source = {"source": tmp_path / "src"}
        sft_data = {"pairs": pairs_digest(pairs), "val": examples_digest(val)}
        sft_stage, ei_stage = tmp_path / "stages/sft.py", tmp_path / "stages/expert_iteration.py"
        sft = fingerprint("sft", config or SFTConfig(), *common, sft_data, sft_stage, **source)
        ei_data = {"train": examples_digest(train), "val": examples_digest(val)}
        ei = fingerprint("ei", ei_config or EIConfig(), *common, ei_data, ei_stage, **source)
        return sft, ei

    seen = [fingerprints()]
    assert fingerprints() == seen[0]
    seen.append(fingerprints(SFTConfig(learning_rate=1e-4), EIConfig(learning_rate=1e-4)))
    seen.append(fingerprints(pairs=PAIRS[:-1], train=train * 2))
    seen.append(fingerprints(val=val * 2))
    with (tmp_path / "src/reasonrl/sft.py").open("a", encoding="utf-8") as stream:
        stream.write("\n# an edit\n")
    seen.append(fingerprints())
    build_tiny_model(tiny_tokenizer, TinyModelSpec(), seed=1).save_pretrained(model)
    seen.append(fingerprints())
    for kind in (0, 1):
        assert len({pair[kind] for pair in seen}) == len(seen)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SFTConfig(keep_every=-1), "sft.keep_every: must be ≥ 0 (0 = off), got -1"),
        (lambda: SFTConfig(checkpoint_every=-1), "sft.checkpoint_every: must be ≥ 0 (0 = off), got -1"),
        (lambda: GRPOConfig(keep_every=-2), "grpo.keep_every: must be ≥ 0 (0 = off), got -2"),
    ],
)
def test_keep_and_checkpoint_params_are_validated(make, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


# What DVC 3.67 puts in a stage's environment (dvc.stage.run.prepare_kwargs, dvc.repo.experiments.queue.base): for
# every stage its name and the repository's root; for an experiment also its name and baseline, with DVC_ROOT the
# workspace it was started from even when it runs in a copy under .dvc/tmp/exps (queued, --temp).
REPRO = {DVC_STAGE: "grpo", DVC_ROOT: "/work/repo"}
EXPERIMENT = REPRO | {DVC_EXP_NAME: "clip-higher", DVC_EXP_BASELINE_REV: "39cc16b74e508f1f63d166a3d165091006ccecb1"}


def test_kept_policies_go_to_the_workspace_under_the_experiment_name():
    """``dvc repro`` and Snakemake keep in ``--kept`` as given; a DVC experiment in the workspace it was started from,
    under its own name: a queued one's copy of the repository is deleted when it ends."""
    assert kept_directory("models/kept/grpo", {}) == Path("models/kept/grpo")  # Snakemake, a stage by hand
    assert kept_directory("models/kept/grpo", REPRO) == Path("models/kept/grpo")
    assert kept_directory("models/kept/sft", EXPERIMENT) == Path("/work/repo/models/kept/clip-higher/sft")
    assert kept_directory("/scratch/kept/grpo", EXPERIMENT) == Path("/scratch/kept/clip-higher/grpo")


def test_two_runs_of_one_experiment_name_cannot_keep_at_once(tmp_path):
    """DVC queues two experiments of one name: the second to lock their shared kept directory stops with the
    holder's PID; experiments of other names, or a run that keeps nothing, do not wait on it."""
    workspace = {DVC_ROOT: str(tmp_path)}
    same = kept_directory("models/kept/grpo", EXPERIMENT | workspace)
    other = kept_directory("models/kept/grpo", EXPERIMENT | workspace | {DVC_EXP_NAME: "no-baseline"})
    with checkpoint_lock(tmp_path / "copy-1/checkpoints", same):
        with pytest.raises(LockedError, match=f"{same}: in use by another run"):
            with checkpoint_lock(tmp_path / "copy-2/checkpoints", same):
                pass
        with checkpoint_lock(tmp_path / "copy-3/checkpoints", other), checkpoint_lock(tmp_path / "copy-4/checkpoints"):
            pass

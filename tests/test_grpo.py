"""GRPO: one step against a hand-computed update, the NaN guard, resume after kill -9, and learning."""

import copy
import json
import math
import os
import shutil
from importlib import metadata
from pathlib import Path

import pytest
import torch

from reasonrl.batching import sequence_lengths
from reasonrl.code_deps import SOURCE
from reasonrl.config import EngineConfig, EvalConfig, GRPOConfig
from reasonrl.data import GSM8KExample, examples_digest
from reasonrl.distributed import SINGLE, Mean
from reasonrl.errors import UserError
from reasonrl.grpo import (
    GRPO_STAGE,
    FixedLogProbs,
    Forwards,
    NonFiniteError,
    NonFiniteGuard,
    RolloutBatch,
    TrainingState,
    accumulate_gradients,
    compute_old_log_probs,
    fixed_log_probs,
    grpo_checkpoints,
    old_log_probs_source,
    rollout_metrics,
    step_progress,
)
from reasonrl.loss_registry import loss_types_where
from reasonrl.rollouts.drawing import score_samples
from reasonrl.rollouts.types import DrawnRollouts, Sample
from reasonrl.tokenization import batch_from_token_ids
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.checkpoints import file_digests, fingerprint


def fixed_batch(advantages: list[float], raw_rewards: list[float]) -> RolloutBatch:
    prompt_ids = [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9]]
    response_ids = [[10, 11], [12, 13, 14, 15], [16], [17, 18, 19]]
    tensors = batch_from_token_ids(prompt_ids, response_ids, pad_token_id=0)
    return RolloutBatch(
        prompts=["p"] * 4,
        responses=["r"] * 4,
        ground_truths=["1"] * 4,
        **tensors,
        engine_log_probs=None,
        raw_rewards=torch.tensor(raw_rewards),
        advantages=torch.tensor(advantages),
        response_lengths=[len(ids) for ids in response_ids],
        sequence_lengths=sequence_lengths(tensors["response_mask"]),
        truncated=torch.tensor([False] * 4),
    )


def train_step(model, batch: RolloutBatch, config: GRPOConfig, old: torch.Tensor | None = None) -> dict:
    """``accumulate_gradients`` over the batch's four rows as one optimizer step of ``config`` (π_old: ``old``)."""
    fixed, forwards, max_tokens = FixedLogProbs(old=old), Forwards.training(config), config.sampling.max_tokens
    return accumulate_gradients(model, batch, [0, 1, 2, 3], fixed, config.loss, forwards, max_tokens)


def hand_computed(model, batch, per_token_loss_fn):
    """The handout's loss written out directly: log_softmax, gather, masked mean per sequence, batch mean."""
    model.zero_grad()
    log_probs = torch.log_softmax(model(batch.input_ids).logits, dim=-1)
    log_probs = log_probs.gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)
    mask = batch.response_mask.float()
    per_token = per_token_loss_fn(log_probs)
    loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


# Fixed microbatches of 4, 2 and 1 rows, and token budgets: 8 tokens → [6], [4, 4], [2] (rows of unequal size), and
# one that takes the whole step.
@pytest.mark.parametrize(
    ("gradient_accumulation_steps", "microbatch_tokens"), [(1, None), (2, None), (4, None), (1, 8), (1, 1000)]
)
def test_reinforce_step_equals_hand_computed_loss_and_gradient(
    tiny_model, gradient_accumulation_steps, microbatch_tokens
):
    """Whatever the split, the gradient is the handout's mean over the step's sequences (fp32, to 1e-6)."""
    batch = fixed_batch(advantages=[1.5, -0.5, 0.0, -1.0], raw_rewards=[1.0, 0.0, 0.0, 0.0])
    config = GRPOConfig(
        rollout_batch_size=4,
        group_size=2,
        train_batch_size=4,
        gradient_accumulation_steps=gradient_accumulation_steps,
        microbatch_tokens=microbatch_tokens,
    )
    expected_loss, expected_grads = hand_computed(tiny_model, batch, lambda lp: -batch.advantages.unsqueeze(-1) * lp)
    tiny_model.zero_grad()
    metrics = train_step(tiny_model, batch, config)
    assert metrics["train/loss"] == pytest.approx(expected_loss, rel=1e-5)
    for name, parameter in tiny_model.named_parameters():
        assert torch.allclose(parameter.grad, expected_grads[name], atol=1e-6, rtol=1e-4), name
    tiny_model.zero_grad()


def test_grpo_clip_step_matches_hand_computed_with_shifted_old_log_probs(tiny_model):
    batch = fixed_batch(advantages=[1.0, -1.0, 2.0, -2.0], raw_rewards=[1.0, 0.0, 1.0, 0.0])
    config = GRPOConfig(
        rollout_batch_size=8,
        group_size=2,
        train_batch_size=4,
        gradient_accumulation_steps=1,
        loss_type="grpo_clip",
        cliprange=0.2,
    )
    old = compute_old_log_probs(tiny_model, batch, Forwards.fixed(config))
    old = old + torch.tensor([-0.5, 0.5, 0.05, 0.0]).unsqueeze(-1)  # rows 0, 1: ratios clipped for their sign of A
    advantages = batch.advantages.unsqueeze(-1)

    def clipped(lp):
        ratio = torch.exp(lp - old)
        return -torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)

    expected_loss, expected_grads = hand_computed(tiny_model, batch, clipped)
    tiny_model.zero_grad()
    metrics = train_step(tiny_model, batch, config, old)
    assert metrics["train/loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert metrics["train/clip_fraction"] == pytest.approx(6 / 10)  # every token of rows 0 and 1 (2 + 4 of 10)
    for name, parameter in tiny_model.named_parameters():
        assert torch.allclose(parameter.grad, expected_grads[name], atol=1e-6, rtol=1e-4), name
    tiny_model.zero_grad()


@pytest.mark.parametrize("loss_aggregation", ["sequence_mean", "constant_normalizer"])
def test_mask_truncated_leaves_truncated_responses_out_of_the_step(tiny_model, loss_aggregation):
    """``sequence_mean``: the step's mean runs over the kept rows. ``constant_normalizer`` (Dr. GRPO): each kept row's
    summed loss over max_tokens, averaged over *all* the step's rows (truncated ones count with zero loss), so the
    constant normaliser does not grow with the truncation rate."""
    batch = fixed_batch(advantages=[1.5, -0.5, 0.7, -1.0], raw_rewards=[1.0, 0.0, 1.0, 0.0])
    batch.truncated = torch.tensor([False, True, False, True])
    config = GRPOConfig(
        rollout_batch_size=4, group_size=2, train_batch_size=4, gradient_accumulation_steps=2, mask_truncated=True,
        loss_aggregation=loss_aggregation, max_tokens=7,
    )  # fmt: skip
    kept = [0, 2]
    tiny_model.zero_grad()
    log_probs = torch.log_softmax(tiny_model(batch.input_ids[kept]).logits, dim=-1)
    log_probs = log_probs.gather(-1, batch.labels[kept].unsqueeze(-1)).squeeze(-1)
    mask = batch.response_mask[kept].float()
    per_token = -batch.advantages[kept].unsqueeze(-1) * log_probs
    if loss_aggregation == "sequence_mean":
        expected_loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    else:
        expected_loss = (per_token * mask).sum() / 7 / 4  # over all 4 rows, not the 2 kept
    expected_loss.backward()
    expected_grads = {name: p.grad.clone() for name, p in tiny_model.named_parameters()}
    tiny_model.zero_grad()

    metrics = train_step(tiny_model, batch, config)
    assert metrics["train/loss"] == pytest.approx(expected_loss.item(), rel=1e-5)
    for name, parameter in tiny_model.named_parameters():
        assert torch.allclose(parameter.grad, expected_grads[name], atol=1e-6, rtol=1e-4), name
    tiny_model.zero_grad()
    batch.truncated[:] = True
    assert train_step(tiny_model, batch, config)["train/loss"] == 0.0
    assert all(parameter.grad is None for parameter in tiny_model.parameters())


def test_old_log_probs_are_not_differentiable_and_do_not_depend_on_the_split(tiny_model):
    batch = fixed_batch(advantages=[0.0] * 4, raw_rewards=[0.0] * 4)
    whole = GRPOConfig(rollout_batch_size=4, group_size=2, train_batch_size=4, gradient_accumulation_steps=1)
    old = compute_old_log_probs(tiny_model, batch, Forwards.fixed(whole))
    assert not old.requires_grad and old.shape == batch.labels.shape
    assert torch.all(old[batch.response_mask] < 0)
    for budget in (6, 8):
        split = GRPOConfig(**{**whole.__dict__, "old_log_probs_microbatch_tokens": budget})
        recomputed = compute_old_log_probs(tiny_model, batch, Forwards.fixed(split))
        torch.testing.assert_close(recomputed[batch.response_mask], old[batch.response_mask], rtol=0, atol=1e-6)


RATIO_LOSSES = loss_types_where(lambda entry: entry.needs_old_log_probs)


def engine_log_probs(model, batch: RolloutBatch, lag: int) -> torch.Tensor:
    """μ, the engine's log-probs of the batch: lag 0, the policy's own within the engine's numerical error (1e-4); lag
    1, those of the weights one step older (the policy perturbed back), far enough off for the cap to cut some."""
    sampler = copy.deepcopy(model)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for parameter in sampler.parameters():
            parameter.add_((0.3 if lag else 0.0) * torch.randn(parameter.shape, generator=generator))
    config = GRPOConfig(rollout_batch_size=4, group_size=2, train_batch_size=4, gradient_accumulation_steps=1)
    noise = 1e-4 * torch.randn(batch.labels.shape, generator=torch.Generator().manual_seed(2))
    return (compute_old_log_probs(sampler, batch, Forwards.fixed(config)) + noise) * batch.response_mask


# Lag 1 needs the cap (params refuse it without).
@pytest.mark.parametrize(("rollout_is_cap", "lag"), [(None, 0), (1.5, 0), (1.5, 1)])
@pytest.mark.parametrize("loss_type", RATIO_LOSSES)
def test_pi_old_from_the_training_forward_gives_the_separate_passs_step_bit_for_bit(
    tiny_model, loss_type, rollout_is_cap, lag
):
    """One optimizer step per rollout batch: π_old taken from the update's own forward, detached, gives exactly the
    loss, metrics (clip fractions, importance-weight figures) and gradient of a separate pass before the update
    (what two epochs need), though that pass splits the rows otherwise (in order, whole) than the update (shuffled,
    in halves). The ratio is then 1 in value, its gradient log π's. Lag 1: the samples are of older weights, so the
    importance weights are far from 1 and the cap truncates some."""
    batch = fixed_batch(advantages=[1.0, -1.0, 0.5, -0.5], raw_rewards=[1.0, 0.0, 1.0, 0.0])
    batch.engine_log_probs = engine_log_probs(tiny_model, batch, lag)
    config = GRPOConfig(
        rollout_batch_size=4, group_size=2, train_batch_size=4, gradient_accumulation_steps=2, loss_type=loss_type,
        cliprange=0.2, rollout_is_cap=rollout_is_cap, max_staleness=lag,
    )  # fmt: skip
    two_epochs = GRPOConfig(**{**config.__dict__, "epochs_per_rollout_batch": 2})
    assert (old_log_probs_source(config), old_log_probs_source(two_epochs)) == ("training_forward", "separate_pass")
    rows, forwards, max_tokens = [2, 0, 3, 1], Forwards.training(config), config.sampling.max_tokens

    def step(fixed_config: GRPOConfig) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        tiny_model.zero_grad()
        fixed, figures = fixed_log_probs(tiny_model, batch, None, fixed_config)
        metrics = accumulate_gradients(tiny_model, batch, rows, fixed, config.loss, forwards, max_tokens) | figures
        gradients = {name: parameter.grad.clone() for name, parameter in tiny_model.named_parameters()}
        tiny_model.zero_grad()
        return metrics, gradients

    separate_metrics, separate_gradients = step(two_epochs)
    fused_metrics, fused_gradients = step(config)
    assert fused_metrics == separate_metrics
    assert all(torch.equal(fused_gradients[name], gradient) for name, gradient in separate_gradients.items())
    if rollout_is_cap is not None:
        assert fused_metrics["train/is_log_prob_gap_max"] > (0.5 if lag else 0.0)
        assert (fused_metrics["train/is_truncated_fraction"] > 0) == bool(lag)


def test_nonfinite_guard_skips_then_stops_naming_step_and_quantity():
    guard = NonFiniteGuard(limit=2)
    assert guard.allows(3, {"loss": 1.0, "advantages": torch.ones(4)})
    assert not guard.allows(4, {"loss": math.nan})
    assert not guard.allows(5, {"advantages": torch.tensor([0.0, math.inf])})
    assert guard.allows(6, {"loss": 0.5})  # a good step resets the run of bad ones
    assert guard.skipped == 2
    assert not guard.allows(7, {"gradient norm": torch.tensor(math.nan)})
    assert not guard.allows(8, {"gradient norm": torch.tensor(math.nan)})
    with pytest.raises(NonFiniteError, match=r"GRPO step 9: gradient norm is NaN or Inf in 3 optimizer steps in a row"):
        guard.allows(9, {"gradient norm": torch.tensor(math.nan)})


def test_the_guard_state_survives_a_checkpoint(tiny_model, tmp_path):
    """Two bad steps in a row before a checkpoint, one after the resume: the third in a row still stops the run."""
    live = tmp_path / "live"
    live.mkdir()
    optimizer = torch.optim.AdamW(tiny_model.parameters())
    guard = NonFiniteGuard(limit=2)
    for step in (0, 1):
        guard.allows(step, {"loss": math.nan})
    state = TrainingState(step=2, skipped_steps=guard.skipped, consecutive_nonfinite=guard.consecutive)
    checkpoints = grpo_checkpoints(
        tmp_path / "checkpoints", "fingerprint", tiny_model, optimizer, BestCheckpoint(), live
    )
    checkpoints.save(state)

    restored = checkpoints.load(tmp_path / "checkpoints/step-000002")
    resumed = NonFiniteGuard(2, restored.skipped_steps, restored.consecutive_nonfinite)
    with pytest.raises(NonFiniteError, match="in 3 optimizer steps in a row"):
        resumed.allows(2, {"loss": math.nan})


def test_rollout_metrics_describe_every_sampled_group_and_the_kept_ones_apart_as_sums_and_counts():
    """Three groups of two over two rounds of dynamic sampling, one dropped (both answers wrong): ``rollout/``
    describes all six samples, as a run without dynamic sampling would, ``rollout/kept_`` the four trained on."""

    def exact_match(text: str, truth: str, info: object = None) -> dict[str, float]:
        return dict.fromkeys(("reward", "format_reward", "answer_reward"), float(text == truth))

    first, second, third = (GSM8KExample(f"q{n}", "", str(n)) for n in (1, 2, 3))

    def sample(text: str, length: int, finish: str = "stop_string") -> Sample:
        return Sample(text, list(range(length)), None, [0], finish)

    groups = {
        "1": [sample("1", 3), sample("x", 5)],
        "2": [sample("y", 4), sample("z", 6, "length")],  # no reward variance: dropped
        "3": [sample("3", 2), sample("w", 7)],  # the second round's
    }
    questions = {"1": first, "2": second, "3": third}
    scores = {name: score_samples([questions[name]], group, 2, exact_match, 7) for name, group in groups.items()}
    drawn = DrawnRollouts(
        [first, third], ["p1", "p3"], groups["1"] + groups["3"], scores["1"] + scores["3"],
        sampled_questions=[first, second, third], sampled_samples=groups["1"] + groups["2"] + groups["3"],
        sampled_scores=scores["1"] + scores["2"] + scores["3"], sampling_rounds=2, dropped_groups=1,
    )  # fmt: skip
    assert rollout_metrics(drawn, 2, False)["rollout/response_length_correct"] == Mean(5.0, 2)  # a sum and a count
    sampled = SINGLE.mean_metrics(rollout_metrics(drawn, 2, False))
    assert sampled == {
        "rollout/reward": 2 / 6, "rollout/format_reward": 2 / 6, "rollout/answer_reward": 2 / 6,
        "rollout/zero_variance_group_fraction": 1 / 3, "rollout/response_length": 27 / 6,
        "rollout/response_length_correct": 2.5, "rollout/response_length_incorrect": 5.5,
        "rollout/truncated_fraction": 1 / 6,
    }  # fmt: skip
    logged = SINGLE.mean_metrics(rollout_metrics(drawn, 2, dynamic_sampling=True))
    assert {name: value for name, value in logged.items() if "kept" not in name} == sampled
    assert {name: value for name, value in logged.items() if "kept" in name} == {
        "rollout/kept_reward": 0.5, "rollout/kept_format_reward": 0.5, "rollout/kept_answer_reward": 0.5,
        "rollout/kept_zero_variance_group_fraction": 0.0, "rollout/kept_response_length": 17 / 4,
        "rollout/kept_response_length_correct": 2.5, "rollout/kept_response_length_incorrect": 6.0,
        "rollout/kept_truncated_fraction": 0.0,
    }  # fmt: skip
    # A mean over nothing (no correct answer among the dropped group's) is left out, not logged as 0.
    dropped = DrawnRollouts(
        [second], ["p2"], groups["2"], scores["2"],
        sampled_questions=[second], sampled_samples=groups["2"], sampled_scores=scores["2"],
    )  # fmt: skip
    logged = SINGLE.mean_metrics(rollout_metrics(dropped, 2, False))
    assert "rollout/response_length_correct" not in logged and logged["rollout/response_length_incorrect"] == 5.0


class RunsCommand:
    """A crafted checkpoint's payload: unpickling it calls ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def checkpoint_at(policy, directory: Path, step: int) -> Path:
    """The checkpoint training writes at ``step`` (the older ones in ``directory`` go once it is in place)."""
    live = directory.parent / "live"
    live.mkdir(exist_ok=True)
    optimizer = torch.optim.AdamW(policy.parameters())
    grpo_checkpoints(directory, "fingerprint", policy, optimizer, BestCheckpoint(), live).save(TrainingState(step=step))
    return directory / f"step-{step:06d}"


def forge_digests(checkpoint: Path) -> None:
    """Record the SHA-256 of ``checkpoint``'s files as they are now, as a forger would: what then refuses a crafted
    ``checkpoint.pt`` is ``torch.load(weights_only=True)``, not the digest check meant for damage."""
    file = checkpoint / "state.json"
    saved = json.loads(file.read_text())
    file.write_text(json.dumps(saved | {"files": file_digests(checkpoint)}))


def test_a_crafted_checkpoint_is_refused_before_anything_in_it_runs(tiny_model, tmp_path):
    """A ``checkpoint.pt`` that would call ``os.system`` when unpickled, beside the genuine fingerprint and its own
    SHA-256: refused in one line naming the file, the command never runs and the policy is left as it was."""
    checkpoint = checkpoint_at(tiny_model, tmp_path / "checkpoints", 2)
    marker = tmp_path / "ran"
    torch.save({"policy": RunsCommand(f"touch {marker}")}, checkpoint / "checkpoint.pt")
    forge_digests(checkpoint)
    before = {name: tensor.clone() for name, tensor in tiny_model.state_dict().items()}
    optimizer = torch.optim.AdamW(tiny_model.parameters())
    checkpoints = grpo_checkpoints(
        checkpoint.parent, "fingerprint", tiny_model, optimizer, BestCheckpoint(), tmp_path / "live"
    )
    with pytest.raises(UserError) as refused:
        checkpoints.load(checkpoint)
    file = checkpoint / "checkpoint.pt"
    assert str(refused.value) == f"{file} refused: it holds more than tensors (loading it could run code)"
    assert not marker.exists()
    assert all(torch.equal(tensor, before[name]) for name, tensor in tiny_model.state_dict().items())


@pytest.mark.parametrize("damage", ["truncated tensors", "bad JSON", "crafted pickle"])
def test_resume_passes_over_a_checkpoint_that_cannot_be_read(tiny_model, tmp_path, capsys, damage):
    """Step 2's checkpoint and step 4's, damaged: the resume names step 4's file and why in one line, continues from
    step 2 (its weights) and sets step 4's aside. Step 2's damaged too: a fresh state, both set aside."""
    policy, directory = copy.deepcopy(tiny_model), tmp_path / "checkpoints"
    shutil.copytree(checkpoint_at(policy, directory, 2), tmp_path / "kept")
    at_step_2 = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(1.0)
    newest = checkpoint_at(policy, directory, 4)
    shutil.copytree(tmp_path / "kept", directory / "step-000002")  # as a kill before the clean-up leaves it
    marker = tmp_path / "ran"
    if damage == "truncated tensors":
        bad = newest / "checkpoint.pt"
        os.truncate(bad, 1000)
    elif damage == "bad JSON":
        bad = newest / "state.json"
        bad.write_text('{"fingerprint": "fingerprint", "state": {"step"')
    else:
        bad = newest / "checkpoint.pt"
        torch.save({"policy": RunsCommand(f"touch {marker}")}, bad)
        forge_digests(newest)
    capsys.readouterr()

    state = grpo_checkpoints(
        directory, "fingerprint", policy, torch.optim.AdamW(policy.parameters()), BestCheckpoint(), tmp_path / "live"
    ).resume()
    skipped, resumed = capsys.readouterr().out.splitlines()
    assert skipped.startswith(f"GRPO: {bad} ")
    assert skipped.endswith(f"; set aside as {directory / 'step-000004.damaged'}; trying the previous checkpoint")
    assert resumed == f"GRPO: resuming from {directory / 'step-000002'} (step 2)"
    assert state.step == 2
    assert all(torch.equal(tensor, at_step_2[name]) for name, tensor in policy.state_dict().items())
    assert sorted(path.name for path in directory.iterdir()) == ["step-000002", "step-000004.damaged"]
    assert not marker.exists()

    os.truncate(directory / "step-000002/checkpoint.pt", 1000)
    state = grpo_checkpoints(
        directory, "fingerprint", policy, torch.optim.AdamW(policy.parameters()), BestCheckpoint(), tmp_path / "live"
    ).resume()
    (skipped,) = capsys.readouterr().out.splitlines()
    assert skipped.startswith(f"GRPO: {directory / 'step-000002/checkpoint.pt'} is damaged: 1,000 bytes, ")
    assert skipped.endswith(f"; set aside as {directory / 'step-000002.damaged'}; starting afresh")
    assert state == TrainingState()
    assert sorted(path.name for path in directory.iterdir()) == ["step-000002.damaged", "step-000004.damaged"]


def test_a_checkpoint_is_on_disk_whole_before_it_replaces_the_previous_one(tiny_model, tmp_path, monkeypatch):
    """Every file and directory of the new checkpoint is flushed, then renamed into place, then the directory that
    names it is flushed, and only then does the previous checkpoint go: a crash at any point leaves one whole."""
    directory = tmp_path.resolve() / "checkpoints"
    previous = checkpoint_at(tiny_model, directory, 2)
    events = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(descriptor):
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{descriptor}"))))
        fsync(descriptor)

    def recording_replace(source, target):
        events.append(("replace", Path(target), Path(source), previous.exists()))
        replace(source, target)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    newest = checkpoint_at(tiny_model, directory, 4)

    (renamed,) = [index for index, event in enumerate(events) if event[:2] == ("replace", newest)]
    _, _, staging, previous_still_there = events[renamed]
    written = {staging / path.relative_to(newest) for path in newest.rglob("*")} | {staging}
    assert written <= {event[1] for event in events[:renamed] if event[0] == "fsync"}
    assert ("fsync", directory) in events[renamed + 1 :]
    assert previous_still_there and not previous.exists()


def test_the_fingerprint_covers_the_prompt_templates_the_code_the_libraries_and_the_cpu_threads(tmp_path, monkeypatch):
    """On a copy of the package: a prompt template edit, a comment in a module the stage imports, another library
    version and another CPU thread count each change it; an edit to a module the stage never imports does not."""
    shutil.copytree(SOURCE / "reasonrl", tmp_path / "src/reasonrl", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "stages").mkdir()
    shutil.copy(GRPO_STAGE, tmp_path / "stages/grpo.py")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    def current(device: str = "cpu") -> str:
        data = {"train": examples_digest([]), "val": examples_digest([])}
        inputs = GRPOConfig(), EvalConfig(), EngineConfig(), model, data
        return fingerprint("grpo", *inputs, tmp_path / "stages/grpo.py", device, source=tmp_path / "src")

    def edit(relative: str) -> None:
        with (tmp_path / relative).open("a", encoding="utf-8") as stream:
            stream.write("\n# an edit\n")

    seen = [current()]
    edit("src/reasonrl/prompts/r1_zero.prompt")
    seen.append(current())
    edit("src/reasonrl/losses.py")
    seen.append(current())
    edit("src/reasonrl/report/__init__.py")
    assert current() == seen[-1]
    version = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.0.1" if name == "transformers" else version(name))
    seen.append(current())
    on_gpu, threads = current("cuda"), torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        seen.append(current())
        assert current("cuda") == on_gpu  # GPU kernels do not split their sums by CPU thread
    finally:
        torch.set_num_threads(threads)
    assert len(set(seen)) == len(seen)


def test_a_resumed_runs_bar_counts_every_step_and_times_only_the_remaining_ones():
    bar = step_progress(40, 80, enabled=True)
    assert (bar.n, bar.total) == (40, 80)
    assert list(bar) == list(range(40, 80))
    assert bar.n == bar.total == 80
    # 10 steps of this run in 10 s: 30 left at 1 step/s (the 40 resumed steps took no time of this run).
    assert "50/80 [00:10<00:30" in bar.format_meter(**{**bar.format_dict, "n": 50, "elapsed": 10})

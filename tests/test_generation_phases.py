"""The training loops generate only inside the engine's generation phases and train only while it sleeps.

In ``colocate`` that is what frees the engine's GPU memory for training; here (CPU) sleeping frees nothing, but the
engine keeps the same awake/asleep state and refuses to generate while asleep, so these runs check the loops' order:
every policy forward (training and old log-probs) sees a sleeping engine, and every sample comes from a woken one.
The engine sleeps at ``rollout.sleep_level`` 2, which drops its weights (every layout refuses to generate until
weights are loaded): every generation phase of every loop loads the policy's weights.
Each loop runs with the chat prompt ``r1_zero_chat``: every prompt it gives the engine (rollouts and validation)
is rendered through the tiny tokenizer's chat template.
"""

import pytest
import torch

from reasonrl.cli import open_live
from reasonrl.config import EIConfig, EngineConfig, EvalConfig, GRPOConfig, SFTConfig
from reasonrl.data import parse_lines
from reasonrl.expert_iteration import run_expert_iteration
from reasonrl.grpo import run_grpo
from reasonrl.prompts import load_prompt
from reasonrl.rollouts.engine import RolloutEngine
from reasonrl.sft import Pair, run_sft
from reasonrl.synthetic import arithmetic_lines
from reasonrl.training import checkpoints
from reasonrl.training.policy import load_policy


def keep_everything(response: str, truth: str) -> dict[str, float]:
    """A reward for expert iteration's filter that keeps every rollout, so each round trains."""
    return {"reward": 1.0}


pytestmark = pytest.mark.slow
EVAL = EvalConfig(max_tokens=8)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    config = EngineConfig(cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True, sleep_level=2)
    return RolloutEngine(tiny_model_dir, config)


@pytest.fixture(scope="module")
def problems():
    return parse_lines(arithmetic_lines(16, seed=0, max_steps=1, max_value=9), "arithmetic")


class PhaseRecorder:
    """Records, for every forward pass of the policy, whether the engine was asleep; counts the engine's wakes and
    keeps the prompts it is given."""

    def __init__(self, engine: RolloutEngine, policy: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        self.engine, self.asleep_at_forward, self.wakes, self.prompts = engine, [], 0, []
        # The decoder: the log-prob path runs it directly, not through the causal-LM wrapper.
        hook = lambda module, args: self.asleep_at_forward.append(engine.asleep)  # noqa: E731
        policy.get_decoder().register_forward_pre_hook(hook)
        wake_up = engine.wake_up

        def counting_wake_up(policy=None):
            self.wakes += 1
            wake_up(policy)

        monkeypatch.setattr(engine, "wake_up", counting_wake_up)
        generate = engine.generate

        def recording_generate(prompts, **kwargs):
            self.prompts.extend(prompts)
            return generate(prompts, **kwargs)

        monkeypatch.setattr(engine, "generate", recording_generate)

    def check(self, expected_wakes: int, problems: list, tokenizer) -> None:
        assert self.asleep_at_forward and all(self.asleep_at_forward), "the policy ran while the engine was awake"
        assert self.wakes == expected_wakes
        assert self.engine.asleep, "a loop left the engine awake"
        chat = {load_prompt("r1_zero_chat").render(p.question, tokenizer) for p in problems}
        assert self.prompts and set(self.prompts) <= chat, "a prompt was not r1_zero_chat through the chat template"
        assert all(prompt.startswith("<|im_start|>system\n") for prompt in chat)


def test_sft_trains_while_the_engine_sleeps(engine, tiny_model_dir, problems, tmp_path, monkeypatch):
    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
    recorder = PhaseRecorder(engine, policy, monkeypatch)
    prompt = load_prompt("r1_zero_chat")
    pairs = [
        Pair(prompt.render(p.question, tokenizer), f" {p.reasoning} </think> <answer> {p.answer} </answer>")
        for p in problems
    ]
    config = SFTConfig(batch_size=4, microbatch_size=2, max_steps=4, eval_every=2, eval_examples=2, prompt=prompt.name)
    run_sft(
        policy, tokenizer, pairs, config, engine, problems[:2], EVAL,
        open_live=lambda resume: open_live(str(tmp_path / "live"), resume=resume), live_dir=tmp_path / "live",
        checkpoint_dir=tmp_path / "checkpoints", init_model_dir=tiny_model_dir,
    )  # fmt: skip
    recorder.check(expected_wakes=2, problems=problems, tokenizer=tokenizer)  # validation after steps 2 and 4


def test_expert_iteration_trains_while_the_engine_sleeps(engine, tiny_model_dir, problems, tmp_path, monkeypatch):
    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
    recorder = PhaseRecorder(engine, policy, monkeypatch)
    config = EIConfig(
        n_steps=2, questions_per_step=4, num_rollouts=2, max_tokens=8, eval_examples=2, batch_size=4,
        prompt="r1_zero_chat",
    )  # fmt: skip
    # A round whose rollouts are all wrong trains on nothing: make every round keep its pairs by rewarding anything.
    monkeypatch.setattr("reasonrl.expert_iteration.prompt_reward", lambda prompt, rewards=None: keep_everything)
    run_expert_iteration(
        policy, tokenizer, engine, problems, problems[:2], config, EVAL,
        open_live=lambda resume: open_live(str(tmp_path / "live"), resume=resume), live_dir=tmp_path / "live",
        checkpoint_dir=tmp_path / "checkpoints", init_model_dir=tiny_model_dir,
    )  # fmt: skip
    recorder.check(expected_wakes=4, problems=problems, tokenizer=tokenizer)  # each round: sampling, then validation


def test_grpo_trains_while_the_engine_sleeps(engine, tiny_model_dir, problems, tmp_path, monkeypatch):
    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
    recorder = PhaseRecorder(engine, policy, monkeypatch)
    config = GRPOConfig(
        n_grpo_steps=2, rollout_batch_size=8, group_size=4, train_batch_size=8, gradient_accumulation_steps=2,
        epochs_per_rollout_batch=2, loss_type="grpo_clip", max_tokens=8, eval_every=2, eval_examples=2,
        checkpoint_every=100, prompt="r1_zero_chat",
    )  # fmt: skip
    # Two epochs: π_old's separate pass runs (at one, π_old comes from the update's own forward, and a tiny model's
    # steps, all without learning signal, would run the policy not at all)
    run_grpo(
        policy, tokenizer, engine, problems, problems[:2], config, EVAL,
        open_live=lambda resume: open_live(str(tmp_path / "live"), resume=resume), live_dir=tmp_path / "live",
        checkpoint_dir=tmp_path / "checkpoints", init_model_dir=tiny_model_dir,
    )  # fmt: skip
    recorder.check(expected_wakes=4, problems=problems, tokenizer=tokenizer)  # validation at 0 and 2, rollouts 0, 1


class Crash(Exception):
    """Stands for a kill right after a checkpoint reached the disk."""


def test_expert_iteration_resumed_after_a_crash_ends_as_an_uninterrupted_run(
    engine, tiny_model_dir, problems, tmp_path, monkeypatch, capsys
):
    """Every rollout kept (a reward of 1 for anything), so every round trains: a run that crashes right after round
    1's checkpoint, rerun from a freshly loaded policy, resumes there and ends with the uninterrupted run's weights,
    best round and curves (round 2's questions, samples and SFT order redrawn from their seeds)."""
    monkeypatch.setattr("reasonrl.expert_iteration.prompt_reward", lambda prompt, rewards=None: keep_everything)
    config = EIConfig(n_steps=2, questions_per_step=4, num_rollouts=2, max_tokens=8, eval_examples=2, batch_size=4)

    def run(work):
        policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
        best = run_expert_iteration(
            policy, tokenizer, engine, problems, problems[:2], config, EVAL,
            open_live=lambda resume: open_live(str(work / "live"), resume=resume), live_dir=work / "live",
            checkpoint_dir=work / "checkpoints", init_model_dir=tiny_model_dir,
        )  # fmt: skip
        return policy, best

    expected, expected_best = run(tmp_path / "uninterrupted")
    write = checkpoints.write_checkpoint

    def write_then_crash(*args):
        write(*args)
        raise Crash

    monkeypatch.setattr(checkpoints, "write_checkpoint", write_then_crash)
    with pytest.raises(Crash):
        run(tmp_path / "resumed")
    monkeypatch.setattr(checkpoints, "write_checkpoint", write)
    capsys.readouterr()
    resumed, resumed_best = run(tmp_path / "resumed")
    assert f"expert iteration: resuming from {tmp_path / 'resumed/checkpoints/step-000001'} (step 1)" in (
        capsys.readouterr().out
    )
    init = load_policy(tiny_model_dir, torch.device("cpu"))[0].state_dict()
    weights = resumed.state_dict()
    assert any(not torch.equal(weights[name], init[name]) for name in init), "no round trained"
    assert all(torch.equal(tensor, weights[name]) for name, tensor in expected.state_dict().items())
    assert (resumed_best.step, resumed_best.accuracy) == (expected_best.step, expected_best.accuracy)
    assert all(torch.equal(t, resumed_best.state_dict[n]) for n, t in expected_best.state_dict.items())
    for curve in ("train/loss.tsv", "rollout/kept_pairs.tsv", "eval/accuracy.tsv"):
        tables = [(tmp_path / name / "live/plots/metrics" / curve).read_text() for name in ("uninterrupted", "resumed")]
        assert tables[0] == tables[1] and len(tables[0].splitlines()) == 1 + 2, curve

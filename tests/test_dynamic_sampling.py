"""Dynamic sampling (DAPO): groups without reward variance are dropped and more questions drawn, repeatably."""

import contextlib
import functools
import io
import sys
from dataclasses import replace

import pytest

from reasonrl.config import EngineConfig, EvalConfig, GRPOConfig
from reasonrl.data import parse_lines
from reasonrl.distributed import SINGLE
from reasonrl.evaluation import evaluate
from reasonrl.grpo import rollout_metrics, score_rollouts, summarize_rollouts
from reasonrl.prompts import REWARD_FNS
from reasonrl.rewards import reward_fn
from reasonrl.rollouts.drawing import draw_rollouts
from reasonrl.rollouts.engine import RolloutEngine
from reasonrl.rollouts.types import StepRollouts
from reasonrl.synthetic import arithmetic_lines

pytestmark = pytest.mark.slow


def odd_length_reward(response: str, ground_truth: str) -> dict[str, float]:
    """A reward a random model earns about half the time: groups with and without variance both occur."""
    reward = float(len(response) % 2)
    return {"format_reward": reward, "answer_reward": reward, "reward": reward}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return RolloutEngine(tiny_model_dir, EngineConfig(cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True))


@pytest.fixture(scope="module")
def setting():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(REWARD_FNS, "r1_zero", odd_length_reward)
        train = parse_lines(arithmetic_lines(64, seed=0, max_steps=1, max_value=9), "train")
        config = GRPOConfig(
            rollout_batch_size=32, group_size=2, train_batch_size=32, gradient_accumulation_steps=1, max_tokens=6,
            dynamic_sampling=True, max_sampling_rounds=4,
        )  # fmt: skip
        yield train, config


# One draw of step 11 each, shared by the tests: with dynamic sampling, capped at one round, and without.
@pytest.fixture(scope="module")
def dynamic(engine, setting):
    train, config = setting
    return draw_rollouts(engine, train, config, stop=[], step_seed=11)


@pytest.fixture(scope="module")
def capped(engine, setting):
    """The draw, and what it printed."""
    train, config = setting
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        drawn = draw_rollouts(engine, train, replace(config, max_sampling_rounds=1), stop=[], step_seed=11)
    return drawn, printed.getvalue()


@pytest.fixture(scope="module")
def plain(engine, setting):
    train, config = setting
    return draw_rollouts(engine, train, replace(config, dynamic_sampling=False), stop=[], step_seed=11)


def variance_groups(drawn, group_size):
    rewards = [odd_length_reward(sample.text, "")["reward"] for sample in drawn.samples]
    return [len(set(rewards[i : i + group_size])) > 1 for i in range(0, len(rewards), group_size)]


def test_dynamic_sampling_keeps_only_groups_with_signal_and_replays(engine, setting, dynamic):
    train, config = setting
    groups = variance_groups(dynamic, config.batching.group_size)
    print(f"kept {len(groups)} groups in {dynamic.sampling_rounds} rounds, dropped {dynamic.dropped_groups}")
    assert all(groups) and len(dynamic.samples) == len(dynamic.questions) * config.batching.group_size
    assert dynamic.dropped_groups > 0 and dynamic.sampling_rounds > 1
    assert (
        len(dynamic.questions) == config.batching.questions_per_step
        or dynamic.sampling_rounds == config.sampling.max_sampling_rounds
    )
    assert len({id(question) for question in dynamic.questions}) == len(dynamic.questions), "a question drawn twice"
    again = draw_rollouts(engine, train, config, stop=[], step_seed=11)
    assert [s.token_ids for s in again.samples] == [s.token_ids for s in dynamic.samples]


def test_a_capped_step_trains_on_fewer_groups_and_says_so(setting, capped):
    train, config = setting
    drawn, printed = capped
    assert drawn.sampling_rounds == 1 and 0 < len(drawn.questions) < config.batching.questions_per_step
    assert all(variance_groups(drawn, config.batching.group_size))
    assert f"found {len(drawn.questions)} of {config.batching.questions_per_step} groups" in printed


def test_without_dynamic_sampling_every_group_stays(setting, plain):
    train, config = setting
    assert len(plain.questions) == config.batching.questions_per_step and plain.dropped_groups == 0
    assert not all(variance_groups(plain, config.batching.group_size))


def test_the_logged_rollout_figures_are_every_sampled_group_and_the_kept_ones_apart(setting, dynamic, capped, plain):
    """On the same first round, a step with dynamic sampling logs under ``rollout/`` what a step without it logs;
    what it trains on is logged under ``rollout/kept_``."""
    train, config = setting
    first_round_only, _ = capped
    group_size = config.batching.group_size
    without = SINGLE.mean_metrics(rollout_metrics(plain, group_size, dynamic_sampling=False))
    one_round = SINGLE.mean_metrics(rollout_metrics(first_round_only, group_size, dynamic_sampling=True))
    print(f"rollout/reward {without['rollout/reward']:.4f} without dynamic sampling, {one_round['rollout/reward']:.4f}"
          f" with it (kept: {one_round['rollout/kept_reward']:.4f}); zero-variance groups "
          f"{one_round['rollout/zero_variance_group_fraction']:.4f} (kept: "
          f"{one_round['rollout/kept_zero_variance_group_fraction']:.4f})")  # fmt: skip
    assert {name: value for name, value in one_round.items() if "kept" not in name} == without
    assert without["rollout/zero_variance_group_fraction"] > 0
    kept_rewards = [odd_length_reward(sample.text, "")["reward"] for sample in first_round_only.samples]
    assert one_round["rollout/kept_reward"] == pytest.approx(sum(kept_rewards) / len(kept_rewards))
    assert one_round["rollout/kept_zero_variance_group_fraction"] == 0.0

    # Several rounds: every group sampled in the step, the dropped ones among them, the first round first.
    first_round = [sample.token_ids for sample in plain.samples]
    assert [sample.token_ids for sample in dynamic.sampled_samples[: len(first_round)]] == first_round
    logged = SINGLE.mean_metrics(rollout_metrics(dynamic, group_size, dynamic_sampling=True))
    rewards = [odd_length_reward(sample.text, "")["reward"] for sample in dynamic.sampled_samples]
    assert logged["rollout/reward"] == pytest.approx(sum(rewards) / len(rewards))
    groups = len(dynamic.sampled_samples) // config.batching.group_size
    assert logged["rollout/zero_variance_group_fraction"] == pytest.approx(dynamic.dropped_groups / groups)


def test_each_sample_is_graded_once_as_it_is_drawn(engine, setting, dynamic):
    """The draw grades every sample it samples, kept or dropped, once; the step's scores and metrics read those
    grades, and call the reward no more."""
    train, config = setting
    graded = []

    def counted(response: str, ground_truth: str) -> dict[str, float]:
        graded.append(response)
        return odd_length_reward(response, ground_truth)

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(REWARD_FNS, "r1_zero", counted)
        drawn = draw_rollouts(engine, train, config, stop=[], step_seed=11)
        assert graded == [sample.text for sample in drawn.sampled_samples]
        group_size, loss = config.batching.group_size, config.loss
        batch = score_rollouts(engine.tokenizer(), drawn, group_size, loss, config.sampling)
        rollout_metrics(drawn, group_size, dynamic_sampling=True)
        assert len(graded) == len(drawn.sampled_samples)
    assert drawn.sampled_scores == [odd_length_reward(sample.text, "") for sample in drawn.sampled_samples]
    assert drawn.scores == [odd_length_reward(sample.text, "") for sample in drawn.samples]
    assert batch.raw_rewards.tolist() == [score["reward"] for score in drawn.scores]
    assert [sample.token_ids for sample in drawn.samples] == [sample.token_ids for sample in dynamic.samples]


def test_a_users_reward_grades_each_sample_once_in_a_step_and_in_an_evaluation(engine, setting, monkeypatch):
    """``rewards.r1_zero: rewards.tolerant:tolerant_reward``, the shipped example module, loaded by the stages' own
    mechanism, its function wrapped to record each call: a GRPO step with dynamic sampling (its draw over several
    rounds, scores, advantages and logged figures) and an evaluation of two samples per question call it exactly once
    per sample they sampled, in order."""
    train, config = setting
    spec = "rewards.tolerant:tolerant_reward"
    rewards = {"r1_zero": spec}
    original = reward_fn(spec)  # imports rewards.tolerant from this tree's rewards/ package
    calls = []

    @functools.wraps(original)
    def counted(response: str, ground_truth: str) -> dict[str, float]:
        calls.append(response)
        return original(response, ground_truth)

    monkeypatch.setattr(sys.modules["rewards.tolerant"], "tolerant_reward", counted)
    drawn = draw_rollouts(engine, train, config, stop=[], step_seed=11, rewards=rewards)
    score_rollouts(engine.tokenizer(), drawn, config.batching.group_size, config.loss, config.sampling)
    summarize_rollouts(StepRollouts(11, 11, drawn), config.batching.group_size, config.sampling)
    assert calls == [sample.text for sample in drawn.sampled_samples] and drawn.sampling_rounds > 1
    calls.clear()
    eval_config = EvalConfig(max_tokens=6, stop=[], num_examples=4, samples_per_question=2)
    result = evaluate(engine, train, "r1_zero", eval_config, seed=0, rewards=rewards)
    assert calls == [record["response"] for record in result.records] and len(calls) == 8

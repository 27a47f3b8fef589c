"""Dynamic sampling (DAPO): groups without reward variance are dropped and more questions drawn, repeatably."""

import pytest

from reasonrl.config import EngineConfig, GRPOConfig
from reasonrl.data import parse_lines
from reasonrl.grpo import draw_rollouts
from reasonrl.prompts import REWARD_FNS
from reasonrl.rollout import RolloutEngine
from reasonrl.synthetic import arithmetic_lines

pytestmark = pytest.mark.slow


def odd_length_reward(response: str, ground_truth: str) -> dict[str, float]:
    """A reward a random model earns about half the time: groups with and without variance both occur."""
    reward = float(len(response) % 2)
    return {"format_reward": reward, "answer_reward": reward, "reward": reward}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return RolloutEngine(tiny_model_dir, EngineConfig(cpu_kv_cache_gib=1, max_model_len=512))


@pytest.fixture
def setting(monkeypatch):
    monkeypatch.setitem(REWARD_FNS, "r1_zero", odd_length_reward)
    train = parse_lines(arithmetic_lines(64, seed=0, max_steps=1, max_value=9), "train")
    config = GRPOConfig(
        rollout_batch_size=32, group_size=2, train_batch_size=32, gradient_accumulation_steps=1, max_tokens=6,
        dynamic_sampling=True, max_sampling_rounds=4,
    )  # fmt: skip
    return train, config


def variance_groups(drawn, group_size):
    rewards = [odd_length_reward(sample.text, "")["reward"] for sample in drawn.samples]
    return [len(set(rewards[i : i + group_size])) > 1 for i in range(0, len(rewards), group_size)]


def test_dynamic_sampling_keeps_only_groups_with_signal_and_replays(engine, setting):
    train, config = setting
    drawn = draw_rollouts(engine, train, config, stop=[], step_seed=11)
    groups = variance_groups(drawn, config.group_size)
    print(f"kept {len(groups)} groups in {drawn.sampling_rounds} rounds, dropped {drawn.dropped_groups}")
    assert all(groups) and len(drawn.samples) == len(drawn.questions) * config.group_size
    assert drawn.dropped_groups > 0 and drawn.sampling_rounds > 1
    assert len(drawn.questions) == config.questions_per_step or drawn.sampling_rounds == config.max_sampling_rounds
    assert len({id(question) for question in drawn.questions}) == len(drawn.questions), "a question drawn twice"
    again = draw_rollouts(engine, train, config, stop=[], step_seed=11)
    assert [s.token_ids for s in again.samples] == [s.token_ids for s in drawn.samples]


def test_a_capped_step_trains_on_fewer_groups_and_says_so(engine, setting, capsys):
    train, config = setting
    config = GRPOConfig(**{**config.__dict__, "max_sampling_rounds": 1})
    drawn = draw_rollouts(engine, train, config, stop=[], step_seed=11)
    assert drawn.sampling_rounds == 1 and 0 < len(drawn.questions) < config.questions_per_step
    assert all(variance_groups(drawn, config.group_size))
    assert f"found {len(drawn.questions)} of {config.questions_per_step} groups" in capsys.readouterr().out


def test_without_dynamic_sampling_every_group_stays(engine, setting):
    train, config = setting
    config = GRPOConfig(**{**config.__dict__, "dynamic_sampling": False})
    drawn = draw_rollouts(engine, train, config, stop=[], step_seed=11)
    assert len(drawn.questions) == config.questions_per_step and drawn.dropped_groups == 0
    assert not all(variance_groups(drawn, config.group_size))

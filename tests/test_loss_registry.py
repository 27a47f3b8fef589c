"""The loss registry is the one place a loss type is known: each entry computes what it declares, and a loss type
registered here (and only here) is taken up by the params schema, the loss, its metrics and the GRPO loop."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reasonrl.config import ConfigError, GRPOConfig
from reasonrl.grpo import FixedLogProbs, Forwards, accumulate_gradients, has_learning_signal
from reasonrl.loss_registry import LOSS_TYPES, LossSettings, register_loss
from reasonrl.losses import compute_policy_gradient_loss, grpo_microbatch_train_step
from tests.test_grpo import fixed_batch

REPO = Path(__file__).resolve().parents[1]
THROWAWAY = "capped_ratio_on_rewards"
OFF_POLICY = {"rollout_batch_size": 8, "group_size": 2, "train_batch_size": 4, "gradient_accumulation_steps": 1}

REGISTER_THROWAWAY = f"""
from reasonrl.loss_registry import register_loss

@register_loss(
    {THROWAWAY!r}, "raw_rewards", needs_old_log_probs=True, settings=("cliprange",),
    token_metrics={{"ratio_above_one_fraction": "above_one"}},
)
def capped_ratio_on_rewards(weights, policy_log_probs, old_log_probs, response_mask, settings):
    ratio = (policy_log_probs - old_log_probs).exp()
    return -weights * ratio.clamp(max=1.0 + settings.cliprange), {{"above_one": ratio > 1.0}}
"""
"""A loss type none of the other modules knows of: the raw reward times a ratio capped at 1 + cliprange."""


@pytest.fixture
def throwaway():
    """The throwaway loss type, registered for one test and removed after it (the registry is module state)."""
    exec(REGISTER_THROWAWAY, {})
    yield THROWAWAY
    del LOSS_TYPES[THROWAWAY]


def every_input(batch: int = 3, tokens: int = 4) -> dict[str, torch.Tensor | float]:
    generator = torch.Generator().manual_seed(0)
    return {
        "raw_rewards": (torch.rand(batch, 1, generator=generator) > 0.5).float(),
        "advantages": torch.randn(batch, 1, generator=generator),
        "old_log_probs": -torch.rand(batch, tokens, generator=generator),
        "cliprange": 0.2,
        "cliprange_high": 0.28,
        "response_mask": torch.tensor([[1.0] * tokens] + [[1.0] * (tokens - 1) + [0.0]] * (batch - 1)),
    }


@pytest.mark.parametrize("name", list(LOSS_TYPES))
def test_each_entry_computes_a_per_token_loss_with_the_metrics_it_declares(name):
    entry = LOSS_TYPES[name]
    log_probs = -torch.rand(3, 4, generator=torch.Generator().manual_seed(1))
    given = every_input()
    loss, metadata = compute_policy_gradient_loss(log_probs, name, **given)
    assert loss.shape == (3, 4)
    for flag in entry.token_metrics.values():
        assert metadata[flag].shape == (3, 4) and metadata[flag].dtype == torch.bool
    settings = LossSettings(given["cliprange"], given["cliprange_high"])
    direct, _ = entry.per_token(
        given[entry.weight], log_probs, given["old_log_probs"], given["response_mask"], settings
    )
    assert torch.equal(direct, loss)
    assert set(entry.inputs) <= set(given)
    for missing in entry.inputs:
        short = {key: value for key, value in given.items() if key != missing}
        with pytest.raises(ValueError, match=f"loss_type '{name}' needs {missing}"):
            compute_policy_gradient_loss(log_probs, name, **short)


def test_registration_refuses_a_taken_name_an_unknown_weight_or_setting():
    with pytest.raises(ValueError, match="'grpo_clip' is already registered"):
        register_loss("grpo_clip", "advantages")
    with pytest.raises(ValueError, match="weight must be one of raw_rewards, advantages; got 'rewards'"):
        register_loss("new", "rewards")
    with pytest.raises(ValueError, match="settings must be among"):
        register_loss("new", "advantages", settings=("epsilon",))
    with pytest.raises(ValueError, match="optional_settings among them"):
        register_loss("new", "advantages", optional_settings=("cliprange_high",))
    assert "new" not in LOSS_TYPES


def test_a_loss_type_registered_in_the_registry_alone_reaches_the_loss_and_its_metrics(throwaway):
    log_probs = torch.log(torch.tensor([[0.5, 0.25, 0.9]])).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.5, 0.9]]))  # ρ = [2, 0.5, 1]
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match=f"loss_type '{throwaway}' needs raw_rewards, old_log_probs, cliprange"):
        compute_policy_gradient_loss(log_probs, throwaway, advantages=torch.ones(1, 1))
    loss, metadata = grpo_microbatch_train_step(
        log_probs, mask, 1, throwaway, raw_rewards=torch.tensor([[3.0]]), advantages=torch.zeros(1, 1),
        old_log_probs=old, cliprange=0.2,
    )  # fmt: skip
    assert loss.item() == pytest.approx(-3.0 * (1.2 + 0.5) / 2)  # its weight is the raw reward, ρ capped at 1.2
    assert log_probs.grad.tolist()[0] == pytest.approx([0.0, -3.0 * 0.5 / 2, 0.0])  # the cap stops the gradient
    assert metadata["ratio_above_one_fraction"].item() == pytest.approx(1 / 2)  # over the response tokens only


def test_a_loss_type_registered_in_the_registry_alone_reaches_the_grpo_loop(throwaway, tiny_model):
    """Its weight decides whether a step has signal, its metrics are the step's, and its ratio lets it train
    off-policy; it reads no cliprange_high, so that is refused."""
    config = GRPOConfig(**OFF_POLICY, loss_type=throwaway)  # off-policy: accepted, it reads old log-probs
    with pytest.raises(
        ConfigError, match=f"only grpo_clip or gspo or gspo_token or cispo clips; .* \\(it is {throwaway}\\)"
    ):
        GRPOConfig(**OFF_POLICY, loss_type=throwaway, cliprange_high=0.28)
    rewards_only = fixed_batch(advantages=[0.0] * 4, raw_rewards=[1.0, 0.0, 0.0, 0.0])
    signal = [has_learning_signal(rewards_only, rows, config.loss) for rows in ([0, 1], [2, 3])]
    assert signal == [True, False]
    tiny_model.zero_grad()
    old = torch.full(rewards_only.response_mask.shape, -50.0)  # every ratio π/π_old above 1
    fixed, forwards, max_tokens = FixedLogProbs(old=old), Forwards.training(config), config.sampling.max_tokens
    metrics = accumulate_gradients(tiny_model, rewards_only, [0, 1, 2, 3], fixed, config.loss, forwards, max_tokens)
    tiny_model.zero_grad()
    assert metrics["train/ratio_above_one_fraction"] == pytest.approx(1.0)
    assert "train/clip_fraction" not in metrics


def test_a_loss_type_registered_before_the_schema_loads_is_a_valid_param_and_loads_no_torch():
    """``grpo.loss_type``'s choices are read from the registry when the schema is imported: in a fresh interpreter
    (no state left behind here), a loss type registered first is a valid name and sets the schema's checks."""
    probe = REGISTER_THROWAWAY + (
        "from reasonrl.config import ConfigError, GRPOConfig, from_dict\n"
        f"config = from_dict(GRPOConfig, {{'loss_type': {THROWAWAY!r}, **{OFF_POLICY!r}}}, 'grpo')\n"
        "try:\n"
        "    from_dict(GRPOConfig, {'loss_type': 'no_such_loss'}, 'grpo')\n"
        "except ConfigError as error:\n"
        "    print(error)\n"
        "import sys\n"
        "print(config.loss.loss_type, sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    refused, accepted = result.stdout.strip().splitlines()
    assert refused.startswith("grpo.loss_type: must be one of [") and f"'{THROWAWAY}'" in refused
    assert accepted == f"{THROWAWAY} []"

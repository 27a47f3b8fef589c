"""The GPU memory plan: sizes read from a model directory, calibrated against H200 measurements, and the defaults
of every layout fitting an 80 GB card with Qwen2.5-Math-1.5B; a plan that does not fit names the params to change."""

import dataclasses

import pytest
from transformers import AutoModelForCausalLM

from reasonrl.config import ConfigError, EngineConfig, GRPOConfig, Params, from_dict, parse_yaml
from reasonrl.memory import RESERVE_BYTES, ModelShape, check_memory_plan, plan_memory

# Qwen2.5-Math-1.5B: hidden 1536, 28 layers, MLP 8960, vocabulary 151,936 with tied embeddings, 2 KV heads.
QWEN_1_5B = ModelShape(parameters=1_543_714_304, hidden_size=1536, num_layers=28, intermediate_size=8960)
CARD_80GB = 85_045_231_616  # what torch reports as an 80 GB H100's total memory (79.2 GiB)


def test_shape_is_read_from_the_directory_without_loading_the_model(tiny_model_dir):
    shape = ModelShape.from_dir(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.parameters == sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert (shape.hidden_size, shape.num_layers) == (model.config.hidden_size, model.config.num_hidden_layers)


def test_a_directory_without_safetensors_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 8}')
    with pytest.raises(ConfigError, match=str(tmp_path)):
        ModelShape.from_dir(tmp_path)


# One GRPO step of 256 responses on an H200, Qwen2.5-Math-1.5B's shape in pure bf16: peak GB measured by
# torch.cuda.max_memory_allocated, by microbatch token budget and gradient checkpointing.
MEASURED_PEAK_GB = {(8192, False): 35.0, (16384, False): 57.0, (16384, True): 15.5}


@pytest.mark.parametrize(("tokens", "checkpointing"), list(MEASURED_PEAK_GB))
def test_plan_matches_the_peaks_measured_on_a_gpu(tokens, checkpointing):
    settings = GRPOConfig(microbatch_tokens=tokens, gradient_checkpointing=checkpointing, precision="bf16")
    plan = plan_memory(QWEN_1_5B, settings, EngineConfig(layout="split"), CARD_80GB)
    planned = (plan.training - RESERVE_BYTES) / 1e9
    measured = MEASURED_PEAK_GB[tokens, checkpointing]
    print(f"{tokens} tokens, checkpointing {checkpointing}: planned {planned:.1f} GB, measured {measured} GB")
    assert measured <= planned <= 1.1 * measured


@pytest.fixture
def full_scale(full_scale_params) -> Params:
    return from_dict(Params, parse_yaml(full_scale_params))


@pytest.mark.parametrize("layout", ["colocate", "split"])
@pytest.mark.parametrize("section", ["sft", "ei", "grpo"])
def test_the_committed_defaults_fit_an_80gb_card_in_every_layout(full_scale, layout, section):
    engine = dataclasses.replace(full_scale.rollout, layout=layout)
    plan = plan_memory(QWEN_1_5B, getattr(full_scale, section), engine, CARD_80GB)
    print(f"{section}, {layout}: {plan.summary()}")
    check_memory_plan(plan, section, engine)


def test_an_engine_share_that_leaves_the_policy_no_room_names_the_share(full_scale):
    engine = dataclasses.replace(full_scale.rollout, layout="colocate", gpu_memory_utilization=0.85)
    plan = plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB)
    with pytest.raises(ConfigError, match=r"^rollout.gpu_memory_utilization: .*at most 0\.\d\d fits"):
        check_memory_plan(plan, "grpo", engine)


def test_a_token_budget_too_large_names_the_budget_and_the_remedies(full_scale):
    settings = dataclasses.replace(full_scale.grpo, microbatch_tokens=65536)
    plan = plan_memory(QWEN_1_5B, settings, full_scale.rollout, CARD_80GB)
    with pytest.raises(ConfigError, match=r"^grpo.microbatch_tokens: .*grpo.gradient_checkpointing=true"):
        check_memory_plan(plan, "grpo", full_scale.rollout)
    checkpointed = dataclasses.replace(settings, gradient_checkpointing=True)
    check_memory_plan(plan_memory(QWEN_1_5B, checkpointed, full_scale.rollout, CARD_80GB), "grpo", full_scale.rollout)


def test_an_engine_that_stays_awake_while_training_is_counted(full_scale):
    awake = dataclasses.replace(full_scale.rollout, layout="colocate", enable_sleep=False)
    asleep = dataclasses.replace(awake, enable_sleep=True)
    plans = [plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB) for engine in (awake, asleep)]
    assert plans[0].training - plans[1].training == plans[0].engine > 0


def test_fsdp2_splits_the_policy_state_over_its_ranks(full_scale):
    engine = dataclasses.replace(full_scale.rollout, layout="colocate")
    whole, shard = (plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB, shards) for shards in (1, 8))
    for part in ("weights", "gradients", "optimizer"):
        assert getattr(shard, part) == getattr(whole, part) // 8
    assert shard.activations == whole.activations and shard.engine == whole.engine  # per GPU either way

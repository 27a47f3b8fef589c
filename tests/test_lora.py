"""LoRA (``sft/ei/grpo.lora_rank``): only the adapters train, and everything outside the training loop (the engine,
the best checkpoint, the saved directories, the KL reference) sees the merged or the original model exactly."""

import dataclasses

import pytest
import torch
from test_sft import PAIRS
from transformers import AutoModelForCausalLM

from reasonrl.config import ConfigError, EngineConfig, GRPOConfig, SFTConfig
from reasonrl.lora import adapters_disabled, check_lora_targets, merged_weights, trainable_parameters
from reasonrl.memory import ModelShape, plan_memory
from reasonrl.sft import sft_schedule, sft_steps
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.optimizer import make_optimizer
from reasonrl.training.policy import load_policy, save_policy

LORA = SFTConfig(lora_rank=4, learning_rate=1e-2, warmup_ratio=0.0, batch_size=4, microbatch_size=2)


def logits(model, tokenizer) -> torch.Tensor:
    input_ids = tokenizer([PAIRS[0].prompt + PAIRS[0].response], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model.eval()(input_ids).logits


def trained_lora_policy(model_dir, config=LORA, steps=3, gradient_checkpointing=False):
    torch.manual_seed(0)  # the adapters' initialisation draws from the global generator, whatever ran before
    policy, tokenizer = load_policy(
        model_dir, torch.device("cpu"), gradient_checkpointing=gradient_checkpointing, lora=config.lora
    )
    optimizer, schedule = make_optimizer(policy, config.optimizer), sft_schedule(config, steps)
    metrics = list(sft_steps(policy, tokenizer, optimizer, schedule, PAIRS, config, epochs=steps))
    return policy, tokenizer, metrics


def load_merged(model_dir, policy) -> torch.nn.Module:
    """A plain HF model holding ``merged_weights(policy)`` (strict: the names are exactly the base model's)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.load_state_dict(dict(merged_weights(policy)), strict=True)
    return model


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("sft", {"lora_rank": -1}, "sft.lora_rank: must be ≥ 0"),
        ("sft", {"lora_alpha": 0.0}, "sft.lora_alpha: must be > 0"),
        ("grpo", {"lora_target_modules": []}, "grpo.lora_target_modules: must be a non-empty list"),
        ("grpo", {"lora_target_modules": ["q_proj", "model.layers.0"]}, "grpo.lora_target_modules"),
    ],
)
def test_invalid_lora_params_are_named(section, values, message):
    config = {"sft": SFTConfig, "grpo": GRPOConfig}[section]
    with pytest.raises(ConfigError, match=message):
        config(**values)


def test_target_modules_are_checked_against_the_model_before_it_loads(tiny_model_dir):
    check_lora_targets(tiny_model_dir, LORA.lora, "sft")
    for targets in (["q_proj", "qkv_proj"], ["embed_tokens"], ["lm_head"]):  # tied vocabulary layers: refused
        with pytest.raises(ConfigError, match=rf"^ei.lora_target_modules: {targets[-1]} name no weight matrix.*q_proj"):
            check_lora_targets(tiny_model_dir, dataclasses.replace(LORA.lora, lora_target_modules=targets), "ei")
    check_lora_targets(
        tiny_model_dir, dataclasses.replace(LORA.lora, lora_rank=0, lora_target_modules=["nothing"]), "sft"
    )


def test_only_the_adapters_train_and_the_policy_starts_as_the_base_model(tiny_model_dir):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"), lora=LORA.lora)
    trained = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
    assert len(trained) == 2 * len(LORA.lora.lora_target_modules) * base.config.num_hidden_layers
    assert torch.equal(logits(policy, tokenizer), logits(base, tokenizer))  # B = 0: no change before a step
    adapter_size = sum(p.numel() for p in trainable_parameters(policy))
    assert adapter_size == ModelShape.from_dir(tiny_model_dir).lora_parameters(4, LORA.lora.lora_target_modules)
    assert adapter_size < 0.1 * sum(p.numel() for p in base.parameters())


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_a_lora_step_trains_and_the_merged_weights_are_that_model(tiny_model_dir, gradient_checkpointing):
    policy, tokenizer, metrics = trained_lora_policy(tiny_model_dir, gradient_checkpointing=gradient_checkpointing)
    assert metrics[-1]["train/loss"] < metrics[0]["train/loss"]
    assert all(m["train/grad_norm"] > 0 for m in metrics)  # with checkpointing too: gradients reach the adapters
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    frozen = {name: p for name, p in base.state_dict().items()}
    merged = dict(merged_weights(policy))
    assert merged.keys() == frozen.keys()
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], frozen["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(merged["model.embed_tokens.weight"], frozen["model.embed_tokens.weight"])  # not adapted
    torch.testing.assert_close(logits(load_merged(tiny_model_dir, policy), tokenizer), logits(policy, tokenizer))
    # Merging was computed, not done in place: the adapters and the frozen base weights are untouched.
    assert torch.equal(
        policy.model.layers[0].self_attn.q_proj.base_layer.weight, frozen["model.layers.0.self_attn.q_proj.weight"]
    )


def test_with_adapters_disabled_the_policy_is_the_model_it_started_from(tiny_model_dir):
    policy, tokenizer, _ = trained_lora_policy(tiny_model_dir)
    trained = logits(policy, tokenizer)
    with adapters_disabled(policy):
        assert torch.equal(
            logits(policy, tokenizer), logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
        )
    assert torch.equal(logits(policy, tokenizer), trained)


def test_saved_and_best_models_are_plain_merged_directories(tiny_model_dir, tmp_path):
    policy, tokenizer, _ = trained_lora_policy(tiny_model_dir)
    best = BestCheckpoint()
    best.offer(policy, accuracy=0.5, step=3)
    save_policy(policy, tokenizer, tmp_path / "final")
    save_policy(policy, tokenizer, tmp_path / "best", best.state_dict)
    expected = logits(policy, tokenizer)
    # The merged model computes (W + BA)x where the adapters computed Wx + B(Ax): equal up to rounding (1.8e-5 seen
    # in one order of the suite's tests), which is far below what the adapters changed.
    tolerance = 1e-4
    untrained = logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    assert (untrained - expected).abs().max() > 100 * tolerance
    for name in ("final", "best"):
        assert not list((tmp_path / name).glob("adapter_*")), "a merged model, not an adapter"
        reloaded, missing = AutoModelForCausalLM.from_pretrained(tmp_path / name, output_loading_info=True)
        assert not any(missing.values()), missing
        torch.testing.assert_close(logits(reloaded, tokenizer), expected, rtol=tolerance, atol=tolerance)


def test_the_memory_plan_counts_gradients_and_adamw_for_the_adapters_only(tiny_model_dir):
    shape = ModelShape.from_dir(tiny_model_dir)
    engine = EngineConfig(layout="split")
    full = plan_memory(shape, GRPOConfig(precision="bf16"), engine, 80 * 2**30)
    lora = plan_memory(shape, GRPOConfig(precision="bf16", lora_rank=4), engine, 80 * 2**30)
    adapters = shape.lora_parameters(4, GRPOConfig().lora.lora_target_modules)
    assert (full.optimizer, lora.optimizer) == (4 * shape.parameters, 4 * adapters)
    assert lora.gradients == 2 * adapters and lora.weights == 2 * (shape.parameters + adapters)
    with_kl = plan_memory(shape, GRPOConfig(precision="bf16", lora_rank=4, kl_coef=0.1), engine, 80 * 2**30)
    assert with_kl.reference == 0  # the reference is the policy with its adapters off


@pytest.mark.slow
def test_the_engine_samples_the_merged_model_after_a_lora_step(tiny_model_dir, tiny_tokenizer):
    """What vLLM generates after a weight load from a LoRA policy is HF's greedy decoding of the merged model, token
    for token: the engine needs no LoRA support."""
    from reasonrl.rollouts.engine import RolloutEngine

    engine = RolloutEngine(
        tiny_model_dir, EngineConfig(layout="cpu", cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True)
    )
    config = dataclasses.replace(LORA, learning_rate=3e-2)
    policy, tokenizer, _ = trained_lora_policy(tiny_model_dir, config, steps=5)
    merged = load_merged(tiny_model_dir, policy)
    prompts = [pair.prompt for pair in PAIRS]
    length = 24
    with engine.serving(policy):
        samples = engine.generate(prompts, temperature=0.0, min_tokens=length, max_tokens=length, stop=())
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    changed = 0
    for prompt, (sample,) in zip(prompts, samples, strict=True):
        input_ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        greedy = {"do_sample": False, "min_new_tokens": length, "max_new_tokens": length}
        with torch.no_grad():
            expected = merged.generate(input_ids, attention_mask=torch.ones_like(input_ids), **greedy)
            untrained = base.generate(input_ids, attention_mask=torch.ones_like(input_ids), **greedy)
        assert sample.token_ids == expected[0, input_ids.shape[1] :].tolist(), prompt
        changed += sample.token_ids != untrained[0, input_ids.shape[1] :].tolist()
    assert changed > 0  # the step changed what the model says, so the match above is the adapters' doing

"""The policy a training stage trains: checked params, loaded on its device, prepared for training, saved."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from reasonrl.atomic import atomic_directory, atomic_write_text
from reasonrl.distributed import SINGLE, Ranks
from reasonrl.lora import add_lora, check_lora_targets, merged_weights, trainable_parameter_count
from reasonrl.memory import MemoryPlan, check_gpu_memory
from reasonrl.models import MODEL_CARD, load_tokenizer, policy_dtype
from reasonrl.prompts import check_prompt

if TYPE_CHECKING:
    from reasonrl.config import EIConfig, EngineConfig, GRPOConfig, LoRAConfig, Precision, SFTConfig
    from reasonrl.rollouts.engine import RolloutEngine
    from reasonrl.rollouts.process import RolloutProcess


def load_policy(
    model_dir: str | Path,
    device: torch.device,
    precision: Precision = "mixed",
    gradient_checkpointing: bool = False,
    lora: LoRAConfig | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy on ``device`` in the dtype of ``precision`` (see :func:`reasonrl.models.policy_dtype`), with LoRA
    adapters when ``lora.lora_rank`` > 0."""
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=policy_dtype(device, precision)).to(device)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return prepare_for_training(policy, gradient_checkpointing, lora), tokenizer


def prepare_for_training(
    policy: PreTrainedModel, gradient_checkpointing: bool = False, lora: LoRAConfig | None = None
) -> PreTrainedModel:
    """``policy`` in train mode with LoRA adapters (when ``lora.lora_rank`` > 0) and gradient checkpointing."""
    lora_on = lora is not None and lora.lora_rank > 0
    if lora_on:
        add_lora(policy, lora)
    if gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        policy.config.use_cache = False
        if lora_on:
            # The frozen embeddings give the checkpointed blocks inputs without grad: no gradient would reach the
            # adapters inside them.
            policy.enable_input_require_grads()
    return policy.train()


def start_training(
    model_dir: str | Path,
    config: SFTConfig | EIConfig | GRPOConfig,
    section: str,
    rollout: EngineConfig,
    ranks: Ranks = SINGLE,
    policy_shards: int = 1,
    max_staleness: int = 0,
) -> tuple[RolloutEngine | RolloutProcess, PreTrainedModel, PreTrainedTokenizerBase, MemoryPlan | None]:
    """What a training stage (``section``: sft, ei or grpo) starts with: its params checked against the model in
    ``model_dir`` before any model loads (its prompt against the tokenizer, LoRA's target modules, the GPU memory
    plan of one of ``policy_shards`` FSDP2 shards, printed), then the rollout engine (this rank's, under torchrun;
    with ``max_staleness`` ≥ 1, asynchronous GRPO's, in a process of its own: see
    :func:`reasonrl.rollouts.process.start_engine`) and the policy on the device the layout gives it; and the memory
    plan (None on the CPU)."""
    from reasonrl.rollouts.process import start_engine  # not at the top: training alone (the GPU bench) needs no vLLM

    check_prompt(config.prompt, f"{section}.prompt", load_tokenizer(model_dir), model_dir)
    check_lora_targets(model_dir, config.lora, section)
    plan = check_gpu_memory(model_dir, config, section, rollout, policy_shards)
    if plan:
        print(f"{section}: {plan.summary()}")
    engine = start_engine(model_dir, rollout, ranks.tensor_parallel_size, max_staleness)
    policy, tokenizer = load_policy(
        model_dir, engine.policy_device(), config.precision, config.gradient_checkpointing, lora=config.lora
    )
    trained, total = trainable_parameter_count(policy), sum(p.numel() for p in policy.parameters())
    print(f"{section}: training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)")
    return engine, policy, tokenizer, plan


def save_policy(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    state_dict: dict | None = None,
    card: str | None = None,
) -> None:
    """Save weights (``state_dict`` if given, e.g. the best checkpoint; else the policy's, LoRA merged), tokenizer
    and model ``card`` (``reasonrl.model_card``) atomically: a plain HF model directory either way."""
    if state_dict is None:
        state_dict = dict(merged_weights(policy))
    with atomic_directory(out_dir) as staging:
        policy.save_pretrained(staging, state_dict=state_dict)
        tokenizer.save_pretrained(staging)
        if card is not None:
            atomic_write_text(staging / MODEL_CARD, card)

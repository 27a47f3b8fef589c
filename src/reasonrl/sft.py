"""Supervised fine-tuning: the inner loop that SFT (handout Algorithm 1) and expert iteration share.

One optimizer step = ``batch_size`` sequences in microbatches (``microbatch_size`` sequences, or filled up to
``microbatch_tokens``: see ``reasonrl.batching``), each through ``sft_microbatch_train_step``; then gradient
clipping, AdamW, the learning-rate schedule (``reasonrl.schedules``). A step's loss is the per-token
mean negative log-likelihood over every response token of its batch (prompt and padding masked out): long responses
weigh by their token count, as in ordinary LM training, and ``microbatch_size`` (a memory setting) does not change
the gradient.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reasonrl.atomic import atomic_directory, atomic_write_text
from reasonrl.batching import chunks, sequence_lengths, split_microbatches, trim_to_rows
from reasonrl.checkpoints import read_state, read_tensors, restore_live, run_fingerprint, write_checkpoint
from reasonrl.checkpoints import resume as resume_from
from reasonrl.code_deps import SOURCE, STAGES, code_digest
from reasonrl.data import examples_digest
from reasonrl.distributed import SINGLE, Ranks
from reasonrl.evaluation import EvalResult, evaluate, summarize
from reasonrl.logprobs import get_response_log_probs
from reasonrl.lora import add_lora, check_lora_targets, merged_weights, trainable_parameter_count, trainable_parameters
from reasonrl.losses import sft_microbatch_train_step
from reasonrl.memory import check_gpu_memory
from reasonrl.models import MODEL_CARD, compute_precision, model_digest, policy_dtype
from reasonrl.prompts import check_prompt
from reasonrl.rewards import reward_identity
from reasonrl.schedules import learning_rate_factor
from reasonrl.tokenization import tokenize_prompt_and_output

if TYPE_CHECKING:
    from dvclive import Live

    from reasonrl.config import EIConfig, EngineConfig, EvalConfig, GRPOConfig, Precision, SFTConfig, SFTOptimization
    from reasonrl.data import GSM8KExample
    from reasonrl.lora import LoRASettings
    from reasonrl.rollouts.engine import RolloutEngine
    from reasonrl.rollouts.process import RolloutProcess


@dataclass(frozen=True)
class Pair:
    """A prompt and the response the model should learn to give."""

    prompt: str
    response: str


def load_policy(
    model_dir: str | Path,
    device: torch.device,
    precision: Precision = "mixed",
    gradient_checkpointing: bool = False,
    lora: LoRASettings | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy on ``device`` in the dtype of ``precision`` (see :func:`reasonrl.models.policy_dtype`), with LoRA
    adapters when ``lora.lora_rank`` > 0."""
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=policy_dtype(device, precision)).to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return prepare_for_training(policy, gradient_checkpointing, lora), tokenizer


def prepare_for_training(
    policy: PreTrainedModel, gradient_checkpointing: bool = False, lora: LoRASettings | None = None
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
) -> tuple[RolloutEngine | RolloutProcess, PreTrainedModel, PreTrainedTokenizerBase]:
    """What a training stage (``section``: sft, ei or grpo) starts with: its params checked against the model in
    ``model_dir`` before any model loads (its prompt against the tokenizer, LoRA's target modules, the GPU memory
    plan of one of ``policy_shards`` FSDP2 shards, printed), then the rollout engine (this rank's, under torchrun;
    with ``max_staleness`` ≥ 1, asynchronous GRPO's, in a process of its own: see
    :func:`reasonrl.rollouts.process.start_engine`) and the policy on the device the layout gives it."""
    from reasonrl.rollouts.process import start_engine  # not at the top: training alone (the GPU bench) needs no vLLM

    check_prompt(config.prompt, f"{section}.prompt", AutoTokenizer.from_pretrained(model_dir), model_dir)
    check_lora_targets(model_dir, config, section)
    plan = check_gpu_memory(model_dir, config, section, rollout, policy_shards)
    if plan:
        print(f"{section}: {plan}")
    engine = start_engine(model_dir, rollout, ranks.tensor_parallel_size, max_staleness)
    policy, tokenizer = load_policy(
        model_dir, engine.policy_device(), config.precision, config.gradient_checkpointing, lora=config
    )
    trained, total = trainable_parameter_count(policy), sum(p.numel() for p in policy.parameters())
    print(f"{section}: training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)")
    return engine, policy, tokenizer


def make_optimizer(
    policy: torch.nn.Module, config: SFTOptimization, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW with a linear warm-up over ``warmup_ratio`` of ``total_steps``, then ``lr_schedule`` over the rest."""
    fused = next(policy.parameters()).is_cuda  # one kernel for all parameters (GPU-only: kept off the CPU's numerics)
    optimizer = torch.optim.AdamW(
        trainable_parameters(policy), lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused
    )
    warmup = round(config.warmup_ratio * total_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate_factor(config.lr_schedule, step, total_steps, warmup)
    )
    return optimizer, schedule


def count_steps(num_pairs: int, batch_size: int, epochs: int, max_steps: int | None = None) -> int:
    steps = epochs * math.ceil(num_pairs / batch_size)
    return steps if max_steps is None else min(steps, max_steps)


def sft_steps(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    pairs: list[Pair],
    config: SFTOptimization,
    epochs: int,
    max_steps: int | None = None,
    start: int = 0,
) -> Iterator[dict[str, float]]:
    """Train on ``pairs`` (shuffled each epoch with ``config.seed``); yield metrics after every optimizer step. A
    resumed run passes the ``start`` steps it has taken: their batches are drawn (the order is a function of the seed
    alone) but not trained on again."""
    if not pairs:
        raise ValueError("no training pairs: an SFT run needs at least one")
    order_rng = random.Random(config.seed)
    total = count_steps(len(pairs), config.batch_size, epochs, max_steps)
    step = 0
    for _ in range(epochs):
        order = list(range(len(pairs)))
        order_rng.shuffle(order)
        for indices in chunks(order, config.batch_size):
            if step == total:
                return
            if step < start:
                step += 1
                continue
            started = time.perf_counter()
            batch = [pairs[index] for index in indices]
            tensors = tokenize_prompt_and_output([p.prompt for p in batch], [p.response for p in batch], tokenizer)
            metrics = accumulate_sft_gradients(policy, tensors, config)
            tokens = metrics.pop("tokens")
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm).item()
            learning_rate = schedule.get_last_lr()[0]
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            seconds = time.perf_counter() - started
            yield metrics | {
                "train/grad_norm": grad_norm,
                "train/learning_rate": learning_rate,
                "time/tokens_per_second": tokens / seconds,
            }


def accumulate_sft_gradients(
    policy: PreTrainedModel, batch: dict[str, torch.Tensor], config: SFTOptimization
) -> dict[str, float]:
    """Backward through ``sft_microbatch_train_step`` for each microbatch of one optimizer step's ``batch`` (the
    tensors of :func:`tokenize_prompt_and_output`); gradients are left in ``.grad``.

    Each microbatch's summed NLL is divided by the batch's response-token count, so the step's loss is the per-token
    mean over the whole batch whatever the split. Returns the loss, the token-weighted entropy and the tokens
    processed (padding included).
    """
    device = next(policy.parameters()).device
    rows = range(len(batch["input_ids"]))
    lengths = sequence_lengths(batch["response_mask"])
    batch_tokens = int(batch["response_mask"].sum())
    loss_sum = entropy_sum = tokens = 0.0
    for part in split_microbatches(rows, lengths, config.microbatch_size, config.microbatch_tokens):
        tensors = {name: tensor.to(device) for name, tensor in trim_to_rows(batch, part).items()}
        mask = tensors["response_mask"]  # [b, T]
        with compute_precision(device, config.precision):
            scores = get_response_log_probs(policy, tensors["input_ids"], tensors["labels"], return_token_entropy=True)
        loss, _ = sft_microbatch_train_step(scores["log_probs"], mask, 1, normalize_constant=batch_tokens / len(part))
        loss_sum += loss.item()
        entropy_sum += (scores["token_entropy"] * mask).sum().item() / batch_tokens
        tokens += tensors["input_ids"].numel()
    return {"train/loss": loss_sum, "train/entropy": entropy_sum, "tokens": tokens}


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


class BestCheckpoint:
    """Keeps a CPU copy of the weights (LoRA merged) with the highest validation accuracy so far."""

    def __init__(self) -> None:
        self.accuracy = -1.0
        self.step: int | None = None
        self.interval: dict[str, Any] | None = None
        """The best accuracy's ``accuracy_interval`` (``reasonrl.evaluation.summarize``), for the model card."""
        self.state_dict: dict[str, torch.Tensor] | None = None

    def offer(
        self,
        policy: torch.nn.Module,
        accuracy: float,
        step: int,
        keep_weights: bool = True,
        interval: dict[str, Any] | None = None,
    ) -> bool:
        """Record a better ``accuracy`` (and its ``interval``); ``keep_weights=False`` (ranks but 0) joins the
        weights' gathers only."""
        if accuracy <= self.accuracy:
            return False
        self.accuracy, self.step, self.interval = accuracy, step, interval
        weights = merged_weights(policy)
        if keep_weights:
            self.state_dict = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        else:
            self.state_dict = None
            for _ in weights:  # every rank takes part in the gathers, in the same order; only rank 0 keeps a copy
                pass
        return True


def validate(
    engine: RolloutEngine,
    policy: PreTrainedModel,
    val: list[GSM8KExample],
    eval_config: EvalConfig,
    num_examples: int,
    prompt_name: str,
    seed: int | None = None,
    ranks: Ranks = SINGLE,
    rewards: Mapping[str, str] | None = None,
) -> EvalResult:
    """Evaluate the policy on the first ``num_examples`` validation questions, in a generation phase of the engine
    (woken, loaded with the policy's weights, put back to sleep), graded by ``rewards[prompt_name]`` (None: the
    prompt's built-in). Over several ranks each data-parallel group evaluates its share of the questions, and every
    rank gets the gathered result."""
    share = ranks.share_range(min(num_examples, len(val)))
    with engine.serving(policy):
        result = evaluate(
            engine,
            val[share.start : share.stop],
            prompt_name,
            dataclasses.replace(eval_config, num_examples=None),
            seed,
            rewards=rewards,
        )
    if not ranks.distributed:
        return result
    mine = [r | {"question_index": r["question_index"] + share.start} for r in result.records]
    records = ranks.gather(mine if ranks.tensor_parallel_rank == 0 else [])  # one copy per engine
    return EvalResult(summarize(records), records)


def log_validation(live: Live, metrics: dict[str, Any]) -> None:
    live.log_metric("eval/accuracy", metrics["accuracy"])
    live.log_metric("eval/format_rate", metrics["format_rate"])
    for subset, length in metrics["response_length"].items():
        if length is not None:
            live.log_metric(f"eval/response_length_{subset}", length)


SFT_STAGE = STAGES / "sft.py"


@dataclass
class SFTState:
    """What a resumed SFT run needs besides the weights, the optimizer and the schedule to continue exactly."""

    step: int = 0
    best_accuracy: float = -1.0
    best_step: int | None = None
    best_interval: dict[str, Any] | None = None


def pairs_digest(pairs: list[Pair]) -> str:
    """SHA-256 of the training pairs, in order."""
    records = [dataclasses.asdict(pair) for pair in pairs]
    return hashlib.sha256(json.dumps(records, ensure_ascii=False).encode()).hexdigest()


def sft_fingerprint(
    config: SFTConfig,
    eval_config: EvalConfig,
    engine_config: EngineConfig,
    init_model_dir: str | Path,
    pairs: list[Pair],
    val: list[GSM8KExample],
    training_device: str = "cpu",
    stage: Path = SFT_STAGE,
    source: Path = SOURCE,
    rewards: Mapping[str, str] | None = None,
) -> str:
    """The inputs an SFT checkpoint was made from, by the rules of GRPO's (:func:`reasonrl.grpo.fingerprint`): the
    params, the init model's files, the pairs, the validation data, the code and the reward that grades validation,
    by content. Other inputs → not resumed."""
    identity = {
        "sft": dataclasses.asdict(config),
        "eval": dataclasses.asdict(eval_config),
        "rollout": dataclasses.asdict(engine_config),
        "init_model": model_digest(init_model_dir),
        "pairs": pairs_digest(pairs),
        "val": examples_digest(val),
        "code": code_digest(stage, source),
        "reward": reward_identity(config.prompt, rewards, source.parent),
    }
    return run_fingerprint(identity, training_device)


def save_sft_checkpoint(
    directory: Path,
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    state: SFTState,
    best: BestCheckpoint,
    live_dir: Path,
    fingerprint: str,
) -> None:
    tensors = {
        "policy": policy.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "best": best.state_dict,
    }
    write_checkpoint(directory, state.step, tensors, state, live_dir, fingerprint)


def load_sft_checkpoint(
    path: Path,
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    best: BestCheckpoint,
    live_dir: Path,
) -> SFTState:
    """Read the whole checkpoint, then restore it (a checkpoint that cannot be read restores nothing)."""
    _, state = read_state(path, SFTState)
    saved = read_tensors(path, ("policy", "optimizer", "schedule", "best"))
    policy.load_state_dict(saved["policy"])
    optimizer.load_state_dict(saved["optimizer"])
    schedule.load_state_dict(saved["schedule"])
    torch.set_rng_state(saved["torch_rng"])
    best.accuracy, best.step, best.interval = state.best_accuracy, state.best_step, state.best_interval
    best.state_dict = saved["best"]
    restore_live(path, live_dir)
    return state


def run_sft(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: list[Pair],
    config: SFTConfig,
    engine: RolloutEngine,
    val: list[GSM8KExample],
    eval_config: EvalConfig,
    open_live: Callable[[bool], Live],
    live_dir: Path,
    checkpoint_dir: Path,
    init_model_dir: str | Path,
    keep: Callable[[int, BestCheckpoint], None] | None = None,
    rewards: Mapping[str, str] | None = None,
) -> BestCheckpoint:
    """The ``sft`` stage's loop: train, validate every ``eval_every`` steps and at the end (graded by ``rewards``'
    r1_zero entry; None: the built-in), keep the best.

    Every ``checkpoint_every`` steps a resumable checkpoint goes to ``checkpoint_dir``; a rerun continues from the
    newest one made from the same inputs (:func:`sft_fingerprint`), and ends as an uninterrupted run would. The
    checkpoints stay after a completed run: call :func:`reasonrl.checkpoints.remove_checkpoints` once the outputs are
    saved. ``keep(step, best)``: called every ``keep_every`` steps (``sft.keep_every``), to save the policy."""
    from tqdm import tqdm

    total = count_steps(len(pairs), config.batch_size, config.epochs, config.max_steps)
    optimizer, schedule = make_optimizer(policy, config, total)
    best = BestCheckpoint()
    device = next(policy.parameters()).device.type
    fingerprint = sft_fingerprint(
        config, eval_config, engine.config, init_model_dir, pairs, val, device, rewards=rewards
    )

    def load(path: Path) -> SFTState:
        return load_sft_checkpoint(path, policy, optimizer, schedule, best, live_dir)

    state = resume_from(checkpoint_dir, fingerprint, "SFT", load, SFTState())
    engine.sleep()  # training comes first; validate() wakes the engine for each evaluation
    steps = sft_steps(
        policy, tokenizer, optimizer, schedule, pairs, config, config.epochs, config.max_steps, start=state.step
    )
    progress = tqdm(steps, total=total, initial=state.step, desc="sft", unit="step")
    with open_live(state.step > 0) as live:
        for step, metrics in enumerate(progress, start=state.step + 1):
            live.step = step
            for name, value in metrics.items():
                live.log_metric(name, value)
            if step % config.eval_every == 0 or step == total:
                # One seed for every evaluation: a resumed run's draws are the uninterrupted run's.
                val_metrics = validate(
                    engine,
                    policy,
                    val,
                    eval_config,
                    config.eval_examples,
                    config.prompt,
                    seed=config.seed,
                    rewards=rewards,
                ).metrics
                log_validation(live, val_metrics)
                best.offer(policy, val_metrics["accuracy"], step, interval=val_metrics["accuracy_interval"])
            live.next_step()
            state.step = step
            state.best_accuracy, state.best_step, state.best_interval = best.accuracy, best.step, best.interval
            if keep is not None and config.keep_every and step % config.keep_every == 0:
                keep(step, best)
            if config.checkpoint_every and step % config.checkpoint_every == 0 and step < total:
                save_sft_checkpoint(checkpoint_dir, policy, optimizer, schedule, state, best, live_dir, fingerprint)
    return best

"""Supervised fine-tuning: the inner loop that SFT (handout Algorithm 1) and expert iteration share.

One optimizer step = ``batch_size`` sequences in microbatches (``microbatch_size`` sequences, or filled up to
``microbatch_tokens``: see ``reasonrl.batching``), each through ``sft_microbatch_train_step``; then gradient
clipping, AdamW at the step's learning rate (``reasonrl.training.optimizer``). A step's loss is the per-token
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

from reasonrl.batching import chunks, sequence_lengths, split_microbatches, trained_tokens, trim_to_rows
from reasonrl.code_deps import STAGES
from reasonrl.cost import CostLedger
from reasonrl.data import examples_digest
from reasonrl.logprobs import get_response_log_probs
from reasonrl.losses import sft_microbatch_train_step
from reasonrl.models import compute_precision
from reasonrl.tokenization import tokenize_prompt_and_output
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.cadence import is_checkpoint_step, is_eval_step, is_keep_step
from reasonrl.training.checkpoints import RunCheckpoints, fingerprint
from reasonrl.training.optimizer import LearningRateSchedule, make_optimizer, set_learning_rate
from reasonrl.training.validation import log_validation, timed_validation

if TYPE_CHECKING:
    from dvclive import Live
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reasonrl.config import EvalConfig, SFTConfig, SFTOptimization
    from reasonrl.data import GSM8KExample
    from reasonrl.rollouts.engine import RolloutEngine


@dataclass(frozen=True)
class Pair:
    """A prompt and the response the model should learn to give."""

    prompt: str
    response: str


def sft_schedule(config: SFTOptimization, total_steps: int) -> LearningRateSchedule:
    """The learning rate of each of ``total_steps`` optimizer steps: a linear warm-up over ``warmup_ratio`` of them,
    then ``lr_schedule`` over the rest."""
    warmup = round(config.warmup_ratio * total_steps)
    return LearningRateSchedule(config.optimizer.learning_rate, config.optimizer.lr_schedule, total_steps, warmup)


def count_steps(num_pairs: int, batch_size: int, epochs: int, max_steps: int | None = None) -> int:
    steps = epochs * math.ceil(num_pairs / batch_size)
    return steps if max_steps is None else min(steps, max_steps)


def sft_steps(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    schedule: LearningRateSchedule,
    pairs: list[Pair],
    config: SFTOptimization,
    epochs: int,
    max_steps: int | None = None,
    start: int = 0,
    ledger: CostLedger | None = None,
) -> Iterator[dict[str, float]]:
    """Train on ``pairs`` (shuffled each epoch with ``config.seed``), each optimizer step at the rate ``schedule``
    gives it; yield metrics after every optimizer step. A resumed run passes the ``start`` steps it has taken: their
    batches are drawn (the order is a function of the seed alone) but not trained on again. Each step's seconds and
    trained tokens go to ``ledger``'s ``train`` phase."""
    if not pairs:
        raise ValueError("no training pairs: an SFT run needs at least one")
    order_rng = random.Random(config.seed)
    total = count_steps(len(pairs), config.batching.batch_size, epochs, max_steps)
    step = 0
    for _ in range(epochs):
        order = list(range(len(pairs)))
        order_rng.shuffle(order)
        for indices in chunks(order, config.batching.batch_size):
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
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.optimizer.max_grad_norm).item()
            learning_rate = schedule.rate(step)
            set_learning_rate(optimizer, learning_rate)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            seconds = time.perf_counter() - started
            if ledger is not None:
                ledger.add_seconds("train", seconds)
                ledger.add_tokens("train", "trained", trained_tokens(tensors["response_mask"]))
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
    for part in split_microbatches(rows, lengths, config.batching.microbatch_size, config.batching.microbatch_tokens):
        tensors = {name: tensor.to(device) for name, tensor in trim_to_rows(batch, part).items()}
        mask = tensors["response_mask"]  # [b, T]
        with compute_precision(device, config.precision):
            scores = get_response_log_probs(policy, tensors["input_ids"], tensors["labels"], return_token_entropy=True)
        loss, _ = sft_microbatch_train_step(scores["log_probs"], mask, 1, normalize_constant=batch_tokens / len(part))
        loss_sum += loss.item()
        entropy_sum += (scores["token_entropy"] * mask).sum().item() / batch_tokens
        tokens += tensors["input_ids"].numel()
    return {"train/loss": loss_sum, "train/entropy": entropy_sum, "tokens": tokens}


SFT_STAGE = STAGES / "sft.py"


@dataclass
class SFTState:
    """What a resumed SFT run needs besides the weights and the optimizer to continue exactly (the learning rate is a
    function of ``step``)."""

    step: int = 0
    best_accuracy: float = -1.0
    best_step: int | None = None
    best_interval: dict[str, Any] | None = None


def pairs_digest(pairs: list[Pair]) -> str:
    """SHA-256 of the training pairs, in order."""
    records = [dataclasses.asdict(pair) for pair in pairs]
    return hashlib.sha256(json.dumps(records, ensure_ascii=False).encode()).hexdigest()


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
    ledger: CostLedger | None = None,
) -> BestCheckpoint:
    """The ``sft`` stage's loop: train, validate every ``eval_every`` steps and at the end (graded by ``rewards``'
    r1_zero entry; None: the built-in), keep the best.

    Every ``checkpoint_every`` steps a resumable checkpoint goes to ``checkpoint_dir``; a rerun continues from the
    newest one made from the same inputs (:func:`reasonrl.training.checkpoints.fingerprint`), and ends as an
    uninterrupted run would. The checkpoints stay after a completed run: call
    :func:`reasonrl.training.checkpoints.remove_checkpoints` once the outputs are saved. ``keep(step, best)``: called
    every ``keep_every`` steps (``sft.keep_every``), to save the policy. ``ledger``: what the run cost (its ``train``
    and ``validation`` phases, :mod:`reasonrl.cost`)."""
    from tqdm import tqdm

    ledger = CostLedger() if ledger is None else ledger  # a caller that keeps no account of the cost
    total = count_steps(len(pairs), config.batching.batch_size, config.epochs, config.max_steps)
    optimizer, schedule = make_optimizer(policy, config.optimizer), sft_schedule(config, total)
    best = BestCheckpoint()
    device = next(policy.parameters()).device.type
    data = {"pairs": pairs_digest(pairs), "val": examples_digest(val)}
    inputs = fingerprint("sft", config, eval_config, engine.config, init_model_dir, data, SFT_STAGE, device, rewards)
    checkpoints = RunCheckpoints(checkpoint_dir, inputs, "SFT", SFTState, policy, optimizer, best, live_dir)
    state = checkpoints.resume()
    engine.sleep()  # training comes first; validate() wakes the engine for each evaluation
    steps = sft_steps(
        policy, tokenizer, optimizer, schedule, pairs, config, config.epochs, config.max_steps, state.step, ledger
    )
    progress = tqdm(steps, total=total, initial=state.step, desc="sft", unit="step")
    with open_live(state.step > 0) as live:
        for step, metrics in enumerate(progress, start=state.step + 1):
            live.step = step
            for name, value in metrics.items():
                live.log_metric(name, value)
            if is_eval_step(step, config.cadence.eval_every, total):
                # One seed for every evaluation: a resumed run's draws are the uninterrupted run's.
                val_metrics = timed_validation(
                    ledger,
                    engine,
                    policy,
                    val,
                    eval_config,
                    config.cadence.eval_examples,
                    config.prompt,
                    seed=config.seed,
                    rewards=rewards,
                ).metrics
                log_validation(live, val_metrics)
                best.offer(policy, val_metrics["accuracy"], step, interval=val_metrics["accuracy_interval"])
            live.next_step()
            state.step = step
            if keep is not None and is_keep_step(step, config.cadence.keep_every):
                keep(step, best)
            if is_checkpoint_step(step, config.cadence.checkpoint_every, total):
                checkpoints.save(state)
    return best

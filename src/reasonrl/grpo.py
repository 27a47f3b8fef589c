"""GRPO with a verifiable reward (CS336 a5 Algorithm 3), on- or off-policy, resumable.

One step, as ``run_grpo`` reads top to bottom: 1. rollouts: ``group_size`` answers to each of ``rollout_batch_size /
group_size`` questions, sampled by the rollout engine loaded with the policy (lag 0: this step's; ``max_staleness``
k ≥ 1: that of k steps before, in the engine's own process), each graded once as it is drawn → 2. scores:
group-relative advantages of those grades (``advantage_estimator``, with any ``overlong_penalty``), training tensors →
3. fixed log-probs, once, without gradient: π_old (off-policy losses; with one optimizer step per rollout batch the
update's own forward gives it, :func:`old_log_probs_source`), π_ref (the KL penalty), the importance weights
(``rollout_is_cap``) → 4. update: ``epochs_per_rollout_batch`` passes over the batch in optimizer steps of
``train_batch_size`` responses → 5. the new weights to the engine (every ``ref_update_every`` steps to the KL
reference too) → 6. checkpoint, keep. The loop's phases read the run's config; the pieces they call take the few
values they use.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from tqdm import tqdm

from reasonrl.batching import chunks, sequence_lengths, split_microbatches, trained_tokens, trim_to_rows
from reasonrl.code_deps import STAGES
from reasonrl.cost import CostLedger, Tokens, summed_over_ranks
from reasonrl.data import examples_digest
from reasonrl.distributed import (
    SINGLE,
    Mean,
    NullLive,
    Ranks,
    as_scorer,
    full_tensor,
    gradient_sync,
    inference_context,
    wrap_for_training,
)
from reasonrl.errors import UserError
from reasonrl.lora import adapters_disabled
from reasonrl.loss_registry import LOSS_TYPES
from reasonrl.losses import (
    group_normalized_advantages,
    grpo_microbatch_train_step,
    leave_one_out_advantages,
    masked_mean,
    overlong_penalties,
    rollout_importance_weights,
)
from reasonrl.models import compute_precision
from reasonrl.rollouts.drawing import draw_rollouts, step_seed
from reasonrl.rollouts.sources import in_flight_versions, open_rollouts
from reasonrl.rollouts.types import StepRollouts, samples_tokens
from reasonrl.tokenization import batch_from_token_ids
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.cadence import is_checkpoint_step, is_eval_step, is_keep_step
from reasonrl.training.checkpoints import (
    STATE_FILE,
    TENSORS_FILE,
    CheckpointError,
    RunCheckpoints,
    fingerprint,
)
from reasonrl.training.optimizer import LearningRateSchedule, make_optimizer, scaled_learning_rate, set_learning_rate
from reasonrl.training.timers import PhaseTimer
from reasonrl.training.validation import log_validation, validate

if TYPE_CHECKING:
    from dvclive import Live
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reasonrl.config import (
        DistributedConfig,
        EvalConfig,
        GRPOAsynchrony,
        GRPOConfig,
        GRPOLoss,
        GRPOSampling,
        Precision,
    )
    from reasonrl.data import GSM8KExample
    from reasonrl.rollouts.engine import RolloutEngine
    from reasonrl.rollouts.process import RolloutProcess
    from reasonrl.rollouts.sources import RolloutSource
    from reasonrl.rollouts.types import DrawnRollouts, Sample, Scores

EXAMPLES_PER_EVAL = 4


class NonFiniteError(UserError, RuntimeError):
    """Training produced NaN/Inf too many optimizer steps in a row; the message names the step and quantity."""


class NonFiniteGuard:
    """Skips optimizer steps whose advantages, loss or gradients are not finite; stops after too many in a row."""

    def __init__(self, limit: int, skipped: int = 0, consecutive: int = 0) -> None:
        self.limit, self.skipped, self.consecutive = limit, skipped, consecutive

    def allows(self, step: int, quantities: dict[str, torch.Tensor | float]) -> bool:
        bad = [name for name, value in quantities.items() if not torch.isfinite(torch.as_tensor(value)).all()]
        if not bad:
            self.consecutive = 0
            return True
        self.consecutive += 1
        self.skipped += 1
        if self.consecutive > self.limit:
            raise NonFiniteError(
                f"GRPO step {step}: {bad[0]} is NaN or Inf in {self.consecutive} optimizer steps in a row "
                f"(grpo.max_consecutive_nonfinite={self.limit}); lower grpo.learning_rate or check the data"
            )
        tqdm.write(f"GRPO step {step}: non-finite {', '.join(bad)}; optimizer step skipped")
        return False


# ---------------------------------------------------------------------------------------------------------- rollouts
@dataclass
class RolloutBatch:
    """``N = rollout_batch_size`` scored responses, as training tensors."""

    prompts: list[str]
    responses: list[str]
    ground_truths: list[str]
    input_ids: torch.Tensor  # [N, L]
    labels: torch.Tensor  # [N, L]
    response_mask: torch.Tensor  # [N, L] bool
    engine_log_probs: torch.Tensor | None  # [N, L], the sampled tokens' log-probs under the engine
    raw_rewards: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    response_lengths: list[int]
    """Generated tokens per response, a final EOS not counted (``response_mask`` does count it: it is trained on)."""
    sequence_lengths: list[int]
    """Training tokens per row (prompt and response, up to the last response label): what a microbatch pads to."""
    truncated: torch.Tensor  # [N] bool
    """Responses cut at ``max_tokens`` (neither EOS nor a stop string ended them)."""


def sample_overlong_penalties(samples: list[Sample], sampling: GRPOSampling) -> list[float]:
    """``grpo.overlong_penalty`` of each of ``samples`` (:func:`reasonrl.losses.overlong_penalties`), by its
    generated tokens, a final EOS counted (what ``max_tokens`` bounds)."""
    penalty = sampling.overlong_penalty
    lengths = [len(sample.token_ids) for sample in samples]
    return overlong_penalties(lengths, sampling.max_tokens, penalty.buffer, penalty.max_penalty)


def group_advantages(rewards: list[float], group_size: int, loss: GRPOLoss) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages [N], raw_rewards [N])`` of ``rewards`` in groups of ``group_size`` by ``grpo.advantage_estimator``:
    :func:`reasonrl.losses.group_normalized_advantages` or :func:`reasonrl.losses.leave_one_out_advantages`."""
    if loss.advantage_estimator == "rloo":
        return leave_one_out_advantages(rewards, group_size)
    return group_normalized_advantages(rewards, group_size, loss.advantage_eps, loss.use_std_normalization)


def score_rollouts(
    tokenizer: PreTrainedTokenizerBase, drawn: DrawnRollouts, group_size: int, loss: GRPOLoss, sampling: GRPOSampling
) -> RolloutBatch:
    """The advantages (:func:`group_advantages`) of the samples' grades (given as they were drawn), with
    ``grpo.overlong_penalty`` added when set (the advantages and ``raw_rewards`` see it; the grades, which the rollout
    metrics and dynamic sampling read, do not); training tensors from the exact sampled token ids, with the engine's
    log-probs of them when it returned them."""
    samples = drawn.samples
    rewards = [score["reward"] for score in drawn.scores]
    if sampling.overlong_penalty is not None:
        penalties = sample_overlong_penalties(samples, sampling)
        rewards = [reward + penalty for reward, penalty in zip(rewards, penalties, strict=True)]
    advantages, raw_rewards = group_advantages(rewards, group_size, loss)
    # The ids the engine conditioned on, not a re-tokenization (which could drop or add a BOS token).
    prompt_ids = [sample.prompt_token_ids for sample in samples]
    tensors = batch_from_token_ids(prompt_ids, [sample.token_ids for sample in samples], tokenizer.pad_token_id)
    engine_log_probs = None
    if all(sample.logprobs is not None for sample in samples):
        engine_log_probs = torch.zeros(tensors["labels"].shape)  # [N, L]
        for row, (ids, sample) in enumerate(zip(prompt_ids, samples, strict=True)):
            start = len(ids) - 1  # labels are shifted by one: response token t sits at label index len(prompt)-1+t
            engine_log_probs[row, start : start + len(sample.logprobs)] = torch.tensor(sample.logprobs)
    return RolloutBatch(
        prompts=[prompt for prompt in drawn.prompts for _ in range(group_size)],
        responses=[sample.text for sample in samples],
        ground_truths=[example.answer for example in drawn.questions for _ in range(group_size)],
        **tensors,
        engine_log_probs=engine_log_probs,
        raw_rewards=raw_rewards,
        advantages=advantages,
        response_lengths=[sample.length for sample in samples],
        sequence_lengths=sequence_lengths(tensors["response_mask"]),
        truncated=torch.tensor([sample.finish == "length" for sample in samples]),
    )


def summarize_rollouts(
    step_rollouts: StepRollouts, group_size: int, sampling: GRPOSampling, ranks: Ranks = SINGLE
) -> dict[str, float]:
    """What a step logs of its rollouts with each of its optimizer steps: :func:`rollout_metrics` over every rank's
    samples (with ``grpo.overlong_penalty`` the mean penalty of the same samples, ``rollout/overlong_penalty``), this
    rank's sampling rounds (and dropped groups, with dynamic sampling) and the policy lag."""
    drawn, dynamic_sampling = step_rollouts.drawn, sampling.dynamic_sampling
    metrics = rollout_metrics(drawn, group_size, dynamic_sampling)
    if sampling.overlong_penalty is not None:
        metrics["rollout/overlong_penalty"] = Mean.of(sample_overlong_penalties(drawn.sampled_samples, sampling))
    summary = ranks.mean_metrics(metrics)
    summary["rollout/sampling_rounds"] = drawn.sampling_rounds
    summary["rollout/policy_lag"] = step_rollouts.policy_lag
    if dynamic_sampling:
        summary["rollout/dropped_groups"] = drawn.dropped_groups
    return summary


def rollout_metrics(drawn: DrawnRollouts, group_size: int, dynamic_sampling: bool) -> dict[str, Mean]:
    """What a step logs of its rollouts: every group it sampled under ``rollout/`` (with dynamic sampling the dropped
    ones and every round too, so the figures are those a run without it logs), and with dynamic sampling the groups
    kept to train on, apart, under ``rollout/kept_``. Sums and counts: :meth:`Ranks.mean_metrics` divides them."""
    metrics = sample_metrics(drawn.sampled_samples, drawn.sampled_scores, group_size, "rollout/")
    if dynamic_sampling:
        metrics |= sample_metrics(drawn.samples, drawn.scores, group_size, "rollout/kept_")
    return metrics


def sample_metrics(samples: list[Sample], scores: list[Scores], group_size: int, prefix: str) -> dict[str, Mean]:
    """Rewards (the samples' grades), the fraction of groups without reward variance, response lengths in tokens
    (all, correct, incorrect) and the truncated fraction of ``group_size`` samples per question, group after
    group."""
    rewards = [score["reward"] for score in scores]
    correct = [sample.length for sample, reward in zip(samples, rewards, strict=True) if reward == 1.0]
    incorrect = [sample.length for sample, reward in zip(samples, rewards, strict=True) if reward != 1.0]
    metrics = {
        "reward": Mean.of(rewards),
        "format_reward": Mean.of(score["format_reward"] for score in scores),
        "answer_reward": Mean.of(score["answer_reward"] for score in scores),
        "zero_variance_group_fraction": Mean.of(
            float(len(set(rewards[start : start + group_size])) == 1) for start in range(0, len(rewards), group_size)
        ),
        "response_length": Mean.of(sample.length for sample in samples),
        "response_length_correct": Mean.of(correct),
        "response_length_incorrect": Mean.of(incorrect),
        "truncated_fraction": Mean.of(float(sample.finish == "length") for sample in samples),
    }
    return {prefix + name: value for name, value in metrics.items()}


# ---------------------------------------------------------------------------------------------------- rollout sources
def grpo_rollouts(
    engine: RolloutEngine | RolloutProcess,
    policy: PreTrainedModel,
    train: list[GSM8KExample],
    val: list[GSM8KExample],
    config: GRPOConfig,
    eval_config: EvalConfig,
    ranks: Ranks = SINGLE,
    rewards: Mapping[str, str] | None = None,
) -> RolloutSource:
    """The loop's source of rollouts (:func:`reasonrl.rollouts.sources.open_rollouts`) drawing from ``engine``: each
    step's draw (:func:`reasonrl.rollouts.drawing.draw_rollouts` on ``train``) and each validation (on ``val``), with
    the run's arguments, whichever process the engine runs in."""
    cadence = config.cadence
    draw = functools.partial(
        draw_rollouts, train=train, config=config, stop=eval_config.stop, ranks=ranks, rewards=rewards
    )
    check = functools.partial(
        validate, val=val, eval_config=eval_config, num_examples=cadence.eval_examples, prompt_name=config.prompt,
        seed=config.seed, ranks=ranks, rewards=rewards,
    )  # fmt: skip
    return open_rollouts(
        engine, policy, draw, check, seed=config.seed, max_staleness=config.asynchrony.max_staleness,
        n_steps=config.n_grpo_steps,
        validates=functools.partial(is_eval_step, eval_every=cadence.eval_every, total_steps=config.n_grpo_steps),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class Forwards:
    """How the trainer scores responses: the log-probs (and entropy) of the distribution they were sampled from,
    ``softmax(logits / temperature)``, computed in ``precision``; ``microbatch_size`` rows a forward, or with
    ``microbatch_tokens`` the rows sorted by length, rows × longest ≤ it (:func:`reasonrl.batching.split_microbatches`).
    """

    temperature: float
    precision: Precision
    microbatch_size: int
    microbatch_tokens: int | None = None

    @classmethod
    def training(cls, config: GRPOConfig) -> Forwards:
        """The update's forwards and backwards, in microbatches of ``grpo.microbatch_tokens``."""
        batching = config.batching
        return cls(config.sampling.temperature, config.precision, batching.microbatch_size, batching.microbatch_tokens)

    @classmethod
    def fixed(cls, config: GRPOConfig) -> Forwards:
        """The fixed log-probs' forwards, without gradient, in microbatches of ``grpo.old_log_probs_microbatch_tokens``
        (no activations are kept, so they can be large)."""
        batching = config.batching
        tokens = batching.old_log_probs_microbatch_tokens
        return cls(config.sampling.temperature, config.precision, batching.microbatch_size, tokens)

    def microbatches(self, rows: list[int], lengths: list[int], ranks: Ranks = SINGLE) -> list[list[int]]:
        """``rows`` (of sequence ``lengths``, by row) in microbatches, as many on every rank (:func:`equal_counts`)."""
        return equal_counts(split_microbatches(rows, lengths, self.microbatch_size, self.microbatch_tokens), ranks)


def equal_counts(parts: list[list[int]], ranks: Ranks) -> list[list[int]]:
    """``parts`` padded with empty microbatches to the most any rank has: FSDP2 gathers parameters in every forward,
    a collective every rank must join. An empty microbatch runs a forward on row 0 and counts for nothing."""
    return parts + [[]] * (ranks.max(len(parts)) - len(parts))


def policy_log_probs(
    policy: PreTrainedModel,
    batch: RolloutBatch,
    rows: list[int],
    precision: Precision,
    with_entropy: bool = False,
    temperature: float = 1.0,
    entropy_grad: bool = False,
) -> dict[str, torch.Tensor]:
    """Log-probs of the sampled responses of ``rows``, computed on the rows' longest sequence, returned ``[b, L]``,
    under ``softmax(logits / temperature)``: pass the temperature the responses were sampled at. ``entropy_grad``:
    the entropy is differentiable (an entropy bonus).
    ``policy``: the HF model, or the scorer the loop trains through (``reasonrl.distributed.wrap_for_training``)."""
    device = next(policy.parameters()).device
    tensors = {"input_ids": batch.input_ids, "labels": batch.labels, "response_mask": batch.response_mask}
    trimmed = trim_to_rows(tensors, rows)  # [b, T]
    with compute_precision(device, precision):
        result = as_scorer(policy)(
            trimmed["input_ids"].to(device),
            trimmed["labels"].to(device),
            return_token_entropy=with_entropy,
            temperature=temperature,
            entropy_grad=entropy_grad,
        )
    width = trimmed["labels"].shape[1]
    return {name: torch.nn.functional.pad(t, (0, batch.labels.shape[1] - width)) for name, t in result.items()}


def compute_old_log_probs(
    policy: PreTrainedModel, batch: RolloutBatch, forwards: Forwards, ranks: Ranks = SINGLE
) -> torch.Tensor:
    """Log-probs of every sampled token under ``policy`` (π_old, or the frozen reference π_ref), ``[N, L]``, once per
    rollout batch and never differentiated, in ``forwards``' microbatches."""
    rows = list(range(len(batch.responses)))
    parts = forwards.microbatches(rows, batch.sequence_lengths, ranks)
    old_log_probs = torch.zeros(batch.labels.shape)  # [N, L]
    for part in parts:
        with inference_context(policy):
            scored = policy_log_probs(policy, batch, part or [0], forwards.precision, temperature=forwards.temperature)
            scored = scored["log_probs"].float().cpu()
        if part:
            old_log_probs[part] = scored
    return old_log_probs


@dataclass(frozen=True)
class KLReference:
    """π_ref, the reference of the KL penalty: the init model, frozen. Without LoRA a copy of the policy as loaded, in
    the same dtype and computed in the same precision, so the penalty is exactly 0 before the first update (a bf16
    reference beside an fp32 ``mixed`` policy differs by up to 0.28 nat per token at step 0); with LoRA the policy
    itself, its adapters off, at no extra memory. With ``grpo.ref_update_every`` N > 0 the copy takes the policy's
    weights after every N-th GRPO step (:meth:`refresh`)."""

    frozen: PreTrainedModel | None
    """The frozen copy; None with LoRA."""
    update_every: int = 0
    """``grpo.ref_update_every``: GRPO steps between refreshes; 0 = never (the init model throughout)."""

    @classmethod
    def of(cls, policy: PreTrainedModel, loss: GRPOLoss, lora_rank: int) -> KLReference | None:
        """``policy``'s reference, taken as it is loaded (before it is wrapped for training or resumed), refreshed
        every ``loss.ref_update_every`` steps; None when ``loss.kl_coef`` is 0 (no penalty)."""
        if loss.kl_coef == 0:
            return None
        frozen = None if lora_rank > 0 else copy.deepcopy(policy).eval().requires_grad_(False)
        return cls(frozen, loss.ref_update_every)

    def refresh(self, policy: PreTrainedModel, steps_done: int) -> None:
        """After ``steps_done`` GRPO steps, when they are a multiple of ``update_every``: the frozen copy takes
        ``policy``'s current weights, tensor by tensor in place (no second copy of the model in memory). Under
        FSDP2 each is gathered whole, a collective every rank joins, so every rank's copy is the whole policy."""
        if not self.update_every or steps_done % self.update_every:
            return
        copies = self.frozen.state_dict()  # shares storage with the frozen copy's weights
        with torch.no_grad():
            for name, tensor in policy.state_dict().items():
                copies[name].copy_(full_tensor(tensor))

    def load_weights(self, path: Path, saved: dict[str, torch.Tensor]) -> None:
        """The frozen copy's weights as checkpoint ``path`` saved them (``saved``), once checked to be its own (every
        name, every shape): otherwise :class:`CheckpointError`, and the copy is left as it was."""
        own = self.frozen.state_dict()
        shapes = {name: tuple(tensor.shape) for name, tensor in own.items()}
        if {name: tuple(tensor.shape) for name, tensor in saved.items()} != shapes:
            raise CheckpointError(f"{path / TENSORS_FILE}: its KL reference is not of this policy's names and shapes")
        with torch.no_grad():
            for name, tensor in saved.items():
                own[name].copy_(tensor)

    def log_probs(
        self, trainer: torch.nn.Module, batch: RolloutBatch, forwards: Forwards, ranks: Ranks = SINGLE
    ) -> torch.Tensor:
        """π_ref's log-probs of the batch (:func:`compute_old_log_probs`); with LoRA through ``trainer``, the scorer
        the loop trains the policy through, its adapters off."""
        if self.frozen is not None:
            return compute_old_log_probs(self.frozen, batch, forwards)  # this rank's own copy: no collective to join
        with adapters_disabled(trainer):
            return compute_old_log_probs(trainer, batch, forwards, ranks)


OldLogProbsSource = Literal["engine", "training_forward", "separate_pass"]


def old_log_probs_source(config: GRPOConfig) -> OldLogProbsSource | None:
    """Where a step's π_old comes from; None where nothing reads it (neither the loss, which has no importance ratio,
    nor ``rollout_is_cap``).

    - ``engine``: the engine's log-probs of its samples (``old_log_probs_from: engine``).
    - ``training_forward``: each row's log-probs in the update's own forward, detached, when the rollout batch gets
      exactly one optimizer step (``epochs_per_rollout_batch`` 1 and ``train_batch_size`` = ``rollout_batch_size``):
      the policy has not moved when that forward runs, so they are π_old (TRL's ``per_token_logps.detach()``). The
      ratio π/π_old is then exactly 1 in value and its gradient that of log π: ∇(ρ·A) = ρ·A·∇log π = A·∇log π.
    - ``separate_pass``: a forward without gradient over the whole batch before the update
      (:func:`compute_old_log_probs`), which the optimizer steps after the first need: by then the policy has moved.
    """
    asynchrony = config.asynchrony
    if not LOSS_TYPES[config.loss.loss_type].needs_old_log_probs and asynchrony.rollout_is_cap is None:
        return None
    if asynchrony.old_log_probs_from == "engine":
        return "engine"
    return "training_forward" if config.batching.optimizer_steps_per_grpo_step == 1 else "separate_pass"


def importance_weights(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, asynchrony: GRPOAsynchrony
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The importance weights of rows whose π_old is ``old`` and whose engine log-probs are ``engine`` (``[b, L]``
    each, response ``mask``), shaped by ``grpo.rollout_is_*`` (:func:`reasonrl.losses.rollout_importance_weights`),
    with their figures. Each row's weights are its own: computed on any subset of rows, they are the same."""
    return rollout_importance_weights(
        old, engine, mask, asynchrony.rollout_is_cap, asynchrony.rollout_is_level, asynchrony.rollout_is_mode,
        asynchrony.rollout_is_lower,
    )  # fmt: skip


def importance_figures(corrections: dict[str, torch.Tensor]) -> dict[str, float]:
    """The importance weights' figures as a step logs them, ``train/is_*``."""
    return {f"train/{name}": value.item() for name, value in corrections.items()}


@dataclass(frozen=True)
class FixedLogProbs:
    """What a step's optimizer steps hold fixed, computed once per rollout batch without gradient, ``[N, L]`` each
    (None where the loss does not use it): π_old, π_ref, and the importance weights min(π_old / μ, cap)."""

    old: torch.Tensor | None = None
    reference: torch.Tensor | None = None
    importance_weights: torch.Tensor | None = None
    from_training_forward: GRPOAsynchrony | None = None
    """Set when π_old is the training forward's own (``old_log_probs_source`` ``training_forward``): ``old`` and
    ``importance_weights`` are None, and each microbatch takes π_old from its forward, detached, and its importance
    weights from that π_old by these ``grpo.rollout_is_*`` (none without ``rollout_is_cap``)."""

    def rows(
        self, batch: RolloutBatch, part: list[int], log_probs: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """π_old and the importance weights of the rows ``part``, ``[b, L]`` on ``log_probs``' device, where
        ``log_probs`` are the rows' log-probs in the training forward."""
        device, asynchrony = log_probs.device, self.from_training_forward
        if asynchrony is None:
            old = None if self.old is None else self.old[part].to(device)
            weights = None if self.importance_weights is None else self.importance_weights[part].to(device)
            return old, weights
        old = log_probs.detach()
        if asynchrony.rollout_is_cap is None:
            return old, None
        engine, mask = batch.engine_log_probs[part].to(device), batch.response_mask[part].to(device)
        return old, importance_weights(old, engine, mask, asynchrony)[0]


def fixed_log_probs(
    trainer: torch.nn.Module,
    batch: RolloutBatch,
    reference: KLReference | None,
    config: GRPOConfig,
    ranks: Ranks = SINGLE,
) -> tuple[FixedLogProbs, dict[str, float]]:
    """π_old (for a loss with an importance ratio, or the importance weights), from where
    :func:`old_log_probs_source` says: the engine's log-probs, the training forward's (nothing to compute here) or a
    separate pass of the trainer's; π_ref (with a KL penalty) and, with ``rollout_is_cap`` and a π_old computed here,
    the importance weights and their figures (``train/is_*``; from the training forward they are the optimizer
    step's, :func:`accumulate_gradients`)."""
    asynchrony, forwards, source = config.asynchrony, Forwards.fixed(config), old_log_probs_source(config)
    if source == "training_forward":
        reference_log_probs = None if reference is None else reference.log_probs(trainer, batch, forwards, ranks)
        return FixedLogProbs(reference=reference_log_probs, from_training_forward=asynchrony), {}
    old = reference_log_probs = weights = None
    if source == "engine":
        old = batch.engine_log_probs
    elif source == "separate_pass":
        old = compute_old_log_probs(trainer, batch, forwards, ranks)
    if reference is not None:
        reference_log_probs = reference.log_probs(trainer, batch, forwards, ranks)
    figures = {}
    if asynchrony.rollout_is_cap is not None:  # the decoupled objective's weight min(π_old / μ, cap), or its kin
        weights, corrections = importance_weights(old, batch.engine_log_probs, batch.response_mask, asynchrony)
        figures = importance_figures(corrections)
    return FixedLogProbs(old, reference_log_probs, weights), figures


def runs_fixed_pass(config: GRPOConfig) -> bool:
    """Whether a step runs a forward before its update: π_old's separate pass, or π_ref's (a KL penalty)."""
    return old_log_probs_source(config) == "separate_pass" or config.loss.kl_coef > 0


def accumulate_gradients(
    policy: PreTrainedModel,
    batch: RolloutBatch,
    rows: list[int],
    fixed: FixedLogProbs,
    loss: GRPOLoss,
    forwards: Forwards,
    max_tokens: int,
    ranks: Ranks = SINGLE,
) -> dict[str, float]:
    """Backward through ``grpo_microbatch_train_step`` for each microbatch of ``rows`` (one optimizer step's worth);
    gradients are left in ``.grad``. Returns the step's loss, entropy, and (when they apply) clip fractions and KL.

    A microbatch of ``b`` of the step's ``n`` sequences passes ``gradient_accumulation_steps = n / b``: its mean
    per-sequence loss then counts with its share of the step's sequences, and the gradient is the handout's mean over
    the step's sequences whatever the split. Under ``token_mean`` each microbatch's summed loss is divided by the
    step's response tokens, counted over every microbatch and rank before the first backward: the gradient is the
    mean over the step's tokens whatever the split. With ``mask_truncated`` the truncated responses are left out of
    the step: under ``sequence_mean`` (``token_mean``) its mean runs over the others (their tokens); under
    ``constant_normalizer`` they count with zero loss, so the normaliser stays all rows × ``max_tokens``. Entropy,
    clip fractions and KL are means over the trained response tokens. Log-probs and entropy are those of the
    distribution the responses were sampled from (``forwards``).

    ``fixed.importance_weights`` (``grpo.rollout_is_cap``): each token's policy-gradient term times its weight. With
    π_old from the training forward (``fixed.from_training_forward``) the weights come from each microbatch's own
    forward, and the step's ``train/is_*`` figures are those of the rows it trained (every row of the rollout batch
    unless ``mask_truncated`` leaves some out), as :func:`fixed_log_probs` gives them of the whole batch.

    Over several ranks, ``rows`` are this rank's share of the step: each microbatch is weighted by the step's rows
    on all ranks, so the gradients DDP or FSDP2 average in the last microbatch's backward (the only one that syncs)
    are those of the whole step, and the metrics returned are the whole step's on every rank.
    """
    all_rows = ranks.sum(len(rows))
    if loss.mask_truncated:
        rows = [row for row in rows if not batch.truncated[row]]
    token_means = {"train/entropy": 0.0}
    token_means |= {f"train/{metric}": 0.0 for metric in LOSS_TYPES[loss.loss_type].token_metrics}
    if loss.kl_coef > 0:
        token_means["train/kl"] = 0.0
    step_rows = ranks.sum(len(rows))
    if not step_rows:
        tqdm.write("GRPO: every response of this optimizer step was truncated (grpo.mask_truncated); nothing to train")
        return {"train/loss": 0.0} | token_means
    # Dr. GRPO's per-sequence constant (max_tokens) is only constant if the step's sequences all count, truncated ones
    # with zero loss: dividing by the kept rows would scale the step up with the truncation rate.
    weighted_rows = all_rows if loss.loss_aggregation == "constant_normalizer" else step_rows
    step_tokens = ranks.sum(batch.response_mask[rows].sum().item())
    token_mean = loss.loss_aggregation == "token_mean"
    normalize_constant = step_tokens if token_mean else max_tokens
    total_loss = 0.0
    parts = forwards.microbatches(rows, batch.sequence_lengths, ranks)
    weighted_here = fixed.from_training_forward is not None and fixed.from_training_forward.rollout_is_cap is not None
    old_log_probs = torch.zeros(batch.labels.shape) if weighted_here else None  # [N, L]: the trained rows' π_old
    for index, part in enumerate(parts):
        with gradient_sync(policy, enabled=index == len(parts) - 1):
            if not part:
                scored = policy_log_probs(policy, batch, [0], forwards.precision, temperature=forwards.temperature)
                (scored["log_probs"].sum() * 0.0).backward()  # joins the ranks' collectives, adds nothing
                continue
            # DDP averages the ranks' gradients: token_mean's normaliser is already the whole step's, so undo it.
            accumulation = 1 / ranks.world_size if token_mean else weighted_rows / (ranks.world_size * len(part))
            step_loss, metadata, scored, mask = _microbatch_step(
                policy, batch, part, fixed, loss, forwards, accumulation, normalize_constant
            )
        share = mask.sum().item() / step_tokens  # of the step's trained response tokens
        total_loss += step_loss.item()
        metadata["entropy"] = masked_mean(scored["token_entropy"], mask)
        for name in token_means:
            token_means[name] += metadata[name.removeprefix("train/")].item() * share
        if old_log_probs is not None:
            old_log_probs[part] = scored["log_probs"].detach().float().cpu()
    metrics = {"train/loss": ranks.sum(total_loss) / ranks.world_size}
    metrics |= {name: ranks.sum(value) for name, value in token_means.items()}
    if old_log_probs is not None:
        trained = sorted(rows)  # in the batch's order: the figures' sums run as over the whole batch
        _, corrections = importance_weights(
            old_log_probs[trained], batch.engine_log_probs[trained], batch.response_mask[trained],
            fixed.from_training_forward,
        )  # fmt: skip
        metrics |= importance_figures(corrections)
    return metrics


def _microbatch_step(
    policy: PreTrainedModel,
    batch: RolloutBatch,
    part: list[int],
    fixed: FixedLogProbs,
    loss: GRPOLoss,
    forwards: Forwards,
    gradient_accumulation_steps: float,
    normalize_constant: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """Forward and backward of one microbatch (``grpo_microbatch_train_step``): loss, metadata, scores and mask. The
    entropy comes from the same forward, differentiable with an entropy bonus."""
    device = next(policy.parameters()).device
    scored = policy_log_probs(
        policy, batch, part, forwards.precision, with_entropy=True, temperature=forwards.temperature,
        entropy_grad=loss.entropy_coef > 0,
    )  # fmt: skip
    mask = batch.response_mask[part].to(device)  # [b, L]
    old_log_probs, weights = fixed.rows(batch, part, scored["log_probs"])
    step_loss, metadata = grpo_microbatch_train_step(
        scored["log_probs"],
        mask,
        gradient_accumulation_steps,
        loss.loss_type,
        raw_rewards=batch.raw_rewards[part].unsqueeze(-1).to(device),  # [b, 1]
        advantages=batch.advantages[part].unsqueeze(-1).to(device),  # [b, 1]
        old_log_probs=old_log_probs,
        cliprange=loss.cliprange,
        loss_aggregation=loss.loss_aggregation,
        normalize_constant=normalize_constant,
        cliprange_high=loss.cliprange_high,
        ref_log_probs=None if fixed.reference is None else fixed.reference[part].to(device),
        kl_coef=loss.kl_coef,
        kl_estimator=loss.kl_estimator,
        importance_weights=weights,
        dual_clip=loss.dual_clip,
        entropy_coef=loss.entropy_coef,
        token_entropy=scored["token_entropy"],
    )
    return step_loss, metadata, scored, mask


def optimizer_step(
    trainer: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float,
    guard: NonFiniteGuard,
    step: int,
    checks: dict[str, Any],
    ranks: Ranks = SINGLE,
    share: float = 1.0,
) -> dict[str, float]:
    """Clip ``trainer``'s accumulated gradients to ``max_grad_norm`` and apply them, unless something is NaN/Inf
    (then skip and count). Over several ranks each check is summed over them first, so a NaN on one rank skips the
    step on all of them together.

    ``share``: the step's rows over a full ``train_batch_size``, below 1 only when dynamic sampling ran out of rounds
    short of groups. The step's learning rate is scaled by it (the linear scaling rule, arXiv:1706.02677): a mean over
    fewer samples is a noisier estimate, and AdamW would otherwise move the weights as far as on a full step."""
    grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(trainer.parameters(), max_grad_norm))
    if ranks.distributed:
        checks = {
            name: ranks.sum(torch.as_tensor(value, dtype=torch.float64).sum().item()) for name, value in checks.items()
        }
    if guard.allows(step, {**checks, "gradient norm": grad_norm}):
        with scaled_learning_rate(optimizer, share):
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "train/grad_norm": grad_norm.item(),
        "train/skipped_steps": guard.skipped,
        "train/learning_rate": optimizer.param_groups[0]["lr"] * share,
    }


def scheduled_learning_rate(config: GRPOConfig, step: int, epoch: int, train_batch: int) -> float:
    """The learning rate of the optimizer step on train batch ``train_batch`` of pass ``epoch`` over GRPO step
    ``step``'s rollouts: ``grpo.lr_schedule`` at that batch's place in the planned sequence of
    ``total_optimizer_steps``. A pure function of the place, which a resumed run recomputes from its step alone; a
    rollout batch that dynamic sampling leaves short of train batches skips the places of the missing ones, so the
    schedule still ends with the run. :func:`optimizer_step` scales it by a short batch's share."""
    batching, optimizer = config.batching, config.optimizer
    per_epoch = batching.rollout_batch_size // batching.train_batch_size
    place = (step * batching.epochs_per_rollout_batch + epoch) * per_epoch + train_batch
    schedule = LearningRateSchedule(
        optimizer.learning_rate, optimizer.lr_schedule, config.total_optimizer_steps, config.warmup_steps
    )
    return schedule.rate(place)


def has_learning_signal(batch: RolloutBatch, rows: list[int], loss: GRPOLoss, ranks: Ranks = SINGLE) -> bool:
    """Whether an optimizer step on ``rows`` (on any rank) can have a gradient: a trained row with a non-zero loss
    weight (its advantage; its raw reward for ``no_baseline``), a KL penalty or an entropy bonus. A step without one
    is skipped: its gradient is zero, but AdamW's momentum would still move the weights."""
    if loss.kl_coef > 0 or loss.entropy_coef > 0:
        return True
    if loss.mask_truncated:
        rows = [row for row in rows if not batch.truncated[row]]
    weights = getattr(batch, LOSS_TYPES[loss.loss_type].weight)  # [N]: batch.raw_rewards or batch.advantages
    return ranks.sum((weights[rows] != 0).sum().item()) > 0  # NaN counts as a signal: the NaN guard reports it


def update_steps(
    trainer: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    guard: NonFiniteGuard,
    batch: RolloutBatch,
    fixed: FixedLogProbs,
    step: int,
    config: GRPOConfig,
    ledger: CostLedger,
    ranks: Ranks = SINGLE,
) -> Iterator[dict[str, float]]:
    """GRPO step ``step``'s update: ``epochs_per_rollout_batch`` passes over its rollout batch, each in an order
    shuffled by the step's seed, one optimizer step per ``train_batch_size`` rows. Yields each optimizer step's
    metrics once it is taken; ``{}`` for one skipped without learning signal (:func:`has_learning_signal`). The rows
    trained, over every rank, count in ``ledger``'s ``train`` tokens."""
    train_rows = config.batching.train_batch_size // ranks.world_size
    forwards, max_tokens = Forwards.training(config), config.sampling.max_tokens
    order_rng = random.Random(step_seed(config.seed, step))
    for epoch in range(config.batching.epochs_per_rollout_batch):
        order = ranks.rows_to_train(len(batch.responses))
        order_rng.shuffle(order)
        for train_batch, rows in enumerate(chunks(order, train_rows)):
            if not has_learning_signal(batch, rows, config.loss, ranks):
                yield {}
                continue
            metrics = accumulate_gradients(trainer, batch, rows, fixed, config.loss, forwards, max_tokens, ranks)
            ledger.add_tokens("train", "trained", summed_over_ranks(trained_tokens(batch.response_mask, rows), ranks))
            checks = {"advantages": batch.advantages[rows], "loss": metrics["train/loss"]}
            set_learning_rate(optimizer, scheduled_learning_rate(config, step, epoch, train_batch))
            share = len(rows) / train_rows
            yield metrics | optimizer_step(
                trainer, optimizer, config.optimizer.max_grad_norm, guard, step, checks, ranks, share
            )


# ---------------------------------------------------------------------------------------------------------- checkpoints
GRPO_STAGE = STAGES / "grpo.py"


@dataclass
class TrainingState:
    """Everything besides the weights that a resumed run needs to continue exactly."""

    step: int = 0
    optimizer_steps: int = 0
    elapsed_seconds: float = 0.0
    skipped_steps: int = 0
    consecutive_nonfinite: int = 0
    zero_signal_steps: int = 0
    best_accuracy: float = -1.0
    best_step: int | None = None
    best_interval: dict[str, Any] | None = None
    in_flight: list[StepRollouts] = dataclasses.field(default_factory=list)
    """``max_staleness`` ≥ 1: the rollouts drawn by older weights for the steps after ``step``."""
    to_request: list[int] = dataclasses.field(default_factory=list)
    """``max_staleness`` ≥ 1: the steps after ``step`` whose rollouts the weights of ``step`` draw, which the resumed
    run requests once it has loaded them (:meth:`reasonrl.rollouts.sources.LaggedRollouts.in_flight`)."""


def in_flight_digest(saved_state: Mapping[str, Any]) -> str:
    """The digest of a checkpoint's rollouts in flight (``in_flight`` and ``to_request`` of the training state, as
    ``dataclasses.asdict`` or ``state.json`` gives it), kept in its tensors file: an edit of ``state.json`` that
    changes them, a sample's text or token ids among them, does not match it."""
    content = {"in_flight": saved_state["in_flight"], "to_request": saved_state["to_request"]}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def parse_in_flight(path: Path, state: TrainingState, digest: str, config: GRPOConfig | None) -> list[StepRollouts]:
    """Checkpoint ``path``'s rollouts in flight, parsed, once checked against ``digest`` and against what a run of
    ``config`` (None: nothing in flight) holds after ``state.step`` steps
    (:func:`reasonrl.rollouts.sources.in_flight_versions`: the rollouts of older versions held, those of the
    checkpoint's own to request); anything else raises :class:`reasonrl.training.checkpoints.CheckpointError`."""
    file = path / STATE_FILE
    saved = {"in_flight": state.in_flight, "to_request": state.to_request}
    if in_flight_digest(saved) != digest:
        raise CheckpointError(f"{file}: its rollouts in flight do not match their digest in {TENSORS_FILE} (edited?)")
    try:
        in_flight = [StepRollouts.from_dict(rollouts) for rollouts in state.in_flight]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(
            f"{file}: its rollouts in flight cannot be read ({type(error).__name__}: {error})"
        ) from error
    versions = (
        {} if config is None else in_flight_versions(state.step, config.asynchrony.max_staleness, config.n_grpo_steps)
    )
    held = {rollouts.step: rollouts.version for rollouts in in_flight}
    expected = {later: version for later, version in versions.items() if version < state.step}
    to_request = [later for later, version in versions.items() if version == state.step]
    if held != expected or state.to_request != to_request:
        raise CheckpointError(
            f"{file}: its rollouts in flight are of steps {held} (step: policy version), to request "
            f"{state.to_request}; a run at step {state.step} holds {expected}, to request {to_request}"
        )
    return in_flight


@dataclass(frozen=True)
class InFlightRollouts:
    """GRPO's own part of its checkpoints: the rollouts in flight of the training state, with their digest
    (:func:`in_flight_digest`) among the tensors; read back and checked against what a run of ``config`` holds
    (:func:`parse_in_flight`; None: nothing in flight) before anything is restored."""

    config: GRPOConfig | None = None
    names: ClassVar[tuple[str, ...]] = ("in_flight_digest",)

    def tensors(self, state: TrainingState) -> dict[str, Any]:
        return {"in_flight_digest": in_flight_digest(asdict(state))}

    def restore(self, path: Path, state: TrainingState, saved: dict[str, Any]) -> None:
        state.in_flight = parse_in_flight(path, state, saved["in_flight_digest"], self.config)


@dataclass(frozen=True)
class RefreshedReference:
    """GRPO's KL reference in its checkpoints when it is refreshed (``grpo.ref_update_every``): then it is the policy
    of the last refresh, which neither the init model nor the checkpoint's policy is."""

    reference: KLReference
    names: ClassVar[tuple[str, ...]] = ("reference",)

    def tensors(self, state: TrainingState) -> dict[str, Any]:
        return {"reference": self.reference.frozen.state_dict()}

    def restore(self, path: Path, state: TrainingState, saved: dict[str, Any]) -> None:
        self.reference.load_weights(path, saved["reference"])


def grpo_checkpoints(
    directory: Path,
    run_fingerprint: str,
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    best: BestCheckpoint,
    live_dir: Path,
    ranks: Ranks = SINGLE,
    config: GRPOConfig | None = None,
    reference: KLReference | None = None,
) -> RunCheckpoints[TrainingState]:
    """A GRPO run's checkpoints in ``directory`` (:class:`reasonrl.training.checkpoints.RunCheckpoints`), with its
    rollouts in flight: resumed only by a run of ``config`` that holds those (None: nothing in flight); and with
    ``reference``'s weights when it is refreshed (``update_every`` > 0), restored after the rollouts are checked."""
    parts = directory, run_fingerprint, "GRPO", TrainingState, policy, optimizer, best, live_dir, ranks
    refreshed = (RefreshedReference(reference),) if reference is not None and reference.update_every else ()
    return RunCheckpoints(*parts, parts=(InFlightRollouts(config), *refreshed))


# ---------------------------------------------------------------------------------------------------------- the loop
STEP_PHASES = ("rollout", "weight_sync", "scoring", "old_log_prob", "train", "step", "engine")
"""The phases of a GRPO step, timed and logged (``time/<phase>_seconds``) in this order. ``rollout``: lag 0 with
waking the engine and loading the weights, lag ≥ 1 the wait for the step's rollouts; ``scoring``: the scores;
``old_log_prob``: the fixed log-probs' forwards, logged only for a step that runs one (:func:`runs_fixed_pass`:
π_old's separate pass or π_ref's), absent otherwise; ``train``: the update; ``step``: the whole step; ``engine``: the
engine's own time on the step's rollouts, when it ran beside the trainer."""


def step_progress(first: int, total: int, enabled: bool) -> tqdm:
    """The bar over GRPO steps ``first`` .. ``total - 1``, drawn as ``first``/``total`` at the start: after a resume
    tqdm's rate, and so its ETA, counts only the steps this run takes."""
    return tqdm(range(first, total), desc="grpo", unit="step", initial=first, total=total, disable=not enabled)


def evaluate_and_log(
    source: RolloutSource,
    step: int,
    policy: PreTrainedModel,
    best: BestCheckpoint,
    live: Live | NullLive,
    state: TrainingState,
    live_dir: Path,
    ledger: CostLedger,
    ranks: Ranks = SINGLE,
) -> None:
    """Validate the policy after ``step`` GRPO steps (``source.validate``, in ``ledger``'s ``validation`` phase), log
    it at the run's optimizer step, offer it as the best, and (rank 0) keep its first examples in
    ``live_dir/examples``."""
    with ledger.timed("validation"):
        result = source.validate(step)
    ledger.add_tokens("validation", "generated", result.tokens)
    metrics = result.metrics
    live.step = state.optimizer_steps
    log_validation(live, metrics)
    live.log_metric("time/elapsed_seconds", state.elapsed_seconds)
    live.log_metric("grpo_step", step)
    best.offer(policy, metrics["accuracy"], step, ranks.is_main, metrics["accuracy_interval"])
    if ranks.is_main:
        write_examples(live_dir, step, result.records)
    live.sync()


def write_examples(live_dir: Path, step: int, records: list[dict[str, Any]]) -> None:
    """The first ``EXAMPLES_PER_EVAL`` validation records after ``step`` steps, in ``live_dir/examples``, each with
    its question and gold answer (the report shows them beside the response)."""
    keys = ("prompt", "question", "ground_truth", "response", "reward")
    examples = [{"step": step} | {key: r[key] for key in keys} for r in records[:EXAMPLES_PER_EVAL]]
    examples_file = live_dir / "examples" / f"step_{step:06d}.json"
    examples_file.parent.mkdir(parents=True, exist_ok=True)
    examples_file.write_text(json.dumps(examples, indent=2, ensure_ascii=False), encoding="utf-8")


def log_step(
    live: Live | NullLive, timer: PhaseTimer, sync_seconds: float, engine_seconds: float | None, steps_done: int
) -> None:
    """A step's timings, with the trainer's last hand-off of weights to the engine, ``sync_seconds`` (lag 0: waking the
    engine and loading them; lag 1: streaming them to the engine's process, which takes them once it has finished the
    draw it is on; lag ≥ 2: packing them aside for it), and the engine's own time on the step's rollouts,
    ``engine_seconds`` (None: it ran in turn with the trainer); then the GRPO steps done."""
    timer.record("weight_sync", sync_seconds)
    if engine_seconds is not None:
        timer.record("engine", engine_seconds)
    for name, value in timer.metrics().items():
        live.log_metric(name, value)
    live.log_metric("grpo_step", steps_done)
    live.sync()


def account_step(ledger: CostLedger, timer: PhaseTimer, step_rollouts: StepRollouts, ranks: Ranks = SINGLE) -> None:
    """A step's timed phases (its whole, ``step``, is the run's wall clock) and the tokens its rollouts drew, over
    every rank: in the ``engine`` phase where the engine drew them beside the trainer, else in ``rollout``."""
    for phase, seconds in timer.seconds.items():
        if phase != "step" and seconds is not None:
            ledger.add_seconds(phase, seconds)
    # The ranks that share an engine draw the same samples: its first rank counts them.
    drawn = samples_tokens(step_rollouts.drawn.sampled_samples) if ranks.tensor_parallel_rank == 0 else Tokens()
    phase = "rollout" if step_rollouts.engine_seconds is None else "engine"
    ledger.add_tokens(phase, "generated", summed_over_ranks(drawn, ranks))


def run_grpo(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    engine: RolloutEngine | RolloutProcess,
    train: list[GSM8KExample],
    val: list[GSM8KExample],
    config: GRPOConfig,
    eval_config: EvalConfig,
    open_live: Callable[[bool], Live],
    live_dir: Path,
    checkpoint_dir: Path,
    init_model_dir: str | Path,
    distributed: DistributedConfig | None = None,
    ranks: Ranks = SINGLE,
    rewards: Mapping[str, str] | None = None,
    keep: Callable[[int, BestCheckpoint], None] | None = None,
    ledger: CostLedger | None = None,
) -> BestCheckpoint:
    """The GRPO loop, graded by ``rewards[config.prompt]`` (None: the prompt's built-in); resumes from the newest
    checkpoint in ``checkpoint_dir`` made from the same inputs (:func:`reasonrl.training.checkpoints.fingerprint`),
    which stays after the run (:func:`reasonrl.training.checkpoints.remove_checkpoints` once the outputs are saved).
    ``engine``: :func:`reasonrl.rollouts.process.start_engine`'s, this process's (lag 0) or its own process's, which
    the loop's source stops when the loop ends. Over several ``ranks`` (launched with ``distributed``) each rank trains
    on its share of each step's questions under ``distributed.strategy``; rank 0 logs, checkpoints and keeps the best.
    ``keep(step, best)``: called on every rank every ``grpo.keep_every`` steps, to save the policy. ``ledger``: what
    the run cost (:func:`account_step`, and the ``validation`` phase; :mod:`reasonrl.cost`)."""
    ledger = CostLedger() if ledger is None else ledger  # a caller that keeps no account of the cost
    reference = KLReference.of(policy, config.loss, config.lora.lora_rank)  # the init model, as loaded
    trainer = wrap_for_training(policy, "ddp" if distributed is None else distributed.strategy, ranks)
    optimizer = make_optimizer(policy, config.optimizer)  # after wrapping: FSDP2 shards the parameters
    best, device = BestCheckpoint(), next(policy.parameters()).device.type
    data = {"train": examples_digest(train), "val": examples_digest(val)}
    inputs = fingerprint(
        "grpo", config, eval_config, engine.config, init_model_dir, data, GRPO_STAGE, device, rewards, distributed
    )
    checkpoints = grpo_checkpoints(checkpoint_dir, inputs, policy, optimizer, best, live_dir, ranks, config, reference)
    state = checkpoints.resume()
    guard = NonFiniteGuard(config.max_consecutive_nonfinite, state.skipped_steps, state.consecutive_nonfinite)
    source = grpo_rollouts(engine, policy, train, val, config, eval_config, ranks, rewards)
    if ranks.is_main and old_log_probs_source(config) == "training_forward":
        tqdm.write(
            "GRPO: one optimizer step per rollout batch, so π_old is that step's own forward, detached: no "
            "old-log-prob pass" + ("" if runs_fixed_pass(config) else " (time/old_log_prob_seconds is not logged)")
        )
    with source, open_live(state.step > 0) if ranks.is_main else contextlib.nullcontext(NullLive()) as live:
        source.start(state.step, state.in_flight)
        progress = step_progress(state.step, config.n_grpo_steps, enabled=ranks.is_main)
        for step in progress:
            if is_eval_step(step, config.cadence.eval_every, config.n_grpo_steps):
                evaluate_and_log(source, step, policy, best, live, state, live_dir, ledger, ranks)
            timer = PhaseTimer(STEP_PHASES)
            # 1. Rollouts: groups of samples, graded, drawn by the engine loaded with the policy of step - lag.
            step_rollouts = source.batch(step)
            timer.lap("rollout")
            # 2. Scores: advantages, training tensors; the rollouts' summary over every rank's, logged with each update.
            drawn, loss, group_size = step_rollouts.drawn, config.loss, config.batching.group_size
            batch = score_rollouts(tokenizer, drawn, group_size, loss, config.sampling)
            rollout_summary = summarize_rollouts(step_rollouts, group_size, config.sampling, ranks)
            timer.lap("scoring")
            # 3. Fixed log-probs: π_old, π_ref and the importance weights, once per rollout batch, never differentiated.
            fixed, corrections = fixed_log_probs(trainer, batch, reference, config, ranks)
            rollout_summary |= corrections
            if runs_fixed_pass(config):  # else nothing ran: no time is logged for it (see STEP_PHASES)
                timer.lap("old_log_prob")
            # 4. Update: epochs × train batches, one optimizer step each, logged as it is taken.
            for metrics in update_steps(trainer, optimizer, guard, batch, fixed, step, config, ledger, ranks):
                state.zero_signal_steps += not metrics  # {}: skipped, without learning signal
                state.optimizer_steps += 1
                live.step = state.optimizer_steps
                metrics["train/zero_signal_steps"] = state.zero_signal_steps
                for name, value in (metrics | rollout_summary).items():
                    live.log_metric(name, value)
            timer.lap("train")
            # 5. Weights to the engine (lag 0: the next draw loads them; lag ≥ 1: to its process, the next draw asked).
            state.step, state.skipped_steps, state.consecutive_nonfinite = step + 1, guard.skipped, guard.consecutive
            if reference is not None:  # every grpo.ref_update_every steps: the KL reference becomes the policy
                reference.refresh(policy, state.step)
            source.advance(state.step)
            state.elapsed_seconds += timer.total("step")
            log_step(live, timer, source.sync_seconds, step_rollouts.engine_seconds, state.step)
            account_step(ledger, timer, step_rollouts, ranks)
            progress.set_postfix(reward=f"{rollout_summary['rollout/reward']:.3f}")
            # 6. Keep the policy, checkpoint the run.
            if keep is not None and is_keep_step(state.step, config.cadence.keep_every):
                keep(state.step, best)
            if is_checkpoint_step(state.step, config.cadence.checkpoint_every, config.n_grpo_steps):
                state.in_flight, state.to_request = source.in_flight(state.step)
                checkpoints.save(state)
        evaluate_and_log(source, state.step, policy, best, live, state, live_dir, ledger, ranks)
    return best

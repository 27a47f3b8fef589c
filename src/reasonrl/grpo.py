"""GRPO with a verifiable reward (CS336 a5 Algorithm 3), on- or off-policy, resumable.

One step: load the policy's weights into the rollout engine and sample ``group_size`` answers to each of
``rollout_batch_size / group_size`` questions (the engine sleeps again afterwards) → score them → group-normalised
advantages → (off-policy losses) old log-probs, once, without gradient → ``epochs_per_rollout_batch`` passes over
the batch in optimizer steps of ``train_batch_size`` responses. ``run_grpo`` reads top to bottom in that order.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from tqdm import tqdm

from reasonrl.batching import chunks, sequence_lengths, split_microbatches, trim_to_rows
from reasonrl.code_deps import STAGES
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
    compute_group_normalized_rewards,
    grpo_microbatch_train_step,
    masked_mean,
    rollout_importance_weights,
)
from reasonrl.models import compute_precision
from reasonrl.rewards import prompt_reward
from reasonrl.rollouts.drawing import draw_rollouts, step_seed, wants_engine_log_probs
from reasonrl.rollouts.sources import in_flight_versions, open_rollouts
from reasonrl.rollouts.types import StepRollouts
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

    from reasonrl.config import DistributedConfig, EvalConfig, GRPOConfig, Precision
    from reasonrl.data import GSM8KExample
    from reasonrl.rollouts.engine import RolloutEngine
    from reasonrl.rollouts.process import RolloutProcess
    from reasonrl.rollouts.sources import RolloutSource
    from reasonrl.rollouts.types import DrawnRollouts, Sample

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
    reward_metadata: dict[str, float]
    response_lengths: list[int]
    """Generated tokens per response, a final EOS not counted (``response_mask`` does count it: it is trained on)."""
    sequence_lengths: list[int]
    """Training tokens per row (prompt and response, up to the last response label): what a microbatch pads to."""
    truncated: torch.Tensor  # [N] bool
    """Responses cut at ``max_tokens`` (neither EOS nor a stop string ended them)."""


def score_rollouts(
    tokenizer: PreTrainedTokenizerBase,
    questions: list[GSM8KExample],
    prompts: list[str],
    samples: list[Sample],
    config: GRPOConfig,
    rewards: Mapping[str, str] | None = None,
) -> RolloutBatch:
    """Rewards (``rewards[config.prompt]``; None: the prompt's built-in) and group-normalised advantages; training
    tensors from the exact sampled token ids."""
    group = config.group_size
    responses = [sample.text for sample in samples]
    ground_truths = [example.answer for example in questions for _ in range(group)]
    advantages, raw_rewards, reward_metadata = compute_group_normalized_rewards(
        prompt_reward(config.prompt, rewards),
        responses,
        ground_truths,
        group,
        config.advantage_eps,
        config.use_std_normalization,
    )
    # The ids the engine conditioned on, not a re-tokenization (which could drop or add a BOS token).
    prompt_ids = [sample.prompt_token_ids for sample in samples]
    tensors = batch_from_token_ids(prompt_ids, [sample.token_ids for sample in samples], tokenizer.pad_token_id)
    engine_log_probs = None
    if wants_engine_log_probs(config):
        engine_log_probs = torch.zeros(tensors["labels"].shape)  # [N, L]
        for row, (ids, sample) in enumerate(zip(prompt_ids, samples, strict=True)):
            start = len(ids) - 1  # labels are shifted by one: response token t sits at label index len(prompt)-1+t
            engine_log_probs[row, start : start + len(sample.logprobs)] = torch.tensor(sample.logprobs)
    return RolloutBatch(
        prompts=[prompt for prompt in prompts for _ in range(group)],
        responses=responses,
        ground_truths=ground_truths,
        **tensors,
        engine_log_probs=engine_log_probs,
        raw_rewards=raw_rewards,
        advantages=advantages,
        reward_metadata=reward_metadata,
        response_lengths=[sample.length for sample in samples],
        sequence_lengths=sequence_lengths(tensors["response_mask"]),
        truncated=torch.tensor([sample.finish == "length" for sample in samples]),
    )


def rollout_metrics(
    drawn: DrawnRollouts, config: GRPOConfig, rewards: Mapping[str, str] | None = None
) -> dict[str, Mean]:
    """What a step logs of its rollouts: every group it sampled under ``rollout/`` (with dynamic sampling the dropped
    ones and every round too, so the figures are those a run without it logs), and with dynamic sampling the groups
    kept to train on, apart, under ``rollout/kept_``. Sums and counts: :meth:`Ranks.mean_metrics` divides them."""
    metrics = sample_metrics(drawn.sampled_questions, drawn.sampled_samples, config, "rollout/", rewards)
    if config.dynamic_sampling:
        metrics |= sample_metrics(drawn.questions, drawn.samples, config, "rollout/kept_", rewards)
    return metrics


def sample_metrics(
    questions: list[GSM8KExample],
    samples: list[Sample],
    config: GRPOConfig,
    prefix: str,
    rewards: Mapping[str, str] | None = None,
) -> dict[str, Mean]:
    """Rewards (``rewards[config.prompt]``; None: the prompt's built-in), the fraction of groups without reward
    variance, response lengths in tokens (all, correct, incorrect) and the truncated fraction of ``group_size``
    samples per question, group after group."""
    reward_fn, group = prompt_reward(config.prompt, rewards), config.group_size
    answers = [question.answer for question in questions for _ in range(group)]
    scores = [reward_fn(sample.text, answer) for sample, answer in zip(samples, answers, strict=True)]
    rewards = [score["reward"] for score in scores]
    correct = [sample.length for sample, reward in zip(samples, rewards, strict=True) if reward == 1.0]
    incorrect = [sample.length for sample, reward in zip(samples, rewards, strict=True) if reward != 1.0]
    metrics = {
        "reward": Mean.of(rewards),
        "format_reward": Mean.of(score["format_reward"] for score in scores),
        "answer_reward": Mean.of(score["answer_reward"] for score in scores),
        "zero_variance_group_fraction": Mean.of(
            float(len(set(rewards[start : start + group])) == 1) for start in range(0, len(rewards), group)
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
    draw = functools.partial(
        draw_rollouts, train=train, config=config, stop=eval_config.stop, ranks=ranks, rewards=rewards
    )
    check = functools.partial(
        validate, val=val, eval_config=eval_config, num_examples=config.eval_examples, prompt_name=config.prompt,
        seed=config.seed, ranks=ranks, rewards=rewards,
    )  # fmt: skip
    return open_rollouts(
        engine, policy, draw, check, seed=config.seed, max_staleness=config.max_staleness,
        n_steps=config.n_grpo_steps,
        validates=functools.partial(is_eval_step, eval_every=config.eval_every, total_steps=config.n_grpo_steps),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------- training
def policy_log_probs(
    policy: PreTrainedModel,
    batch: RolloutBatch,
    rows: list[int],
    precision: Precision,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> dict[str, torch.Tensor]:
    """Log-probs of the sampled responses of ``rows``, computed on the rows' longest sequence, returned ``[b, L]``,
    under ``softmax(logits / temperature)``: pass the temperature the responses were sampled at.
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
        )
    width = trimmed["labels"].shape[1]
    return {name: torch.nn.functional.pad(t, (0, batch.labels.shape[1] - width)) for name, t in result.items()}


def compute_old_log_probs(
    policy: PreTrainedModel, batch: RolloutBatch, config: GRPOConfig, ranks: Ranks = SINGLE
) -> torch.Tensor:
    """Log-probs of every sampled token under ``policy`` (π_old, or the frozen reference π_ref) at the sampling
    temperature ``config.temperature``, ``[N, L]``, once per rollout batch and never differentiated; in microbatches
    of ``old_log_probs_microbatch_tokens`` (no activations are kept, so they can be large)."""
    rows = list(range(len(batch.responses)))
    parts = split_microbatches(
        rows, batch.sequence_lengths, config.microbatch_size, config.old_log_probs_microbatch_tokens
    )
    old_log_probs = torch.zeros(batch.labels.shape)  # [N, L]
    for part in equal_counts(parts, ranks):
        with inference_context(policy):
            scored = policy_log_probs(policy, batch, part or [0], config.precision, temperature=config.temperature)
            scored = scored["log_probs"].float().cpu()
        if part:
            old_log_probs[part] = scored
    return old_log_probs


def equal_counts(parts: list[list[int]], ranks: Ranks) -> list[list[int]]:
    """``parts`` padded with empty microbatches to the most any rank has: FSDP2 gathers parameters in every forward,
    a collective every rank must join. An empty microbatch runs a forward on row 0 and counts for nothing."""
    return parts + [[]] * (ranks.max(len(parts)) - len(parts))


def accumulate_gradients(
    policy: PreTrainedModel,
    batch: RolloutBatch,
    rows: list[int],
    old_log_probs: torch.Tensor | None,
    config: GRPOConfig,
    ref_log_probs: torch.Tensor | None = None,
    ranks: Ranks = SINGLE,
    importance_weights: torch.Tensor | None = None,
) -> dict[str, float]:
    """Backward through ``grpo_microbatch_train_step`` for each microbatch of ``rows`` (one optimizer step's worth);
    gradients are left in ``.grad``. Returns the step's loss, entropy, and (when they apply) clip fractions and KL.

    A microbatch of ``b`` of the step's ``n`` sequences passes ``gradient_accumulation_steps = n / b``: its mean
    per-sequence loss then counts with its share of the step's sequences, and the gradient is the handout's mean over
    the step's sequences whatever the split. With ``mask_truncated`` the truncated responses are left out of the step:
    under ``masked_mean`` its mean runs over the others; under ``masked_normalize`` they count with zero loss, so the
    normaliser stays all rows × ``max_tokens``. Entropy, clip fractions and KL are means over the trained response
    tokens. Log-probs and entropy are those of the distribution the responses were sampled from, at
    ``config.temperature``.

    ``importance_weights`` (``[N, L]``, ``grpo.rollout_is_cap``): each token's policy-gradient term times its weight.

    Over several ranks, ``rows`` are this rank's share of the step: each microbatch is weighted by the step's rows
    on all ranks, so the gradients DDP or FSDP2 average in the last microbatch's backward (the only one that syncs)
    are those of the whole step, and the metrics returned are the whole step's on every rank.
    """
    all_rows = ranks.sum(len(rows))
    if config.mask_truncated:
        rows = [row for row in rows if not batch.truncated[row]]
    token_means = {"train/entropy": 0.0}
    token_means |= {f"train/{metric}": 0.0 for metric in LOSS_TYPES[config.loss_type].token_metrics}
    if config.kl_coef > 0:
        token_means["train/kl"] = 0.0
    step_rows = ranks.sum(len(rows))
    if not step_rows:
        tqdm.write("GRPO: every response of this optimizer step was truncated (grpo.mask_truncated); nothing to train")
        return {"train/loss": 0.0} | token_means
    # Dr. GRPO's per-sequence constant (max_tokens) is only constant if the step's sequences all count, truncated ones
    # with zero loss: dividing by the kept rows would scale the step up with the truncation rate.
    weighted_rows = all_rows if config.length_normalization == "masked_normalize" else step_rows
    step_tokens = ranks.sum(batch.response_mask[rows].sum().item())
    loss = 0.0
    parts = equal_counts(
        split_microbatches(rows, batch.sequence_lengths, config.microbatch_size, config.microbatch_tokens), ranks
    )
    for index, part in enumerate(parts):
        with gradient_sync(policy, enabled=index == len(parts) - 1):
            if not part:
                scored = policy_log_probs(policy, batch, [0], config.precision, temperature=config.temperature)
                (scored["log_probs"].sum() * 0.0).backward()  # joins the ranks' collectives, adds nothing
                continue
            accumulation = weighted_rows / (ranks.world_size * len(part))
            step_loss, metadata, scored, mask = _microbatch_step(
                policy, batch, part, old_log_probs, ref_log_probs, config, accumulation, importance_weights
            )
        share = mask.sum().item() / step_tokens  # of the step's trained response tokens
        loss += step_loss.item()
        metadata["entropy"] = masked_mean(scored["token_entropy"], mask)
        for name in token_means:
            token_means[name] += metadata[name.removeprefix("train/")].item() * share
    return {"train/loss": ranks.sum(loss) / ranks.world_size} | {
        name: ranks.sum(value) for name, value in token_means.items()
    }


def _microbatch_step(
    policy: PreTrainedModel,
    batch: RolloutBatch,
    part: list[int],
    old_log_probs: torch.Tensor | None,
    ref_log_probs: torch.Tensor | None,
    config: GRPOConfig,
    gradient_accumulation_steps: float,
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """Forward and backward of one microbatch (``grpo_microbatch_train_step``): loss, metadata, scores and mask."""
    device = next(policy.parameters()).device
    scored = policy_log_probs(policy, batch, part, config.precision, with_entropy=True, temperature=config.temperature)
    mask = batch.response_mask[part].to(device)  # [b, L]
    step_loss, metadata = grpo_microbatch_train_step(
        scored["log_probs"],
        mask,
        gradient_accumulation_steps,
        config.loss_type,
        raw_rewards=batch.raw_rewards[part].unsqueeze(-1).to(device),  # [b, 1]
        advantages=batch.advantages[part].unsqueeze(-1).to(device),  # [b, 1]
        old_log_probs=None if old_log_probs is None else old_log_probs[part].to(device),
        cliprange=config.cliprange,
        length_normalization=config.length_normalization,
        normalize_constant=config.max_tokens,
        cliprange_high=config.cliprange_high,
        ref_log_probs=None if ref_log_probs is None else ref_log_probs[part].to(device),
        kl_coef=config.kl_coef,
        kl_estimator=config.kl_estimator,
        importance_weights=None if importance_weights is None else importance_weights[part].to(device),
    )
    return step_loss, metadata, scored, mask


def frozen_reference(policy: PreTrainedModel, config: GRPOConfig) -> PreTrainedModel | None:
    """The KL penalty's reference (``kl_coef > 0``): the init model, frozen. With LoRA it is ``policy`` itself (run
    with its adapters off); otherwise a copy of ``policy`` as loaded, in the same dtype and computed in the same
    precision, so the penalty is exactly 0 before the first update (a bf16 reference beside an fp32 ``mixed``
    policy differs by up to 0.28 nat per token at step 0)."""
    if config.kl_coef == 0:
        return None
    if config.lora_rank > 0:
        return policy
    return copy.deepcopy(policy).eval().requires_grad_(False)


def optimizer_step(
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    config: GRPOConfig,
    guard: NonFiniteGuard,
    step: int,
    checks: dict[str, Any],
    ranks: Ranks = SINGLE,
    share: float = 1.0,
) -> dict[str, float]:
    """Clip and apply the accumulated gradients, unless something is NaN/Inf (then skip and count). Over several
    ranks each check is summed over them first, so a NaN on one rank skips the step on all of them together.

    ``share``: the step's rows over a full ``train_batch_size``, below 1 only when dynamic sampling ran out of rounds
    short of groups. The step's learning rate is scaled by it (the linear scaling rule, arXiv:1706.02677): a mean over
    fewer samples is a noisier estimate, and AdamW would otherwise move the weights as far as on a full step."""
    grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm))
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
    per_epoch = config.rollout_batch_size // config.train_batch_size
    place = (step * config.epochs_per_rollout_batch + epoch) * per_epoch + train_batch
    schedule = LearningRateSchedule(
        config.learning_rate, config.lr_schedule, config.total_optimizer_steps, config.warmup_steps
    )
    return schedule.rate(place)


def has_learning_signal(batch: RolloutBatch, rows: list[int], config: GRPOConfig, ranks: Ranks = SINGLE) -> bool:
    """Whether an optimizer step on ``rows`` (on any rank) can have a gradient: a trained row with a non-zero loss
    weight (its advantage; its raw reward for ``no_baseline``), or a KL penalty. A step without one is skipped:
    its gradient is zero, but AdamW's momentum would still move the weights."""
    if config.kl_coef > 0:
        return True
    if config.mask_truncated:
        rows = [row for row in rows if not batch.truncated[row]]
    weights = getattr(batch, LOSS_TYPES[config.loss_type].weight)  # [N]: batch.raw_rewards or batch.advantages
    return ranks.sum((weights[rows] != 0).sum().item()) > 0  # NaN counts as a signal: the NaN guard reports it


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
    versions = {} if config is None else in_flight_versions(state.step, config.max_staleness, config.n_grpo_steps)
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


def grpo_checkpoints(
    directory: Path,
    run_fingerprint: str,
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    best: BestCheckpoint,
    live_dir: Path,
    ranks: Ranks = SINGLE,
    config: GRPOConfig | None = None,
) -> RunCheckpoints[TrainingState]:
    """A GRPO run's checkpoints in ``directory`` (:class:`reasonrl.training.checkpoints.RunCheckpoints`), with its
    rollouts in flight: resumed only by a run of ``config`` that holds those (None: nothing in flight)."""
    parts = directory, run_fingerprint, "GRPO", TrainingState, policy, optimizer, best, live_dir, ranks
    return RunCheckpoints(*parts, part=InFlightRollouts(config))


# ---------------------------------------------------------------------------------------------------------- the loop
STEP_PHASES = ("rollout", "weight_sync", "scoring", "old_log_prob", "train", "step", "engine")
"""The phases of a GRPO step, timed and logged (``time/<phase>_seconds``) in this order. ``rollout``: lag 0 with
waking the engine and loading the weights, lag ≥ 1 the wait for the step's rollouts; ``step``: the whole step;
``engine``: the engine's own time on the step's rollouts, when it ran beside the trainer."""


def step_progress(first: int, total: int, enabled: bool) -> tqdm:
    """The bar over GRPO steps ``first`` .. ``total - 1``, drawn as ``first``/``total`` at the start: after a resume
    tqdm's rate, and so its ETA, counts only the steps this run takes."""
    return tqdm(range(first, total), desc="grpo", unit="step", initial=first, total=total, disable=not enabled)


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
) -> BestCheckpoint:
    """The GRPO loop, graded by ``rewards[config.prompt]`` (None: the prompt's built-in); resumes from the newest
    checkpoint in ``checkpoint_dir`` made from the same inputs (see :func:`reasonrl.training.checkpoints.fingerprint`).
    The checkpoints stay after a completed run: call :func:`reasonrl.training.checkpoints.remove_checkpoints` once the
    returned best and the final policy are saved.

    Over several ranks (``ranks``, launched with ``distributed``) every rank runs this loop on its share of each
    step's questions and trains the policy under ``distributed.strategy``; rank 0 logs, checkpoints and keeps the
    best weights. ``keep(step, best)``: called on every rank every ``keep_every`` steps (``grpo.keep_every``), to save
    the policy.

    ``engine``: the engine of this process (``max_staleness`` 0), or the engine's own process (≥ 1: see
    :class:`reasonrl.rollouts.sources.LaggedRollouts`), as :func:`reasonrl.rollouts.process.start_engine` starts
    them; the loop's source stops the engine's process when the loop ends, or fails."""
    reference = frozen_reference(policy, config)  # before wrapping and resuming: the init model, as loaded
    trainer = wrap_for_training(policy, "ddp" if distributed is None else distributed.strategy, ranks)
    optimizer = make_optimizer(policy, config, config.betas)  # after wrapping: FSDP2 shards the parameters
    best = BestCheckpoint()
    device = next(policy.parameters()).device.type
    data = {"train": examples_digest(train), "val": examples_digest(val)}
    run_fingerprint = fingerprint(
        "grpo", config, eval_config, engine.config, init_model_dir, data, GRPO_STAGE, device, rewards, distributed
    )
    checkpoints = grpo_checkpoints(checkpoint_dir, run_fingerprint, policy, optimizer, best, live_dir, ranks, config)
    state = checkpoints.resume()
    guard = NonFiniteGuard(config.max_consecutive_nonfinite, state.skipped_steps, state.consecutive_nonfinite)
    if reference is policy:
        reference = trainer
    train_rows_per_rank = config.train_batch_size // ranks.world_size
    rollouts = grpo_rollouts(engine, policy, train, val, config, eval_config, ranks, rewards)

    with rollouts, open_live(state.step > 0) if ranks.is_main else contextlib.nullcontext(NullLive()) as live:
        rollouts.start(state.step, state.in_flight)

        def evaluate_and_log(step: int) -> None:
            result = rollouts.validate(step)
            metrics = result.metrics
            live.step = state.optimizer_steps
            log_validation(live, metrics)
            live.log_metric("time/elapsed_seconds", state.elapsed_seconds)
            live.log_metric("grpo_step", step)
            best.offer(policy, metrics["accuracy"], step, ranks.is_main, metrics["accuracy_interval"])
            if ranks.is_main:
                examples = [
                    {"step": step, "prompt": r["prompt"], "response": r["response"], "reward": r["reward"]}
                    for r in result.records[:EXAMPLES_PER_EVAL]
                ]
                examples_file = live_dir / "examples" / f"step_{step:06d}.json"
                examples_file.parent.mkdir(parents=True, exist_ok=True)
                examples_file.write_text(json.dumps(examples, indent=2, ensure_ascii=False), encoding="utf-8")
            live.sync()

        progress = step_progress(state.step, config.n_grpo_steps, enabled=ranks.is_main)
        for step in progress:
            if is_eval_step(step, config.eval_every, config.n_grpo_steps):
                evaluate_and_log(step)
            timer = PhaseTimer(STEP_PHASES)

            # Rollouts: a group of samples per question, from the engine loaded with the policy of step - lag.
            step_rollouts = rollouts.batch(step)
            drawn = step_rollouts.drawn
            timer.lap("rollout")

            # Scoring: rewards, group-normalised advantages, training tensors.
            batch = score_rollouts(tokenizer, drawn.questions, drawn.prompts, drawn.samples, config, rewards)
            # The step's rollout figures over every rank's samples, logged with each of its optimizer steps.
            rollout = ranks.mean_metrics(rollout_metrics(drawn, config, rewards))
            rollout["rollout/sampling_rounds"] = drawn.sampling_rounds
            rollout["rollout/policy_lag"] = step - step_rollouts.version
            if config.dynamic_sampling:
                rollout["rollout/dropped_groups"] = drawn.dropped_groups
            timer.lap("scoring")

            # Old and reference log-probs, once per rollout batch, never differentiated.
            old_log_probs = ref_log_probs = importance_weights = None
            if LOSS_TYPES[config.loss_type].needs_old_log_probs or config.rollout_is_cap is not None:
                old_log_probs = (
                    batch.engine_log_probs
                    if config.old_log_probs_from == "engine"
                    else compute_old_log_probs(trainer, batch, config, ranks)
                )
            if reference is trainer:
                with adapters_disabled(policy):
                    ref_log_probs = compute_old_log_probs(trainer, batch, config, ranks)
            elif reference is not None:
                ref_log_probs = compute_old_log_probs(reference, batch, config)
            if config.rollout_is_cap is not None:  # the decoupled objective's weight min(π_old / μ, cap)
                importance_weights, corrections = rollout_importance_weights(
                    old_log_probs, batch.engine_log_probs, batch.response_mask, config.rollout_is_cap
                )
                rollout |= {f"train/{name}": value.item() for name, value in corrections.items()}
            timer.lap("old_log_prob")

            # Train: epochs over the rollout batch, one optimizer step per train batch.
            order_rng = random.Random(step_seed(config.seed, step))
            for epoch in range(config.epochs_per_rollout_batch):
                order = ranks.rows_to_train(len(batch.responses))
                order_rng.shuffle(order)
                for train_batch, rows in enumerate(chunks(order, train_rows_per_rank)):  # one optimizer step each
                    metrics = {}
                    if has_learning_signal(batch, rows, config, ranks):
                        metrics = accumulate_gradients(
                            trainer, batch, rows, old_log_probs, config, ref_log_probs, ranks, importance_weights
                        )
                        checks = {"advantages": batch.advantages[rows], "loss": metrics["train/loss"]}
                        share = len(rows) / train_rows_per_rank
                        set_learning_rate(optimizer, scheduled_learning_rate(config, step, epoch, train_batch))
                        metrics |= optimizer_step(policy, optimizer, config, guard, step, checks, ranks, share)
                    else:
                        state.zero_signal_steps += 1
                    metrics["train/zero_signal_steps"] = state.zero_signal_steps
                    state.optimizer_steps += 1
                    live.step = state.optimizer_steps
                    for name, value in (metrics | rollout).items():
                        live.log_metric(name, value)
            timer.lap("train")

            state.step, state.skipped_steps, state.consecutive_nonfinite = step + 1, guard.skipped, guard.consecutive
            rollouts.advance(state.step)  # lag ≥ 1: the new weights to the engine, the next step's draw requested
            state.elapsed_seconds += timer.total("step")
            # Lag 0: waking the engine and loading the weights; lag 1: streaming them to the engine's process, which
            # takes them once it has finished the draw it is on; lag ≥ 2: packing them aside for it.
            timer.record("weight_sync", rollouts.sync_seconds)
            if step_rollouts.engine_seconds is not None:
                timer.record("engine", step_rollouts.engine_seconds)
            for name, value in timer.metrics().items():
                live.log_metric(name, value)
            live.log_metric("grpo_step", state.step)
            live.sync()
            progress.set_postfix(reward=f"{rollout['rollout/reward']:.3f}")
            if keep is not None and is_keep_step(state.step, config.keep_every):
                keep(state.step, best)
            if is_checkpoint_step(state.step, config.checkpoint_every, config.n_grpo_steps):
                state.in_flight, state.to_request = rollouts.in_flight(state.step)
                checkpoints.save(state)

        evaluate_and_log(state.step)
    return best

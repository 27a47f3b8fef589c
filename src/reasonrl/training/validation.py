"""Validation during training: the policy evaluated in a generation phase of the rollout engine, and logged."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reasonrl.cost import CostLedger, Tokens, summed_over_ranks
from reasonrl.distributed import SINGLE, Ranks
from reasonrl.evaluation import EvalResult, evaluate, summarize

if TYPE_CHECKING:
    from dvclive import Live
    from transformers import PreTrainedModel

    from reasonrl.config import EvalConfig
    from reasonrl.data import GSM8KExample
    from reasonrl.rollouts.engine import RolloutEngine


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
    first_of_engine = ranks.tensor_parallel_rank == 0
    records = ranks.gather(mine if first_of_engine else [])  # one copy per engine
    tokens = summed_over_ranks(result.tokens if first_of_engine else Tokens(), ranks)
    return EvalResult(summarize(records), records, tokens)


def timed_validation(ledger: CostLedger, *args: Any, **kwargs: Any) -> EvalResult:
    """:func:`validate` with ``args`` and ``kwargs``, its seconds and generated tokens added to ``ledger``'s
    ``validation`` phase."""
    with ledger.timed("validation"):
        result = validate(*args, **kwargs)
    ledger.add_tokens("validation", "generated", result.tokens)
    return result


def log_validation(live: Live, metrics: dict[str, Any]) -> None:
    live.log_metric("eval/accuracy", metrics["accuracy"])
    live.log_metric("eval/format_rate", metrics["format_rate"])
    for subset, length in metrics["response_length"].items():
        if length is not None:
            live.log_metric(f"eval/response_length_{subset}", length)

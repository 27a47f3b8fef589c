"""The skeleton of a training stage (sft, ei, grpo), around the route's loop: one run at a time on its checkpoints
and kept policies, the engine and the policy started, the loop run (keeping policies as it goes), its models saved
with their cards, its summary metrics written, its checkpoints removed once all that is on disk."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reasonrl.atomic import atomic_write_json
from reasonrl.cost import CostLedger, write_cost
from reasonrl.distributed import SINGLE, Ranks
from reasonrl.lora import trainable_parameter_count
from reasonrl.model_card import DataFile, gather_provenance, render_card
from reasonrl.training.best import whole_weights
from reasonrl.training.checkpoints import checkpoint_lock, remove_checkpoints
from reasonrl.training.policy import save_policy, start_training

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reasonrl.config import Params
    from reasonrl.model_card import Route
    from reasonrl.training.best import BestCheckpoint

    Keep = Callable[[int, BestCheckpoint], None]
    """``keep(step, best)``: save the policy after ``step`` steps, on every rank."""
    Run = Callable[[Any, PreTrainedModel, PreTrainedTokenizerBase, Keep | None, CostLedger], BestCheckpoint]
    """``run(engine, policy, tokenizer, keep, ledger)``: the route's loop, adding its phases to ``ledger``; returns
    its best checkpoint."""


@dataclass(frozen=True)
class SavedModel:
    """A model a stage saves: in ``directory``, the best checkpoint's weights or (``final``) the policy's at the end,
    its card naming it ``checkpoint`` (e.g. "the step with the best validation accuracy")."""

    directory: Path
    checkpoint: str
    final: bool = False


def run_training_stage(
    params: Params,
    section: Route,
    model_dir: str | Path,
    data_files: list[DataFile],
    run: Run,
    outputs: list[SavedModel],
    *,
    params_file: str | Path,
    checkpoints: str | Path,
    metrics: str | Path,
    cost: str | Path,
    started: float,
    unit: str = "step",
    kept: Path | None = None,
    kept_unit: str = "step",
    summary: Mapping[str, Any] | None = None,
    ranks: Ranks = SINGLE,
    policy_shards: int = 1,
    max_staleness: int = 0,
) -> BestCheckpoint | None:
    """Train the ``section`` route (sft, ei, grpo: its params section, its cards' route) from ``model_dir`` with
    ``run`` and save ``outputs``, their cards naming ``data_files`` and the params that differ from ``params_file`` as
    committed; ``unit`` names what the best checkpoint's step counts (step, round). One run at a time writes the
    ``checkpoints``, the kept policies (in ``kept``, as ``step_NNNNNN`` after each ``kept_unit``; None: the run keeps
    none), the curves and the outputs: rank 0 holds the locks for the whole run (its ranks are one holder), and a
    second run stops before it reads or deletes anything.

    ``metrics``: the best validation accuracy and its ``best_<unit>``, ``summary``, the trainable parameters and the
    wall clock since ``started``. ``cost``: what the run cost (:mod:`reasonrl.cost`): the start (the engine and the
    policy), the loop's phases, the saving of the outputs. ``ranks``, ``policy_shards``, ``max_staleness``: see
    :func:`reasonrl.training.policy.start_training`. Returns the best checkpoint (rank 0; None on the others)."""
    config, provenance = getattr(params, section), gather_provenance(params_file, model_dir, data_files)
    ledger = CostLedger()
    with checkpoint_lock(checkpoints, kept) if ranks.is_main else contextlib.nullcontext():
        with ledger.timed("start"):
            engine, policy, tokenizer, plan = start_training(
                model_dir, config, section, params.rollout, ranks, policy_shards, max_staleness
            )

        def keep(step: int, best: BestCheckpoint) -> None:
            weights = whole_weights(policy, ranks.is_main)  # every rank: gathered from the shards under FSDP2
            if ranks.is_main:
                checkpoint = f"the policy after {kept_unit} {step}"
                card = render_card(params, section, checkpoint, best, unit, provenance)
                save_policy(policy, tokenizer, kept / f"step_{step:06d}", weights, card)

        best = run(engine, policy, tokenizer, None if kept is None else keep, ledger)
        final = whole_weights(policy, ranks.is_main) if any(out.final for out in outputs) else None  # as keep's
        if not ranks.is_main:
            return None
        with ledger.timed("save"):
            for output in outputs:
                card = render_card(params, section, output.checkpoint, best, unit, provenance)
                save_policy(policy, tokenizer, output.directory, final if output.final else best.state_dict, card)
        atomic_write_json(
            metrics,
            {
                "best_val_accuracy": best.accuracy,
                f"best_{unit}": best.step,
                **(summary or {}),
                "trainable_parameters": trainable_parameter_count(policy),
                "wall_clock_seconds": round(time.perf_counter() - started, 1),
            },
        )
        write_cost(cost, ledger, started, params, ranks.world_size, plan)
        remove_checkpoints(Path(checkpoints))
    return best

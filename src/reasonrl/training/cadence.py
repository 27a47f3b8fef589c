"""Which steps of a run validate, checkpoint and keep the policy: every ``<x>_every`` steps, counted in the run's own
steps (SFT's optimizer steps, expert iteration's rounds, GRPO's steps), by the step count reached."""

from __future__ import annotations


def is_eval_step(step: int, eval_every: int, total_steps: int) -> bool:
    """Whether a run validates the policy after ``step`` of its ``total_steps``: every ``eval_every``, and at the
    end."""
    return step % eval_every == 0 or step == total_steps


def is_checkpoint_step(step: int, checkpoint_every: int, total_steps: int) -> bool:
    """Whether a run writes a resumable checkpoint after ``step`` of its ``total_steps``: every ``checkpoint_every``
    (0: never) but at the end, where the stage saves its outputs instead."""
    return bool(checkpoint_every) and step % checkpoint_every == 0 and step < total_steps


def is_keep_step(step: int, keep_every: int) -> bool:
    """Whether a run keeps the policy after ``step`` steps: every ``keep_every`` (0: never)."""
    return bool(keep_every) and step % keep_every == 0

"""What a stage's result cost, measured as it runs: each phase's wall clock and the tokens it generated or trained
on, the peak memory reached, and the device-hours (with a price when ``cost.device_hour_price`` is set). A stage
writes them to ``reports/<stage>/cost.json`` (:func:`write_cost`).

Every figure is measured on this run: one this device cannot measure is null, with the reason under ``reasons``,
never 0 or an estimate. A resumed training stage counts from its resume, as its ``wall_clock_seconds`` does."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from reasonrl.atomic import atomic_write_json
from reasonrl.config import LAYOUT_GPUS

if TYPE_CHECKING:
    from reasonrl.config import Params
    from reasonrl.distributed import Ranks
    from reasonrl.memory import MemoryPlan

TokenKind = Literal["generated", "trained"]
TOKEN_KINDS: tuple[TokenKind, ...] = ("generated", "trained")
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Tokens:
    """Tokens of prompts and of responses. Generated: each sample counts its prompt (a prompt sampled ``n`` times
    counts ``n`` times, as the engine attends to it for each) and its generated tokens, a final EOS included.
    Trained: the positions a trained row's forward runs over, padding excluded, once per pass over it: the response
    tokens it predicts, and the prompt positions before them (the prompt's tokens but its last, whose position
    predicts the first response token)."""

    prompt: int = 0
    response: int = 0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.prompt + other.prompt, self.response + other.response)

    @property
    def total(self) -> int:
        return self.prompt + self.response


def summed_over_ranks(tokens: Tokens, ranks: Ranks) -> Tokens:
    """``tokens`` summed over every rank (each rank's own share)."""
    return Tokens(int(ranks.sum(tokens.prompt)), int(ranks.sum(tokens.response)))


@dataclass
class Phase:
    seconds: float = 0.0
    kind: TokenKind | None = None
    """What the phase does with its tokens; None: it processes none that the ledger counts."""
    tokens: Tokens = field(default_factory=Tokens)


@dataclass
class CostLedger:
    """A stage's phases as it runs them, in the order first met: seconds, and the tokens each generated or trained."""

    phases: dict[str, Phase] = field(default_factory=dict)

    def add_seconds(self, phase: str, seconds: float) -> None:
        self.phases.setdefault(phase, Phase()).seconds += seconds

    def add_tokens(self, phase: str, kind: TokenKind, tokens: Tokens) -> None:
        entry = self.phases.setdefault(phase, Phase())
        if entry.kind not in (None, kind):
            raise ValueError(f"phase {phase!r} counts {entry.kind} tokens, not {kind}")
        entry.kind, entry.tokens = kind, entry.tokens + tokens

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the seconds the ``with`` block takes to ``phase``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add_seconds(phase, time.perf_counter() - started)

    def totals(self, kind: TokenKind) -> Tokens:
        """The tokens of ``kind`` over every phase."""
        return sum((phase.tokens for phase in self.phases.values() if phase.kind == kind), Tokens())


def phase_report(phase: Phase) -> dict[str, Any]:
    """A phase's seconds and, where it counts tokens, their kind, counts and rates (per second of the phase)."""
    report: dict[str, Any] = {"seconds": round(phase.seconds, 3)}
    if phase.kind is None:
        return report
    tokens, seconds = phase.tokens, phase.seconds
    return report | {
        "tokens": phase.kind,
        "prompt_tokens": tokens.prompt,
        "response_tokens": tokens.response,
        "tokens_per_second": tokens.total / seconds if seconds > 0 else None,
        "response_tokens_per_second": tokens.response / seconds if seconds > 0 else None,
    }


@dataclass(frozen=True)
class Device:
    """What the stage ran on, for its device-hours: ``count`` GPUs (``kind`` cuda) or CPU cores (``kind`` cpu)."""

    kind: Literal["cuda", "cpu"]
    count: int
    counted: str
    """How ``count`` was found, in words."""

    @property
    def hours_unit(self) -> str:
        return "gpu_hours" if self.kind == "cuda" else "cpu_core_hours"


def stage_device(params: Params, ranks: int = 1) -> Device:
    """What a stage of ``ranks`` processes holds: on a GPU layout each rank's GPUs (``rollout.layout``), else the
    CPU cores this process may run on."""
    if params.rollout.on_gpu:
        gpus = LAYOUT_GPUS[params.rollout.layout] * ranks
        return Device("cuda", gpus, f"GPUs of rollout.layout {params.rollout.layout} × {ranks} rank(s)")
    return Device("cpu", len(os.sched_getaffinity(0)), "CPU cores this process may run on (its affinity)")


def peak_memory(device: Device) -> tuple[dict[str, int | None], dict[str, str]]:
    """The peak memory reached so far: on CUDA the bytes torch allocated on the current GPU; on CPU the peak resident
    set of this process and that of the largest child process that has ended (an engine in its own process, once
    stopped), with the reasons for whatever is null."""
    reasons: dict[str, str] = {}
    if device.kind == "cuda":
        import torch

        peaks: dict[str, int | None] = {"peak_cuda_allocated_bytes": torch.cuda.max_memory_allocated()}
        peaks["peak_rss_bytes"] = None
        reasons["peak_rss_bytes"] = "on CUDA the GPU's peak is the one that bounds a run"
        return peaks, reasons
    # ru_maxrss: KiB on Linux, bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale
    peaks = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale}
    peaks["peak_rss_children_bytes"] = children or None
    if not children:
        reasons["peak_rss_children_bytes"] = "no child process of this stage has ended"
    peaks["peak_cuda_allocated_bytes"] = None
    reasons["peak_cuda_allocated_bytes"] = "no GPU: the stage ran on the CPU"
    return peaks, reasons


def planned_memory(plan: MemoryPlan | None) -> tuple[dict[str, int | None], dict[str, str]]:
    """The memory plan's prediction for the policy's GPU (:mod:`reasonrl.memory`), or null and why."""
    if plan is None:
        reason = "no memory plan: it is made for a training stage on a GPU"
        return {"planned_training_bytes": None, "planned_generating_bytes": None}, {
            "planned_training_bytes": reason,
            "planned_generating_bytes": reason,
        }
    return {"planned_training_bytes": plan.training, "planned_generating_bytes": plan.generating}, {}


def cost_report(
    ledger: CostLedger,
    wall_clock_seconds: float,
    device: Device,
    price: float | None,
    plan: MemoryPlan | None = None,
) -> dict[str, Any]:
    """The ledger's figures as ``cost.json`` holds them: the phases, the token totals, the memory, the device-hours
    over ``wall_clock_seconds`` (the stage's whole run: the device is held throughout) and their price at ``price``
    per device-hour (None: not set)."""
    peaks, reasons = peak_memory(device)
    planned, plan_reasons = planned_memory(plan)
    hours = device.count * wall_clock_seconds / SECONDS_PER_HOUR
    report: dict[str, Any] = {
        "wall_clock_seconds": round(wall_clock_seconds, 3),
        "phases": {name: phase_report(phase) for name, phase in ledger.phases.items()},
    }
    for kind in TOKEN_KINDS:
        tokens = ledger.totals(kind)
        report[f"tokens_{kind}"] = {"prompt": tokens.prompt, "response": tokens.response, "total": tokens.total}
    report |= {"memory": peaks | planned}
    report |= {
        "device": {"kind": device.kind, "count": device.count, "counted": device.counted},
        "device_hours": hours,
        "device_hours_unit": device.hours_unit,
        "price": None if price is None else hours * price,
    }
    reasons |= plan_reasons
    if price is None:
        reasons["price"] = "cost.device_hour_price is not set"
    report["reasons"] = reasons
    return report


def write_cost(
    path: str | Path,
    ledger: CostLedger,
    started: float,
    params: Params,
    ranks: int = 1,
    plan: MemoryPlan | None = None,
) -> dict[str, Any]:
    """Write :func:`cost_report` of a stage that started at ``started`` (``time.perf_counter``) to ``path``
    (atomically), priced at ``cost.device_hour_price``; return it."""
    wall_clock = time.perf_counter() - started
    report = cost_report(ledger, wall_clock, stage_device(params, ranks), params.cost.device_hour_price, plan)
    atomic_write_json(path, report)
    return report

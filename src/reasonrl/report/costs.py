"""The report's cost section: what each stage of the run cost, from its ``cost.json`` (:mod:`reasonrl.cost`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reasonrl.report.document import Heading, Paragraph, Report, Table
from reasonrl.report.headline import stage_metrics

COST_STAGES = {"baseline": "baseline", "sft": "sft", "expert_iteration": "ei", "grpo": "grpo", "final_eval": "final"}
"""The stages that write a ``cost.json``, each with its directory under the reports directory."""
HOURS_UNITS = {"gpu_hours": "GPU-h", "cpu_core_hours": "core-h"}


def stage_costs(reports_dir: Path) -> dict[str, dict[str, Any]]:
    """Each stage's ``cost.json`` under ``reports_dir`` (empty where absent)."""
    return {
        stage: stage_metrics(Path(reports_dir) / directory / "cost.json") for stage, directory in COST_STAGES.items()
    }


def tokens_per_second(phases: list[Mapping[str, Any]]) -> float | None:
    """Response tokens per second over ``phases``; None where they took no time."""
    seconds = sum(phase["seconds"] for phase in phases)
    return sum(phase.get("response_tokens", 0) for phase in phases) / seconds if seconds > 0 else None


def generating(cost: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [phase for phase in cost["phases"].values() if phase.get("tokens") == "generated"]


def mebibytes(size: int | None) -> str:
    return "—" if size is None else f"{size / 2**20:,.0f} MiB"


def peak(memory: Mapping[str, Any]) -> str:
    """The peak the stage reached: the GPU's where measured, else the process's resident set (and its largest
    child's, an engine in its own process)."""
    if memory.get("peak_cuda_allocated_bytes") is not None:
        return f"{mebibytes(memory['peak_cuda_allocated_bytes'])} (GPU)"
    child = memory.get("peak_rss_children_bytes")
    return f"{mebibytes(memory['peak_rss_bytes'])} RSS" + ("" if child is None else f", child {mebibytes(child)}")


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def cost_row(stage: str, cost: Mapping[str, Any]) -> list[str]:
    if not cost:
        return [stage, "not recorded", *["—"] * 7]
    generated, trained, memory = cost["tokens_generated"], cost["tokens_trained"], cost["memory"]
    planned = memory.get("planned_training_bytes")
    price = cost.get("price")
    train = cost["phases"].get("train")  # none where no training ran; one that trained nothing counts 0
    return [
        stage,
        f"{cost['device_hours']:.4g} {HOURS_UNITS[cost['device_hours_unit']]} ({cost['device']['count']} "
        f"{'GPUs' if cost['device']['kind'] == 'cuda' else 'cores'})",
        f"{generated['prompt']:,} + {generated['response']:,}",
        rate(tokens_per_second(generating(cost))),
        "—" if train is None else f"{trained['prompt']:,} + {trained['response']:,}",
        "—" if train is None else rate(tokens_per_second([train])),
        peak(memory),
        mebibytes(planned),
        "—" if price is None else f"{price:.4g}",
    ]


COST_HEADERS = [
    "stage",
    "device-hours",
    "tokens generated (prompt + response)",
    "generated/s",
    "tokens trained (prompt + response)",
    "trained/s",
    "peak memory",
    "planned (training)",
    "price",
]


def cost_section(report: Report, reports_dir: Path) -> None:
    """A row per stage: device-hours, tokens generated and trained with their rates (response tokens per second of
    the phases that handled them), the peak memory beside the memory plan's, and the price where set."""
    report.blocks.append(Heading(2, "What each stage cost"))
    costs = stage_costs(reports_dir)
    report.blocks.append(Table(COST_HEADERS, [cost_row(stage, cost) for stage, cost in costs.items()]))
    report.blocks.append(
        Paragraph(
            "From each stage's `cost.json` (`reports/<stage>/cost.json`): device-hours are the devices the stage held "
            "× its wall clock (GPUs on CUDA, CPU cores on the CPU); a prompt counts once per sample drawn from it; "
            "the rates are response tokens per second of the phases that generated or trained them. A figure this "
            "device cannot measure is null in `cost.json`, with its reason (—: not measured, or no training phase "
            "ran; never a zero). A resumed stage counts from its resume. Price: `cost.device_hour_price` × "
            "device-hours."
        )
    )

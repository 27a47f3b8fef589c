"""The routes the pipeline compares: the base model and the three ways of training it (SFT, expert iteration, GRPO),
in the order every output lists them. The one table of what each route is called, which stage trains it, which
model that training starts from, which prompt it is evaluated with and where its files are; the modules that list
routes read it. dvc.yaml spells the same paths out (a YAML file reads no Python): tests/test_final_eval.py checks
that its final_eval command evaluates these models under these names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reasonrl.config import Params


@dataclass(frozen=True)
class Route:
    name: str
    """What every output calls it: final_eval's ``--model NAME``, the keys of the metrics files, the report's rows,
    and (for a trained route) its params section."""
    stage: str | None
    """The dvc.yaml stage that trains it; None for the base model, which none does."""
    method: str | None
    """What trains it, in words (the model card's)."""
    init_model: str | None
    """The param naming the route whose model its training starts from; None where no param does (SFT always
    starts from the base model)."""
    prompt_section: str
    """The params section whose ``prompt`` the route is evaluated with: its training's; for the base model SFT's, the
    prompt SFT starts it on."""
    model_dir: str
    """The model final_eval evaluates (GRPO's best policy, not its last)."""
    reports_dir: str | None
    """Where its training writes, under the reports directory: ``metrics.json`` and the DVCLive directory ``live``;
    None for the base model."""


ROUTE = {
    route.name: route
    for route in (
        Route("base", None, None, None, "sft", "models/base", None),
        Route("sft", "sft", "supervised fine-tuning", None, "sft", "models/sft", "sft"),
        Route("ei", "expert_iteration", "expert iteration", "ei.init_model", "ei", "models/ei", "ei"),
        Route("grpo", "grpo", "GRPO", "grpo.init_model", "grpo", "models/grpo/best", "grpo"),
    )
}
"""Each route by name, in reading order."""
ROUTES = tuple(ROUTE)
TRAINED_ROUTES = tuple(name for name, route in ROUTE.items() if route.stage is not None)


def start_model(params: Params, name: str) -> str:
    """The route whose model trained route ``name`` starts from: the base model for SFT, else its ``init_model``."""
    param = ROUTE[name].init_model
    if param is None:
        return "base"
    section, key = param.split(".")
    return getattr(getattr(params, section), key)


def prompt_param(name: str) -> str:
    """The dotted param naming the prompt route ``name`` is evaluated with (``sft.prompt`` for the base model)."""
    return f"{ROUTE[name].prompt_section}.prompt"


def evaluation_prompt(params: Params, name: str) -> str:
    """The prompt route ``name`` is evaluated with: :func:`prompt_param`'s value."""
    return getattr(params, ROUTE[name].prompt_section).prompt

"""The report page, section by section: the summary verdict, the run's details, then the test results, the training
curves and example answers (:func:`build_report`).

Inputs, under the reports directory: ``final/metrics.json`` (required: the four routes on the test set, on
each of ``eval.test_sets`` and ``eval.benchmarks`` under the route's ``test_sets`` and ``benchmarks``, and under each
of ``eval.protocols`` the same under ``protocols``), ``download/benchmarks.json`` (each benchmark's records and
contamination), ``final/generations/<route>.jsonl`` (the graded test
answers: the paired test of the two best routes and the example answers), ``final/grader_crosscheck.json`` (the
answers math-verify grades differently from our grader), ``baseline/metrics.json`` (zero-shot, one summary per
prompt), each training stage's ``metrics.json`` (its wall clock) and DVCLive directory ``{sft,ei,grpo}/live``, each
stage's ``cost.json`` (:mod:`reasonrl.cost`), and GRPO's example rollouts ``grpo/live/examples/step_*.json``. Only
the run's own files, each a dependency of the stage, and the environment the stage ran in
(:mod:`reasonrl.report.environment`: date, commit, machine). (Comparing experiments is ``reasonrl.compare``'s,
outside the pipeline: which experiments exist changes with no dependency changing.) A missing optional input turns
its figure or section into a line saying what is missing; a missing required one raises
:class:`~reasonrl.report.inputs.ReportInputError` naming the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.evaluation import paired_comparison
from reasonrl.protocols import slot_summaries
from reasonrl.report.benchmarks import benchmarks_section
from reasonrl.report.costs import cost_section
from reasonrl.report.curves import dynamics_section, grpo_rollouts_section, validation_section, wallclock_section
from reasonrl.report.document import Heading, Link, Note, Paragraph, Report, Table
from reasonrl.report.environment import RunEnvironment
from reasonrl.report.examples import grpo_examples_section, route_examples_section
from reasonrl.report.headline import stage_metrics
from reasonrl.report.inputs import (
    ReportInputError,
    flatten,
    load_generations,
    load_summaries,
    read_params,
    test_set_summaries,
)
from reasonrl.report.sections import (
    accuracy_section,
    baseline_section,
    categories_section,
    extra_test_sets_section,
    grader_section,
)
from reasonrl.report.verdict import significance_sentence, start_sentence, top_two_sentence, two_best
from reasonrl.routes import ROUTE, ROUTES, TRAINED_ROUTES


@dataclass(frozen=True)
class ReportInputs:
    reports_dir: Path
    params_path: Path
    environment: RunEnvironment


TINY_MODEL = ("model.name", "tiny")
SYNTHETIC_DATA = ("data.name", "arithmetic")


def toy_mark(params: Mapping[str, Any]) -> str | None:
    """What makes the run a check of the pipeline rather than a result (``params``: dotted), as the figures mark it:
    the ``tiny`` model (randomly initialised, never pretrained) and the synthetic arithmetic data; None for neither."""
    toy = [text for (key, value), text in ((TINY_MODEL, "tiny model"), (SYNTHETIC_DATA, "synthetic data"))
           if params.get(key) == value]  # fmt: skip
    return ", ".join(toy) or None


def model_parameters(params: Mapping[str, Any], sft_metrics: Mapping[str, Any]) -> int | None:
    """The model's size: the parameters SFT trained, all of them without LoRA; None with LoRA or unrecorded."""
    return sft_metrics.get("trainable_parameters") if params.get("sft.lora_rank") == 0 else None


def toy_note(params: Mapping[str, Any], parameters: int | None) -> str:
    """Why the numbers of a toy run (:func:`toy_mark`) are no finding."""
    parts = []
    if params.get(TINY_MODEL[0]) == TINY_MODEL[1]:
        size = "" if parameters is None else f" of {parameters / 1e6:.2f} M parameters"
        parts.append(f"the base model is `tiny`, a randomly initialised model{size} that was never pretrained")
    if params.get(SYNTHETIC_DATA[0]) == SYNTHETIC_DATA[1]:
        parts.append("the problems are synthetic arithmetic, not GSM8K")
    return (
        "this run checks the pipeline, not the methods: " + "; ".join(parts) + ". A base accuracy near zero and "
        "tiny p-values (SFT against the base model above all) are what any working pipeline gives on it; they say "
        "nothing of how these methods do on a real model and data."
    )


def summary_section(
    report: Report, final: dict[str, dict[str, Any]], generations: Mapping[str, list | None], generations_dir: Path
) -> None:
    """The verdict: the best route and whether the paired test on their graded answers (``generations``, read from
    ``generations_dir``) separates it from the second, then each route against the model it started from."""
    report.blocks.append(Heading(2, "Summary"))
    best, second = two_best(final)
    paired = None
    if generations[best] is not None and generations[second] is not None:
        try:
            paired = paired_comparison(generations[best], generations[second])
        except ValueError as error:
            raise ReportInputError(f"{generations_dir}: {best}.jsonl against {second}.jsonl: {error}") from None
    missing = [f"`{(generations_dir / f'{r}.jsonl').as_posix()}`" for r in (best, second) if generations[r] is None]
    sentences = [top_two_sentence(final, paired, f"{', '.join(missing)} missing")]
    if start := start_sentence(final):
        sentences.append(start)
    tests = sum("paired" in summary for summary in final.values()) + (paired is not None)
    sentences.append(significance_sentence(tests))
    report.blocks.append(Paragraph(" ".join(sentences)))


def plain(value: Any) -> str:
    """A param's value as params.yaml writes it: ``null``, ``true``, ``2e-05``, ``[q_proj, k_proj]``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(plain(item) for item in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def duration(seconds: float | None) -> str:
    """``"1 h 02 min"``, ``"3 min 12 s"``, ``"45 s"``; ``"not recorded"`` for None."""
    if seconds is None:
        return "not recorded"
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


KEY_PARAMS = {
    "eval": ("temperature", "max_tokens", "num_examples", "samples_per_question"),
    "sft": ("learning_rate", "batch_size", "epochs", "max_steps", "num_examples", "lora_rank"),
    "ei": ("init_model", "n_steps", "questions_per_step", "num_rollouts", "learning_rate"),
    "grpo": ("init_model", "n_grpo_steps", "learning_rate", "rollout_batch_size", "group_size", "train_batch_size",
             "loss_type", "use_std_normalization", "kl_coef", "dynamic_sampling", "max_staleness"),
}  # fmt: skip
"""The params the run details list, by section; every param is in params.yaml (and the model cards)."""


def run_details_section(
    report: Report, params: Mapping[str, Any], environment: RunEnvironment, stages: Mapping[str, Mapping[str, Any]]
) -> None:
    """When, where and with what the run was made: the report's date, commit and machine, the model and data, each
    training stage's wall clock (``stages``: their ``metrics.json``) and the key params."""
    report.blocks.append(Heading(2, "Run details"))
    data = params.get("data.name")
    sizes = f"{params.get('data.arithmetic.train_size')} train / {params.get('data.arithmetic.test_size')} test"
    described = {"arithmetic": f"synthetic arithmetic word problems ({sizes})", "gsm8k": "GSM8K"}
    clocks = ", ".join(f"{route.upper()} {duration(stages[route].get('wall_clock_seconds'))}" for route in stages)
    rows = [
        [
            "model",
            f"`{params.get('model.name')}`" + (" (randomly initialised)" if params.get("model.name") == "tiny" else ""),
        ],
        ["data", described.get(data, f"the user's own (`{params.get('data.jsonl.train.path')}`)")],
        ["validation questions", plain(params.get("data.val_size"))],
        ["rendered", environment.rendered_at],
        ["git commit", f"`{environment.commit}`"],
        ["machine", environment.machine()],
        ["wall clock per training stage", clocks],
    ]
    report.blocks.append(Table(["", "this run"], rows))
    settings = [
        [section, " · ".join(f"`{key}` {plain(params.get(f'{section}.{key}'))}" for key in keys)]
        for section, keys in KEY_PARAMS.items()
    ]
    report.blocks.append(Table(["params", "key values (all of them: params.yaml)"], settings))
    report.blocks.append(
        Paragraph(
            "Rendered, git commit and machine: where the report stage ran (for `make demo`, the machine and commit "
            "of every stage). Wall clock: each training stage's `metrics.json`."
        )
    )


def route_generations(directory: Path, final: Mapping[str, Mapping[str, Any]]) -> dict[str, list | None]:
    """Each route's graded test answers (None where absent); as many as ``final/metrics.json`` counts (``n``), or
    they are another run's."""
    found = {}
    for route, summary in final.items():
        path = directory / f"{route}.jsonl"
        records = load_generations(path)
        if records is not None and len(records) != summary["n"]:
            raise ReportInputError(
                f"{path}: {len(records)} answers, but final/metrics.json counts n = {summary['n']} for {route}: "
                "the two files are not of the same run"
            )
        found[route] = records
    return found


def files_table(generations_dir: Path) -> Table:
    """Each route's model card and graded test answers, linked."""
    rows = []
    for route in ROUTES:
        card = f"{ROUTE[route].model_dir}/README.md"
        answers = (generations_dir / f"{route}.jsonl").as_posix()
        rows.append([route, Link(card, card) if route in TRAINED_ROUTES else "— (not trained)", Link(answers, answers)])
    return Table(["route", "model card", "graded test answers"], rows)


def build_report(inputs: ReportInputs) -> Report:
    """Read every input, draw the figures and assemble the document."""
    reports = Path(inputs.reports_dir)
    final_path = reports / "final" / "metrics.json"
    final = load_summaries(final_path, required=ROUTES)
    final = {route: final[route] for route in ROUTES}
    live = {route: reports / ROUTE[route].reports_dir / "live" for route in TRAINED_ROUTES}
    stages = {route: stage_metrics(reports / ROUTE[route].reports_dir / "metrics.json") for route in TRAINED_ROUTES}
    generations_dir = reports / "final" / "generations"
    generations = route_generations(generations_dir, final)
    params = flatten(read_params(inputs.params_path))
    mark = toy_mark(params)

    report = Report()
    report.blocks.append(Heading(1, "reasonrl report: zero-shot, SFT, expert iteration and GRPO"))
    summary_section(report, final, generations, generations_dir)
    if mark:
        report.blocks.append(Note(toy_note(params, model_parameters(params, stages["sft"]))))
    run_details_section(report, params, inputs.environment, stages)
    report.blocks.append(Paragraph("Each route's model card and its graded test answers, one JSON object per line:"))
    report.blocks.append(files_table(generations_dir))
    accuracy_section(report, final, final_path, mark)
    if sets := test_set_summaries(final, final_path):
        extra_test_sets_section(report, sets, final_path)
    try:
        slots = slot_summaries(final)
    except ValueError as error:
        raise ReportInputError(f"{final_path}: {error}") from None
    benchmarks_section(report, slots, params, final_path, reports / "download" / "benchmarks.json")
    validation_section(report, live, mark)
    grpo_rollouts_section(report, live, mark)
    wallclock_section(report, live, mark)
    cost_section(report, reports)
    dynamics_section(report, live, mark)
    categories_section(report, final, mark)
    grader_section(report, final, reports / "final" / "grader_crosscheck.json")
    baseline_section(report, reports / "baseline" / "metrics.json")
    route_examples_section(report, generations, generations_dir)
    grpo_examples_section(report, live["grpo"] / "examples")
    return report

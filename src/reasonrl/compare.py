"""Experiments side by side, against a baseline:
``python -m reasonrl.compare EXP [EXP …] [--against BASELINE] [--out compare.md] [--html compare.html]``, or over
seeds: ``python -m reasonrl.compare --settings SETTING SETTING [SETTING …] [--out …] [--html …]``.

``python -m reasonrl.compare no-baseline`` sets the experiment ``no-baseline`` beside ``demo``, the experiment
``make demo`` records; of several experiments the first is the baseline, unless ``--against`` names one.

Outside the cached pipeline on purpose: which experiments exist, and which ones a reader sets side by side, change
with no dependency of any stage changing, so a cached page of them would go stale (the report stage describes its
own run only). Each experiment is named as DVC users name it: an experiment name, a git revision, or ``workspace``
(the files on disk); it is read as DVC stores it, with ``dvc.api`` (its params and its files at that revision).

The page leads with the params that differ, then each route's test accuracy with its 95% interval, the paired test
of each experiment against the baseline per route (the same test questions and seed; the answers of
``reports/final/generations/<route>.jsonl``); with ``eval.benchmarks``, ``eval.test_sets`` or ``eval.protocols``, a
table per protocol of each set's accuracy per route and experiment and the paired test per set
(:mod:`reasonrl.protocols`); and the routes' validation curves overlaid.

With ``--settings`` it compares settings over their seeds instead, each the experiments ``<setting>-seed<k>`` that
``python -m reasonrl.seeds`` queued: per route the mean ± the between-seed sd, the interval over seeds and questions,
and each setting against the first (Welch's test on seed means, Holm's correction for several, the minimum
detectable difference); :mod:`reasonrl.statistics` holds the methods.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from statistics import stdev
from typing import Any

from reasonrl.cli import run_stage
from reasonrl.data import jsonl_lines
from reasonrl.demo import DEMO
from reasonrl.errors import UserError
from reasonrl.evaluation import paired_comparison, question_accuracies
from reasonrl.markdown import code
from reasonrl.protocols import TEST, UNNAMED_TEST, Slot, protocol_title, slot_summaries
from reasonrl.report.costs import HOURS_UNITS
from reasonrl.report.document import Figure, Heading, Paragraph, Report, Table, render_markdown, write_report
from reasonrl.report.figures import Panel, SeedSpread, plot_panels, seeds_figure
from reasonrl.report.inputs import (
    GRPO_EVALUATION_METRICS,
    flatten,
    join_grpo_evaluations,
    metric_path,
    parse_metric,
)
from reasonrl.report.tables import format_accuracy, interval_name
from reasonrl.routes import ROUTE, ROUTES, TRAINED_ROUTES
from reasonrl.seeds import SEED_PARAMS, parse_experiment_name
from reasonrl.statistics import (
    TEST_MCNEMAR,
    TEST_SIGN_FLIP,
    holm_adjusted,
    minimum_detectable_difference,
    seed_variance_components,
    seeds_and_questions_interval,
    welch_test,
)

WORKSPACE = "workspace"
FINAL_METRICS = "reports/final/metrics.json"
GENERATIONS = "reports/final/generations/{route}.jsonl"
"""The graded answers of the unnamed protocol on the test split; a slot's are in its directory below."""
REPORTS = Path("reports")
SUMMARY_KEYS = {"accuracy", "accuracy_interval"}

TEST_NAMES = {TEST_MCNEMAR: "McNemar exact", TEST_SIGN_FLIP: "exact sign-flip by question"}


class CompareError(UserError):
    """An experiment that cannot be compared: unknown, or missing a file; the message names it."""


class UnknownExperimentError(CompareError):
    """A name that is no experiment, git revision or ``workspace``."""


@dataclass(frozen=True)
class Experiment:
    """What the page shows of one experiment."""

    name: str
    params: dict[str, Any]
    """Dotted params, as ``dvc exp show`` lists them."""
    final: dict[str, dict[str, Any]]
    """Each route's test summary (``reports/final/metrics.json``)."""
    generations: dict[Slot, dict[str, list[dict[str, Any]] | None]]
    """Each route's graded answers in each slot of ``final`` (:func:`reasonrl.protocols.slot_summaries`: the test
    split, test sets and benchmarks under each protocol); None where the file is absent."""
    curves: dict[str, list[tuple[int, float]] | None]
    """Each training route's validation accuracy by its own x (:data:`CURVES`); None where not logged."""
    costs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each trained route's training stage's ``cost.json`` (:mod:`reasonrl.cost`); absent where not written."""


# The x axis of each trained route's validation curve (see read_curve).
CURVES = {"sft": "SFT optimizer step", "ei": "EI round", "grpo": "GRPO step"}


def _rev(name: str) -> str | None:
    return None if name == WORKSPACE else name


def experiment_params(name: str, repo: str | None = None) -> dict[str, Any]:
    """The experiment's params, dotted; an unknown experiment raises :class:`CompareError` naming it. DVC resolves
    the name (``dvc.api.params_show`` takes experiment names as revisions, as ``dvc metrics diff`` does)."""
    import dvc.api
    from dvc.scm import RevError

    try:
        return flatten(dvc.api.params_show(repo=repo, rev=_rev(name)))
    except RevError as error:
        raise UnknownExperimentError(
            f"unknown experiment {name!r}: not an experiment name, a git revision or {WORKSPACE!r} ({error}; "
            "`dvc exp list` lists the experiments)"
        ) from None


def is_experiment(name: str, repo: str | None = None) -> bool:
    """Whether ``name`` names a DVC experiment (not a git revision, not the workspace)."""
    from dvc.repo import Repo
    from dvc.repo.experiments.utils import resolve_name

    with Repo(repo) as dvc_repo:
        return resolve_name(dvc_repo.scm, name)[name] is not None


def no_results(name: str, repo: str | None = None) -> CompareError:
    """Why ``name`` has no test results, and what to run, for the workspace, an experiment or a git revision."""
    if name == WORKSPACE:
        return CompareError(
            f"{WORKSPACE}: no {FINAL_METRICS} on disk: `dvc repro` writes it (or `make demo`, the demo recorded as "
            f"experiment {DEMO!r})"
        )
    if is_experiment(name, repo):
        return CompareError(
            f"experiment {name!r} has no {FINAL_METRICS}: it did not reach the final_eval stage (it failed, is "
            "queued or ran only some stages; `dvc exp show` lists its state)"
        )
    return CompareError(
        f"{name!r} is a git revision without the pipeline's results (its dvc.lock records no {FINAL_METRICS}): "
        f"compare experiments instead: `make demo` records {DEMO!r}, `dvc exp run --name NAME -S key=value` an "
        "ablation, `dvc exp list` lists them"
    )


def _read_text(fs: Any, path: str) -> str | None:
    try:
        return fs.read_text(path, encoding="utf-8")
    except FileNotFoundError:
        return None


def parse_final(text: str, source: str) -> dict[str, dict[str, Any]]:
    """The routes' test summaries; a file that is no JSON or lacks a route raises :class:`CompareError` naming
    ``source``."""
    try:
        final = json.loads(text)
    except json.JSONDecodeError as error:
        raise CompareError(f"{source}: not valid JSON: {error}") from None
    missing = [r for r in ROUTES if not (isinstance(final, dict) and SUMMARY_KEYS <= set(final.get(r) or {}))]
    if missing:
        raise CompareError(f"{source}: no test summary for {', '.join(missing)}")
    return {route: final[route] for route in ROUTES}


def final_slots(final: dict[str, dict[str, Any]], source: str) -> dict[Slot, dict[str, dict[str, Any]]]:
    """:func:`reasonrl.protocols.slot_summaries` of ``final``; a route that lacks another's set or protocol raises
    :class:`CompareError` naming ``source``."""
    try:
        return slot_summaries(final)
    except ValueError as error:
        raise CompareError(f"{source}: {error}") from None


def generations_path(slot: Slot, route: str) -> str:
    """Where ``route``'s graded answers in ``slot`` are: :data:`GENERATIONS` in the slot's directory."""
    name = GENERATIONS.format(route=route)
    return name if not slot.directory else name.replace(f"/{route}.jsonl", f"/{slot.directory}/{route}.jsonl")


def parse_generations(text: str | None) -> list[dict[str, Any]] | None:
    return None if text is None else [json.loads(line) for line in jsonl_lines(text) if line.strip()]


def read_curve(fs: Any, route: str, source: str) -> list[tuple[int, float]] | None:
    """A training route's validation accuracy: SFT by optimizer step, EI by round (DVCLive's step in both), GRPO by
    GRPO step (joined as the report joins it, since GRPO's DVCLive step counts optimizer steps)."""
    live = REPORTS / ROUTE[route].reports_dir / "live"
    if route != "grpo":
        text = _read_text(fs, metric_path(live, "eval/accuracy").as_posix())
        return None if text is None else parse_metric(text, "eval/accuracy", f"{source}: {route}")
    curves = []
    for metric in GRPO_EVALUATION_METRICS:
        text = _read_text(fs, metric_path(live, metric).as_posix())
        curves.append(None if text is None else parse_metric(text, metric, f"{source}: {route}"))
    evaluations = join_grpo_evaluations(*curves)
    return None if evaluations is None else [(e.grpo_step, e.accuracy) for e in evaluations]


def load_experiment(name: str, repo: str | None = None) -> Experiment:
    """Everything the page shows of experiment ``name``, read at its revision through DVC (from the cache for the
    pipeline's outputs)."""
    from dvc.api import DVCFileSystem

    params = experiment_params(name, repo)  # first: it names an unknown experiment
    fs = DVCFileSystem(repo, rev=_rev(name))
    text = _read_text(fs, FINAL_METRICS)
    if text is None:
        raise no_results(name, repo)
    final = parse_final(text, f"{name}: {FINAL_METRICS}")
    generations = {
        slot: {route: parse_generations(_read_text(fs, generations_path(slot, route))) for route in ROUTES}
        for slot in final_slots(final, f"{name}: {FINAL_METRICS}")
    }
    curves = {route: read_curve(fs, route, name) for route in TRAINED_ROUTES}
    return Experiment(name, params, final, generations, curves, read_costs(fs, name))


def read_costs(fs: Any, source: str) -> dict[str, dict[str, Any]]:
    """Each trained route's ``cost.json`` that the experiment holds."""
    costs = {}
    for route in TRAINED_ROUTES:
        path = (REPORTS / ROUTE[route].reports_dir / "cost.json").as_posix()
        if (text := _read_text(fs, path)) is not None:
            try:
                costs[route] = json.loads(text)
            except json.JSONDecodeError as error:
                raise CompareError(f"{source}: {path}: not JSON ({error})") from None
    return costs


_UNSET = object()


def _value(value: Any) -> str:
    """A param value as ``dvc exp show`` prints it, as a code span (escaped whatever it holds)."""
    if value is _UNSET:
        return "—"
    return code(value if isinstance(value, str) else json.dumps(value))


def differing_params(params: Sequence[Mapping[str, Any]]) -> list[str]:
    """The dotted params whose value (or presence) is not the same in every mapping, sorted."""
    keys = sorted({key for p in params for key in p})
    return [key for key in keys if len({json.dumps(p.get(key, _UNSET), default=str) for p in params}) > 1]


def params_table(experiments: Sequence[Experiment]) -> Table | None:
    """One row per param that differs, one column per experiment; None when none differs."""
    keys = differing_params([e.params for e in experiments])
    if not keys:
        return None
    rows = [[code(key), *(_value(e.params.get(key, _UNSET)) for e in experiments)] for key in keys]
    return Table(["param", *(code(e.name) for e in experiments)], rows)


def accuracy_table(experiments: Sequence[Experiment]) -> Table:
    rows = [[route, *(format_accuracy(e.final[route]) for e in experiments)] for route in ROUTES]
    return Table(["route", *(code(e.name) for e in experiments)], rows)


def same_questions(records: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the two evaluations asked the same questions in the same order, as many times each: an index alone
    would pair question 3 of one test split with question 3 of another (e.g. after a ``data`` change)."""
    return [(r["question_index"], r["question"]) for r in records] == [
        (r["question_index"], r["question"]) for r in reference
    ]


def paired_row(route: str, this: Experiment, reference: Experiment, slot: Slot = UNNAMED_TEST) -> list[str]:
    """``this`` against ``reference`` on ``route``'s answers in ``slot`` (by default the test split under
    ``eval.*``): answers right for one only, questions on which each had more right answers, the test and its
    p-value; or why there is no paired test."""
    head = [route, code(this.name), code(reference.name)]
    if missing := [e for e in (this, reference) if slot not in e.generations]:
        return [*head, f"not paired: {code(missing[0].name)} has no {slot.label()}", "—", "—", "—"]
    records, reference_records = this.generations[slot][route], reference.generations[slot][route]
    if records is None or reference_records is None:
        missing_name = (this if records is None else reference).name
        return [*head, f"not paired: no `{generations_path(slot, route)}` in {code(missing_name)}", "—", "—", "—"]
    if not same_questions(records, reference_records):
        questions = "test questions" if slot.kind == TEST else "questions"
        return [*head, f"not paired: different {questions} or samples per question", "—", "—", "—"]
    paired = paired_comparison(records, reference_records)
    same = " (the same answers)" if records == reference_records else ""
    return [
        *head,
        f"{paired['only_this_right']} / {paired['only_reference_right']}{same}",
        f"{paired['questions_this_better']} / {paired['questions_reference_better']}",
        TEST_NAMES[paired["test"]],
        f"{paired['p_value']:.3g}",
    ]


PAIRED_HEADERS = [
    "route",
    "experiment",
    "against",
    "right only in (exp / against)",
    "questions better in (exp / against)",
    "test",
    "p",
]


def paired_table(experiments: Sequence[Experiment]) -> Table:
    """Each experiment after the first against the first (the baseline), route by route."""
    reference = experiments[0]
    return Table(PAIRED_HEADERS, [paired_row(route, this, reference) for this in experiments[1:] for route in ROUTES])


def other_slots(experiments: Sequence[Experiment]) -> dict[str | None, list[Slot]]:
    """Every slot any experiment has beyond the unnamed test split, by protocol (the unnamed one first), in the order
    the experiments list them."""
    slots = dict.fromkeys(slot for e in experiments for slot in e.generations if slot != UNNAMED_TEST)
    grouped: dict[str | None, list[Slot]] = {}
    for slot in sorted(slots, key=lambda slot: slot.protocol is not None):  # stable: the experiments' order within
        grouped.setdefault(slot.protocol, []).append(slot)
    return grouped


def summary_of(experiment: Experiment, slot: Slot, route: str) -> dict[str, Any] | None:
    """``route``'s summary in ``slot`` (:func:`reasonrl.protocols.slot_summaries`), None where it has none."""
    return final_slots(experiment.final, experiment.name).get(slot, {}).get(route)


def slots_accuracy_table(experiments: Sequence[Experiment], slots: Sequence[Slot]) -> Table:
    """Set × route, one column per experiment: accuracy with its interval; — where an experiment lacks the set."""
    rows = []
    for slot in slots:
        for route in ROUTES:
            summaries = [summary_of(e, slot, route) for e in experiments]
            rows.append([code(slot.set_name), route, *("—" if s is None else format_accuracy(s) for s in summaries)])
    return Table(["set", "route", *(code(e.name) for e in experiments)], rows)


def slots_paired_table(experiments: Sequence[Experiment], slots: Sequence[Slot]) -> Table:
    """Set × route × experiment: each experiment after the first against the first, on the same set."""
    reference = experiments[0]
    rows = [
        [code(slot.set_name), *paired_row(route, this, reference, slot)]
        for slot in slots
        for this in experiments[1:]
        for route in ROUTES
    ]
    return Table(["set", *PAIRED_HEADERS], rows)


def protocols_section(report: Report, experiments: Sequence[Experiment]) -> None:
    """Per protocol, the benchmarks and test sets (and the test split under a named protocol): accuracy of every
    experiment, and the paired test per set against the baseline; nothing when no experiment has any."""
    grouped = other_slots(experiments)
    if not grouped:
        return
    report.blocks.append(Heading(2, "Benchmarks and protocols"))
    for protocol, slots in grouped.items():
        owner = next(e for e in experiments if slots[0] in e.generations)
        summary = next(iter(final_slots(owner.final, owner.name)[slots[0]].values()))
        report.blocks.append(Heading(3, protocol_title(protocol, summary, owner.params)))
        report.blocks.append(slots_accuracy_table(experiments, slots))
        report.blocks.append(slots_paired_table(experiments, slots))
    report.blocks.append(
        Paragraph(
            f"From `{FINAL_METRICS}` of each experiment (each route's `test_sets`, `benchmarks` and `protocols`) and "
            "the graded answers under `reports/final/generations/` (`benchmarks/<name>/`, `protocols/<name>/`): "
            "accuracy (avg@k with several samples) with its 95% interval, and the paired test of each experiment "
            "against the baseline on the same set, as above. A protocol's settings are its first experiment's; "
            "where they differ, the params table above says so."
        )
    )


def curves_panels(experiments: Sequence[Experiment]) -> list[Panel]:
    """One panel per training route, one curve per experiment that logged it."""
    return [
        Panel(
            route.upper(),
            CURVES[route],
            "validation accuracy",
            {e.name: curve for e in experiments if (curve := e.curves[route])},
        )
        for route in TRAINED_ROUTES
    ]


def cost_panels(experiments: Sequence[Experiment]) -> list[Panel]:
    """One panel per training route: each experiment's test accuracy against its training stage's device-hours."""
    units = sorted({cost["device_hours_unit"] for e in experiments for cost in e.costs.values()})
    xlabel = f"device-hours ({', '.join(HOURS_UNITS[unit] for unit in units) or 'none recorded'})"
    return [
        Panel(
            route.upper(),
            xlabel,
            "test accuracy",
            {
                e.name: [(e.costs[route]["device_hours"], e.final[route]["accuracy"])]
                for e in experiments
                if route in e.costs
            },
            integer_x=False,
        )
        for route in TRAINED_ROUTES
    ]


def cost_figure(report: Report, experiments: Sequence[Experiment]) -> None:
    """Accuracy against cost, as a figure of :func:`cost_panels`, or a line saying why there is none."""
    report.blocks.append(Heading(2, "Test accuracy against training cost"))
    if not any(e.costs for e in experiments):
        report.blocks.append(Paragraph("Not available: no experiment holds a training stage's `cost.json`."))
        return
    report.figures["accuracy_vs_cost.png"] = plot_panels(cost_panels(experiments), "Test accuracy against cost")
    report.blocks.append(
        Figure(
            "accuracy_vs_cost.png",
            "Each experiment's test accuracy per training route against the device-hours its training stage took "
            "(`reports/<stage>/cost.json`: GPUs × hours on CUDA, CPU cores × hours on the CPU); an experiment "
            "without the file is left out.",
        )
    )


def build_comparison(experiments: Sequence[Experiment], figures: bool = True) -> Report:
    """The page of the baseline (the first experiment) and the others: changed params, test accuracy, paired tests,
    and (``figures``) the validation curves and the test accuracy against training cost."""
    if len(experiments) < 2:
        raise CompareError("compare needs a baseline and at least one experiment")
    report = Report()
    names = ", ".join(code(e.name) for e in experiments[1:])
    report.blocks.append(Heading(1, f"Experiments compared with {code(experiments[0].name)}: {names}"))

    report.blocks.append(Heading(2, "Params that differ"))
    table = params_table(experiments)
    report.blocks.append(table or Paragraph("None: every experiment has the same params."))

    report.blocks.append(Heading(2, "Test accuracy per route"))
    report.blocks.append(accuracy_table(experiments))
    summaries = {f"{e.name}/{route}": e.final[route] for e in experiments for route in ROUTES}
    report.blocks.append(
        Paragraph(f"From `{FINAL_METRICS}` of each experiment: accuracy with its {interval_name(summaries)}.")
    )

    report.blocks.append(Heading(2, f"Paired tests against {code(experiments[0].name)}"))
    report.blocks.append(paired_table(experiments))
    report.blocks.append(
        Paragraph(
            "Answer by answer over the same test questions and samples (`reports/final/generations/<route>.jsonl`): "
            "the answers right in the experiment only / in the baseline only, the questions on which each had more "
            "right answers, and the p-value: with one sample per question McNemar's exact test, with several the "
            "exact sign-flip test over the per-question differences in right answers (the samples of a question "
            "are not independent). A route DVC did not rerun has the same answers in both, p = 1."
        )
    )

    protocols_section(report, experiments)

    if figures:
        report.blocks.append(Heading(2, "Validation accuracy during training"))
        report.figures["validation_curves.png"] = plot_panels(curves_panels(experiments), "Validation accuracy")
        report.blocks.append(
            Figure(
                "validation_curves.png",
                "Validation accuracy per training route, one curve per experiment: SFT by optimizer step, EI by "
                "round, GRPO by GRPO step.",
            )
        )
        cost_figure(report, experiments)
    return report


# Settings over seeds (python -m reasonrl.seeds names each experiment <setting>-seed<k>).


@dataclass(frozen=True)
class SettingRoute:
    """One setting's test accuracy on one route over its seeds."""

    setting: str
    accuracies: list[float]
    """Each seed's test accuracy, as ``reports/final/metrics.json`` has it."""
    per_question: list[list[float]] | None
    """Each seed's accuracy per test question (the same questions in every seed); None where a seed's graded answers
    are missing or its questions differ."""

    @property
    def mean(self) -> float:
        return sum(self.accuracies) / len(self.accuracies)

    @property
    def sd(self) -> float:
        """The between-seed standard deviation of the test accuracy."""
        return stdev(self.accuracies)

    @cached_property
    def interval(self) -> tuple[float, float] | None:
        """95% over seeds and questions (:func:`reasonrl.statistics.seeds_and_questions_interval`)."""
        return None if self.per_question is None else seeds_and_questions_interval(self.per_question)


def setting_names(settings: Sequence[str], repo: str | None = None) -> dict[str, list[str]]:
    """Each setting's experiments (``<setting>-seed<k>``, any commit), by seed; a setting with fewer than two
    raises :class:`CompareError`."""
    from dvc.repo import Repo

    with Repo(repo) as dvc_repo:
        names = {name for listed in dvc_repo.experiments.ls(all_commits=True).values() for name, _ in listed}
    grouped = {}
    for setting in settings:
        seeds = sorted(
            (parsed[1], name) for name in names if (parsed := parse_experiment_name(name)) and parsed[0] == setting
        )
        if len(seeds) < 2:
            raise CompareError(
                f"setting {setting!r}: {len(seeds)} experiment(s) named {setting}-seed<k>; comparing over seeds needs "
                f"two at least (`python -m reasonrl.seeds 0 1 2 --name {setting} …` queues them; `dvc exp list` lists "
                "the experiments)"
            )
        grouped[setting] = [name for _, name in seeds]
    return grouped


def check_only_seeds_differ(setting: str, experiments: Sequence[Experiment]) -> None:
    """A setting's experiments must differ in their seed params only; else their spread is not the seed's."""
    if others := [key for key in differing_params([e.params for e in experiments]) if key not in SEED_PARAMS]:
        raise CompareError(
            f"setting {setting!r}: its experiments differ in {', '.join(others)}, not only in the seeds "
            f"({', '.join(SEED_PARAMS)}); queue a setting's seeds with one `python -m reasonrl.seeds` command"
        )


def setting_route(setting: str, experiments: Sequence[Experiment], route: str) -> SettingRoute:
    records = [e.generations.get(UNNAMED_TEST, {}).get(route) for e in experiments]
    paired = all(r is not None for r in records) and all(same_questions(r, records[0]) for r in records)
    per_question = [question_accuracies(r) for r in records] if paired else None
    return SettingRoute(setting, [e.final[route]["accuracy"] for e in experiments], per_question)


def comparison_rows(routes: Mapping[str, Sequence[SettingRoute]]) -> list[dict[str, Any]]:
    """Route by route, each setting after the first against the first: Welch's test on seed accuracies
    (:func:`reasonrl.statistics.welch_test`), Holm's adjustment over the route's comparisons, and the difference
    that test detects with 80% power at level 0.05 for the pair's seeds and questions, from their pooled between-
    and within-seed variances (:func:`reasonrl.statistics.minimum_detectable_difference`; None without
    per-question answers)."""
    rows = []
    for route, settings in routes.items():
        reference, others = settings[0], settings[1:]
        tests = [welch_test(s.accuracies, reference.accuracies) for s in others]
        adjusted = holm_adjusted([t["p_value"] for t in tests])
        for this, test, holm in zip(others, tests, adjusted, strict=True):
            detectable = None
            if this.per_question is not None and reference.per_question is not None:
                components = [seed_variance_components(s.per_question) for s in (this, reference)]
                between, within = (sum(c[i] for c in components) / 2 for i in (0, 1))
                seeds = min(len(this.accuracies), len(reference.accuracies))
                detectable = minimum_detectable_difference(between, within, seeds, len(this.per_question[0]))
            rows.append({"route": route, "setting": this.setting, "against": reference.setting, **test,
                         "holm_p_value": holm, "detectable": detectable})  # fmt: skip
    return rows


def _points(value: float) -> str:
    return f"{100 * value:+.1f} pts"


def settings_accuracy_table(routes: Mapping[str, Sequence[SettingRoute]]) -> Table:
    rows = []
    for route, settings in routes.items():
        for s in settings:
            interval = "—" if (i := s.interval) is None else f"[{100 * i[0]:.1f}, {100 * i[1]:.1f}]%"
            seeds = ", ".join(f"{100 * a:.1f}" for a in s.accuracies)
            rows.append([route, code(s.setting), str(len(s.accuracies)), f"{100 * s.mean:.1f}% ± {100 * s.sd:.1f}",
                         interval, seeds])  # fmt: skip
    return Table(["route", "setting", "seeds", "mean ± sd", "95% interval (seeds × questions)", "per seed (%)"], rows)


def settings_test_table(rows: Sequence[Mapping[str, Any]], holm: bool) -> Table:
    body = []
    for row in rows:
        no_spread = math.isnan(row["p_value"])
        cells = [
            row["route"], code(row["setting"]), code(row["against"]), _points(row["difference"]),
            "no seed-to-seed spread" if no_spread else f"{row['t']:.2f} ({row['df']:.1f})",
            "—" if no_spread else f"{row['p_value']:.3g}",
        ]  # fmt: skip
        if holm:
            cells.append("—" if no_spread else f"{row['holm_p_value']:.3g}")
        cells.append("—" if no_spread or row["detectable"] is None else f"{100 * row['detectable']:.1f} pts")
        body.append(cells)
    headers = ["route", "setting", "against", "difference", "Welch t (df)", "p"]
    return Table([*headers, *(["p (Holm)"] if holm else []), "detectable (80% power)"], body)


def build_settings_comparison(settings: Mapping[str, Sequence[Experiment]], figures: bool = True) -> Report:
    """The page of settings over their seeds (the first setting is the reference): the params that differ between
    settings, each route's mean ± sd over seeds with its interval over seeds and questions, and each setting
    against the reference with Holm's correction when there are several."""
    if len(settings) < 2:
        raise CompareError("compare --settings needs two settings at least")
    for setting, experiments in settings.items():
        check_only_seeds_differ(setting, experiments)
    names = list(settings)
    report = Report()
    report.blocks.append(Heading(1, f"Settings over seeds: {', '.join(code(n) for n in names)}"))

    report.blocks.append(Heading(2, "Params that differ between settings"))
    firsts = [experiments[0].params for experiments in settings.values()]
    keys = [key for key in differing_params(firsts) if key not in SEED_PARAMS]
    rows = [[code(key), *(_value(p.get(key, _UNSET)) for p in firsts)] for key in keys]
    report.blocks.append(Table(["param", *(code(n) for n in names)], rows) if rows else Paragraph("None."))

    routes = {route: [setting_route(n, settings[n], route) for n in names] for route in ROUTES}
    report.blocks.append(Heading(2, "Test accuracy over seeds"))
    report.blocks.append(settings_accuracy_table(routes))
    report.blocks.append(
        Paragraph(
            "Each seed's test accuracy from its `reports/final/metrics.json`; mean and between-seed standard "
            "deviation over the seeds; the 95% interval of the mean over seeds and over the questions the test set "
            "samples, from each seed's accuracy per question (`reports/final/generations/<route>.jsonl`; — where a "
            "seed lacks them): mean ± √(t²·(seed means' variance) / seeds + t²·(questions' part) / questions), the "
            "seeds' part with the t quantile of seeds − 1 degrees of freedom, the questions' part (how much more the "
            "question means vary than the seed × question noise makes them; every seed answers the same questions, "
            "so the seeds' spread cannot show it) with that of questions − 1. It holds whether seeds or the choice "
            "of questions vary most (simulated coverage 0.95–0.98 with 3 seeds of 500 questions in both; "
            "docs/experiments.md)."
        )
    )

    holm = len(names) > 2
    report.blocks.append(Heading(2, f"Settings against {code(names[0])}"))
    report.blocks.append(settings_test_table(comparison_rows(routes), holm))
    report.blocks.append(
        Paragraph(
            "Difference of mean test accuracy; Welch's t-test on the seeds' accuracies (the seeds are a setting's "
            "independent replicates; each seed's accuracy carries its questions' noise, and the t distribution "
            "accounts for having few seeds, where a permutation test of 3 seeds against 3 cannot go below p = 0.1)"
            + ("; p (Holm): adjusted for the route's comparisons with the reference" if holm else "")
            + ". Detectable: the smallest true difference Welch's test at level 0.05 detects 80% of the time with "
            "this many seeds and questions: its power computed exactly for seed accuracies as variable as the two "
            "settings' between-seed and within-seed (question × seed) variances make them (with 3 seeds 4.3 "
            "standard errors of the difference, where an equal-variance t-test would need 3.7); a smaller one can "
            "be real and missed. A route no seed param changes (e.g. base with a hub model) has no seed-to-seed "
            "spread and no test."
        )
    )
    if figures:
        report.figures["seeds.png"] = seeds_figure(
            {
                route: [SeedSpread(s.setting, s.accuracies, s.interval) for s in spreads]
                for route, spreads in routes.items()
            }
        )
        report.blocks.append(Figure("seeds.png", "Test accuracy per route: each seed (dots), and the mean with its "
                                    "95% interval over seeds and questions (bar)."))  # fmt: skip
    return report


def compare_settings(settings: Sequence[str], out: Path | None, html: Path | None) -> None:
    """``compare --settings``: load each setting's seeds and write or print the page."""
    grouped = setting_names(list(dict.fromkeys(settings)))
    experiments = {setting: [load_experiment(name) for name in names] for setting, names in grouped.items()}
    written = out is not None or html is not None
    report = build_settings_comparison(experiments, figures=written)
    if not written:
        print(render_markdown(report.blocks), end="")
        return
    figures_dir = None if out is None else out.with_name(f"{out.stem}_figures")
    write_report(report, out, html, figures_dir, title="reasonrl: settings compared over seeds")
    print("compare: " + ", ".join(str(path) for path in (out, html) if path is not None))


EXAMPLES = """examples:
  python -m reasonrl.compare no-baseline                                    # no-baseline against demo
  python -m reasonrl.compare reference lr-3e-6 lr-3e-5 --html compare.html  # both against reference
  python -m reasonrl.compare workspace --against no-baseline                # the files on disk against it
  python -m reasonrl.compare --settings reference clip --out compare.md     # settings over their seeds"""


def compared_names(experiments: Sequence[str], against: str | None) -> list[str]:
    """The baseline, then the other experiments, each once. The baseline is ``against``; by default ``demo`` for one
    experiment, the first for several (the page of ``compare reference lr-3e-6 lr-3e-5``)."""
    names = list(dict.fromkeys(experiments))
    if against is None:
        against = DEMO if len(names) == 1 else names[0]
    others = [name for name in names if name != against]
    if not others:
        raise CompareError(f"nothing to compare: {against!r} is the baseline; name another experiment")
    return [against, *others]


def load_baseline(name: str) -> Experiment:
    """The baseline: :func:`load_experiment`, with what to run when the default, ``demo``, is not recorded."""
    try:
        return load_experiment(name)
    except UnknownExperimentError:
        if name != DEMO:
            raise
        raise CompareError(
            f"no experiment named {DEMO!r} to compare against: `make demo` records it; or name another baseline with "
            "--against (`dvc exp list` lists the experiments)"
        ) from None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.compare",
        description="DVC experiments beside a baseline: the params that differ, each route's test accuracy with its\n"
        "95% interval, paired tests per route against the baseline, and (with --out or --html) the validation\n"
        "curves. One experiment is compared with `demo`, which `make demo` records; of several, the first is the\n"
        "baseline; --against names another.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the examples' lines
    )
    parser.add_argument(
        "experiments", nargs="*", metavar="EXP", help=f"experiment name, git revision or {WORKSPACE!r} (the files on "
        "disk)"
    )  # fmt: skip
    parser.add_argument(
        "--against", metavar="BASELINE", help=f"what the others are compared with: experiment name, git revision or "
        f"{WORKSPACE!r} (default: {DEMO} with one EXP, else the first EXP)"
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, help="Markdown page to write; its figures go beside it (compare.md: compare_figures/)"
    )
    parser.add_argument("--html", type=Path, help="self-contained HTML page to write")
    parser.add_argument(
        "--settings", nargs="+", metavar="SETTING", help="compare settings over their seeds instead: the experiments "
        "<SETTING>-seed<k> that `python -m reasonrl.seeds` queued, the first setting the reference"
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.settings:
        if args.experiments or args.against:
            parser.error("--settings compares settings; name no EXP and no --against with it")
        compare_settings(args.settings, args.out, args.html)
        return
    if not args.experiments:
        parser.error("name an experiment to compare (EXP), or settings with --settings")
    against, *names = compared_names(args.experiments, args.against)
    experiments = [load_baseline(against), *(load_experiment(name) for name in names)]
    written = args.out is not None or args.html is not None
    report = build_comparison(experiments, figures=written)
    if not written:
        print(render_markdown(report.blocks), end="")
        return
    figures_dir = None if args.out is None else args.out.with_name(f"{args.out.stem}_figures")
    write_report(report, args.out, args.html, figures_dir, title="reasonrl: experiments compared")
    print("compare: " + ", ".join(str(path) for path in (args.out, args.html) if path is not None))


if __name__ == "__main__":
    run_stage(main)

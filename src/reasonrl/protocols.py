"""What final_eval evaluates and how its results are filed: every held-out set (the test split, each of
``eval.test_sets`` and of ``eval.benchmarks``) under the unnamed protocol of ``eval.*`` and under each of
``eval.protocols``.

Each evaluation has a slot: its protocol (None: the unnamed one), its kind of set and the set's name. The slot names
the directory of its graded answers under ``reports/final/generations`` (``<route>.jsonl`` for the unnamed protocol
on the test split, as before protocols existed; ``benchmarks/svamp/<route>.jsonl``;
``protocols/greedy/benchmarks/svamp/<route>.jsonl``) and the place of its summary in each route's entry of
``reports/final/metrics.json``: the unnamed protocol's test summary is the entry itself, a set's is under
``test_sets`` or ``benchmarks``, and a named protocol's are under ``protocols.<name>`` the same way. Without
``eval.protocols`` and ``eval.benchmarks`` both files are what they were before either existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from reasonrl.benchmarks import BENCHMARKS
from reasonrl.config import EvalConfig, Params
from reasonrl.data import GSM8KExample
from reasonrl.evaluation import EvalResult, EvalTask, add_paired_comparisons
from reasonrl.prompts import ANSWER
from reasonrl.rewards import rewards_for

TEST, TEST_SETS, BENCHMARK_SETS = "test", "test_sets", "benchmarks"
PROTOCOLS = "protocols"
"""The key of the named protocols' results in a route's summary, and their directory of graded answers."""


@dataclass(frozen=True)
class Slot:
    """Where one evaluation (every route on one set under one protocol) is filed."""

    protocol: str | None
    """A name of ``eval.protocols``; None: the unnamed protocol of ``eval.*``."""
    kind: str
    """:data:`TEST`, :data:`TEST_SETS` or :data:`BENCHMARK_SETS`."""
    name: str | None = None
    """The test set's or benchmark's name; None for the test split."""

    @property
    def directory(self) -> str:
        """Its graded answers' directory under the generations directory, ``""`` for the unnamed test split."""
        parts = [] if self.protocol is None else [PROTOCOLS, self.protocol]
        parts += [] if self.kind == TEST else [self.kind, str(self.name)]
        return "/".join(parts)

    @property
    def set_name(self) -> str:
        """The set's name in a table: ``test`` for the test split."""
        return TEST if self.name is None else self.name

    def label(self) -> str:
        """How progress bars and printed results call it: ``svamp (benchmark) under greedy``."""
        where = {TEST: "test", TEST_SETS: f"{self.name} (eval.test_sets)", BENCHMARK_SETS: f"{self.name} (benchmark)"}
        return where[self.kind] + ("" if self.protocol is None else f" under {self.protocol}")

    __str__ = label


UNNAMED_TEST = Slot(None, TEST)
"""The test split under ``eval.*``: the evaluation the pipeline ran before protocols and benchmarks existed."""


def final_tasks(
    params: Params,
    test: list[GSM8KExample],
    test_sets: Mapping[str, list[GSM8KExample]],
    benchmarks: Mapping[str, list[GSM8KExample]],
) -> dict[Slot, EvalTask]:
    """Every evaluation final_eval runs, in order: each protocol (the unnamed one first) on the test split, then each
    test set, then each benchmark (its first ``eval.benchmark_questions``). Every route keeps its own prompt (what
    it trained with); a set with LaTeX answers is graded by math-verify (:func:`reasonrl.rewards.rewards_for`),
    reading a response's answer where the benchmark's ``extraction`` says."""
    formats = {test_set.name: test_set.answer_format for test_set in params.eval.test_sets}
    specs = params.rewards.specs
    sets: list[tuple[Slot, list[GSM8KExample], dict[str, str], str]] = [(Slot(None, TEST), test, specs, ANSWER)]
    sets += [(Slot(None, TEST_SETS, name), examples, rewards_for(formats[name], specs), ANSWER)
             for name, examples in test_sets.items()]  # fmt: skip
    for name, examples in benchmarks.items():
        benchmark = BENCHMARKS[name]  # its answers' format and where math-verify reads a response's answer
        asked = examples[: params.eval.benchmark_questions]
        sets.append((Slot(None, BENCHMARK_SETS, name), asked, rewards_for(benchmark.answer_format, specs),
                     benchmark.extraction))  # fmt: skip
    configs = {None: params.eval} | {name: params.eval.under(p) for name, p in params.eval.protocols.items()}
    return {
        dataclasses.replace(slot, protocol=protocol): EvalTask(examples, config, rewards, extraction)
        for protocol, config in configs.items()
        for slot, examples, rewards, extraction in sets
    }


def add_all_paired_comparisons(results: Mapping[Slot, dict[str, EvalResult]], references: Mapping[str, str]) -> None:
    """Each route against the model it started from (:func:`reasonrl.evaluation.add_paired_comparisons`), in every
    slot: the same questions, samples and seed, so answers pair up."""
    for by_route in results.values():
        add_paired_comparisons(by_route, references)


def route_summaries(results: Mapping[Slot, Mapping[str, EvalResult]], params: Params) -> dict[str, dict[str, Any]]:
    """Each route's entry of ``reports/final/metrics.json``: the unnamed protocol's test summary, its sets under
    ``test_sets`` and ``benchmarks``, and each named protocol's the same way under ``protocols.<name>`` (with its
    settings under ``protocol``)."""
    routes = list(results[Slot(None, TEST)])
    summaries: dict[str, dict[str, Any]] = {route: dict(results[Slot(None, TEST)][route].metrics) for route in routes}
    for protocol, settings in params.eval.protocols.items():
        for route in routes:
            entry = dict(results[Slot(protocol, TEST)][route].metrics) | {"protocol": asdict(settings)}
            summaries[route].setdefault(PROTOCOLS, {})[protocol] = entry
    for slot, by_route in results.items():
        if slot.kind == TEST:
            continue
        for route, result in by_route.items():
            owner = summaries[route] if slot.protocol is None else summaries[route][PROTOCOLS][slot.protocol]
            owner.setdefault(slot.kind, {})[slot.name] = result.metrics
    return summaries


def protocol_summaries(final: Mapping[str, Mapping[str, Any]]) -> dict[str | None, dict[str, dict[str, Any]]]:
    """``reports/final/metrics.json``'s routes (``final``) by protocol: ``{None: final}`` then ``{name: {route:
    summary}}`` for each named protocol, in the file's order."""
    names = list(next(iter(final.values())).get(PROTOCOLS, {}))
    for route, summary in final.items():
        if list(summary.get(PROTOCOLS, {})) != names:
            raise ValueError(
                f"{route}: protocols {list(summary.get(PROTOCOLS, {}))}, expected {names} as the first route has"
            )
    named = {name: {route: summary[PROTOCOLS][name] for route, summary in final.items()} for name in names}
    return {None: dict(final)} | named


def slot_summaries(final: Mapping[str, Mapping[str, Any]]) -> dict[Slot, dict[str, dict[str, Any]]]:
    """Every slot of ``reports/final/metrics.json`` (``final``: its routes) with each route's summary in it: by
    protocol (the unnamed one first), then the test split, each test set and each benchmark, in the file's order.
    A route that lacks a set or protocol the first route has raises ValueError naming both."""
    slots: dict[Slot, dict[str, dict[str, Any]]] = {}
    for protocol, by_route in protocol_summaries(final).items():
        slots[Slot(protocol, TEST)] = dict(by_route)
        for kind in (TEST_SETS, BENCHMARK_SETS):
            names = list(next(iter(by_route.values())).get(kind, {}))
            for route, summary in by_route.items():
                if list(summary.get(kind, {})) != names:
                    raise ValueError(f"{route}: {kind} {list(summary.get(kind, {}))}, expected {names} as the first "
                                     "route has")  # fmt: skip
            for name in names:
                slots[Slot(protocol, kind, name)] = {route: summary[kind][name] for route, summary in by_route.items()}
    return slots


def protocol_title(protocol: str | None, summary: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    """A protocol as tables title it, ``greedy: temperature 0, top-p 1, 1 sample per question``: a named one from one
    of its summaries (``protocol``), the unnamed one (``eval.*``) from the run's dotted ``params``."""
    if protocol is None:
        name, defaults = "eval.*", EvalConfig()  # a params file may leave a param at its default
        keys = ("temperature", "top_p", "samples_per_question")
        settings = [params.get(f"eval.{key}", getattr(defaults, key)) for key in keys]
    else:
        name = protocol
        settings = [summary["protocol"][key] for key in ("temperature", "top_p", "samples")]
    temperature, top_p, samples = settings
    plural = "s" if samples != 1 else ""
    return f"`{name}`: temperature {temperature:g}, top-p {top_p:g}, {samples} sample{plural} per question"

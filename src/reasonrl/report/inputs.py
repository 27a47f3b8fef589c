"""Reading what the other stages wrote: metric summaries, graded test answers, DVCLive curves, example rollouts, the
params file. A missing required input raises :class:`ReportInputError` naming the file; optional ones return None."""

from __future__ import annotations

import bisect
import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.config import parse_yaml
from reasonrl.data import DataFormatError, read_jsonl

EXAMPLES_PER_FILE = 2


class ReportInputError(DataFormatError):
    """A required report input is missing or malformed; the message names the file."""


def load_json(path: Path) -> Any:
    """Read a JSON file; a missing or malformed file raises :class:`ReportInputError` naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportInputError(f"{path}: missing (run the stage that writes it first)") from None
    except json.JSONDecodeError as error:
        raise ReportInputError(f"{path}: not valid JSON: {error}") from None


def load_summaries(path: Path, required: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Read a ``{name: summary}`` file (see ``reasonrl.evaluation.summarize``), checking each summary's keys."""
    data = load_json(path)
    if not isinstance(data, dict):
        raise ReportInputError(f"{path}: expected a mapping of name → evaluation summary")
    missing = [name for name in required if name not in data]
    if missing:
        raise ReportInputError(f"{path}: no summary for {', '.join(missing)}")
    for name, summary in data.items():
        keys = {"n", "accuracy", "format_rate", "categories", "response_length"}
        if not isinstance(summary, dict) or not keys <= summary.keys():
            raise ReportInputError(f"{path}: {name}: expected an evaluation summary with keys {sorted(keys)}")
    return data


def test_set_summaries(final: Mapping[str, Mapping[str, Any]], source: object) -> dict[str, dict[str, dict[str, Any]]]:
    """``{set name: {route: summary}}`` from the routes' ``test_sets`` (``eval.test_sets``, in the file's order);
    every route must have every set."""
    names = list(next(iter(final.values())).get("test_sets", {}))
    sets: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    for route, summary in final.items():
        if list(summary.get("test_sets", {})) != names:
            raise ReportInputError(
                f"{source}: {route}: test_sets {list(summary.get('test_sets', {}))}, "
                f"expected {names} as the first route has"
            )
        for name in names:
            sets[name][route] = summary["test_sets"][name]
    return sets


CROSSCHECK_KEYS = {"question_index", "ground_truth", "answer", "ours_correct", "math_verify_correct"}


def load_crosscheck(path: Path) -> dict[str, list[dict[str, Any]]] | None:
    """Each route's answers that math-verify grades differently from ours (``reasonrl.crosscheck``); None when
    ``path`` is absent."""
    if not Path(path).is_file():
        return None
    data = load_json(path)
    if not isinstance(data, dict):
        raise ReportInputError(f"{path}: expected a mapping of route → list of disagreements")
    for route, disagreements in data.items():
        if not isinstance(disagreements, list) or not all(
            isinstance(d, dict) and CROSSCHECK_KEYS <= d.keys() for d in disagreements
        ):
            raise ReportInputError(
                f"{path}: {route}: expected a list of disagreements with keys {sorted(CROSSCHECK_KEYS)}"
            )
    return data


def metric_path(live_dir: Path, name: str) -> Path:
    """Where DVCLive writes the curve of metric ``name`` (e.g. ``eval/accuracy``) under ``live_dir``."""
    return Path(live_dir) / "plots" / "metrics" / f"{name}.tsv"


def parse_metric(text: str, name: str, source: object) -> list[tuple[int, float]]:
    """The ``(step, value)`` rows of a DVCLive TSV of metric ``name``; ``source`` names the file in errors."""
    rows = list(csv.DictReader(io.StringIO(text), delimiter="\t"))
    column = name.rsplit("/", 1)[-1]
    try:
        return [(int(float(row["step"])), float(row[column])) for row in rows]
    except (KeyError, TypeError, ValueError) as error:
        raise ReportInputError(f"{source}: expected columns step and {column}: {error!r}") from None


def read_metric(live_dir: Path, name: str) -> list[tuple[int, float]] | None:
    """The ``(step, value)`` rows DVCLive logged for metric ``name`` (e.g. ``eval/accuracy``); None if absent."""
    path = metric_path(live_dir, name)
    if not path.is_file():
        return None
    return parse_metric(path.read_text(encoding="utf-8"), name, path)


@dataclass(frozen=True)
class GRPOEvaluation:
    grpo_step: int
    elapsed_seconds: float
    """Cumulative seconds of GRPO steps (rollout, scoring, training, sync) before this evaluation."""
    accuracy: float


def grpo_evaluations(live_dir: Path) -> list[GRPOEvaluation] | None:
    """GRPO's validation accuracy by GRPO step and elapsed time; None when a needed TSV is absent.

    ``run_grpo`` logs ``eval/accuracy``, ``time/elapsed_seconds`` and ``grpo_step`` at the same DVCLive step (the
    optimizer-step count) at each evaluation; ``grpo_step`` is also logged at the end of every GRPO step, with the
    same value when an evaluation follows at that DVCLive step. So the three join on the DVCLive step.
    """
    return join_grpo_evaluations(*(read_metric(live_dir, name) for name in GRPO_EVALUATION_METRICS))


GRPO_EVALUATION_METRICS = ("eval/accuracy", "time/elapsed_seconds", "grpo_step")
"""What :func:`join_grpo_evaluations` joins, in its argument order."""


def join_grpo_evaluations(
    accuracy: list[tuple[int, float]] | None,
    elapsed: list[tuple[int, float]] | None,
    grpo_step: list[tuple[int, float]] | None,
) -> list[GRPOEvaluation] | None:
    """The curves of :data:`GRPO_EVALUATION_METRICS` joined on the DVCLive step; None when one is absent."""
    if accuracy is None or elapsed is None or grpo_step is None:
        return None
    elapsed_at, step_at = dict(elapsed), dict(grpo_step)
    return [
        GRPOEvaluation(int(step_at[step]), elapsed_at[step], value)
        for step, value in accuracy
        if step in elapsed_at and step in step_at
    ]


def grpo_curve(live_dir: Path, name: str) -> list[tuple[int, float]] | None:
    """A curve GRPO logs at every optimizer step (``train/…``, ``rollout/…``), by GRPO step as the validation curve
    counts them (:func:`by_grpo_step`); None when it or ``grpo_step`` is absent."""
    points, grpo_step = read_metric(live_dir, name), read_metric(live_dir, "grpo_step")
    if points is None or grpo_step is None:
        return None
    return by_grpo_step(points, grpo_step)


def by_grpo_step(points: list[tuple[int, float]], grpo_step: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """``points`` logged at DVCLive steps (the optimizer steps) as ``(GRPO step, mean value)``.

    ``run_grpo`` logs ``grpo_step`` (the steps done) at the end of each GRPO step, at the DVCLive step of its last
    optimizer step; an evaluation logs it again at the same DVCLive step with the same value. A row at DVCLive step
    ``d`` belongs to the GRPO step that ends at the first such row at ``d`` or after: the step numbered by the steps
    done before it (that row's value − 1), as the validation after it is numbered by the steps done. The rows of an
    unfinished step (none ends it) are left out."""
    ends = sorted(dict(grpo_step).items())  # DVCLive step → steps done
    end_steps = [step for step, _ in ends]
    sums: dict[int, list[float]] = {}
    for step, value in points:
        at = bisect.bisect_left(end_steps, step)
        if at < len(ends) and ends[at][1] >= 1:
            sums.setdefault(int(ends[at][1]) - 1, []).append(value)
    return [(grpo_index, sum(values) / len(values)) for grpo_index, values in sorted(sums.items())]


def pick_example_files(examples_dir: Path) -> list[Path]:
    """The first, middle and last ``step_*.json`` files (fewer when there are fewer)."""
    files = sorted(Path(examples_dir).glob("step_*.json"))
    if not files:
        return []
    return [files[i] for i in sorted({0, len(files) // 2, len(files) - 1})]


EXAMPLE_KEYS = {"question", "ground_truth", "response", "reward"}
"""What the report shows of an answer: a GRPO example's (``reasonrl.grpo.write_examples``) or a graded test answer's."""
GENERATION_KEYS = EXAMPLE_KEYS | {"question_index"}


def load_examples(path: Path) -> list[dict[str, Any]]:
    """GRPO's validation examples after one step (``step_NNNNNN.json``)."""
    examples = load_json(path)
    if not isinstance(examples, list) or not all(isinstance(e, dict) and EXAMPLE_KEYS <= e.keys() for e in examples):
        raise ReportInputError(f"{path}: expected a list of examples with keys {sorted(EXAMPLE_KEYS)}")
    return examples


def load_generations(path: Path) -> list[dict[str, Any]] | None:
    """A route's graded test answers (``final/generations/<route>.jsonl``, one per line); None when absent."""
    if not Path(path).is_file():
        return None
    records = read_jsonl(path)
    for number, record in enumerate(records, start=1):
        if not isinstance(record, dict) or not GENERATION_KEYS <= record.keys():
            raise ReportInputError(f"{path}:{number}: expected a graded answer with keys {sorted(GENERATION_KEYS)}")
    return records


def read_params(path: Path) -> dict[str, Any]:
    """The raw params file as a mapping."""
    try:
        data = parse_yaml(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportInputError(f"{path}: missing") from None
    return data if isinstance(data, dict) else {}


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"grpo": {"lr": 1}}`` → ``{"grpo.lr": 1}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, f"{name}.")
        else:
            flat[name] = value
    return flat

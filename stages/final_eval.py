"""Stage final_eval: every route's model on the whole test split, identical sampling and seed, each with the prompt
(and that prompt's reward, ``rewards.<prompt>``) it was trained with: ``sft.prompt``, ``ei.prompt`` and ``grpo.prompt``;
the base model with ``sft.prompt``, the prompt SFT starts it on. Then the same on each of ``eval.test_sets`` and
``eval.benchmarks``, reported under the route's ``test_sets`` and ``benchmarks`` (a set with LaTeX answers graded by
math-verify); and all of it again under each of ``eval.protocols``, under the route's ``protocols``
(``reasonrl.protocols``)."""

import time
from pathlib import Path

from transformers import AutoTokenizer

from reasonrl.atomic import atomic_directory, atomic_write_json, atomic_write_jsonl
from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import ConfigError, Params, load_params
from reasonrl.cost import CostLedger, write_cost
from reasonrl.crosscheck import add_grader_crosschecks
from reasonrl.data import DataFormatError, GSM8KExample, load_gsm8k
from reasonrl.evaluation import EvalResult, check_room, evaluate_checkpoints
from reasonrl.models import validate_model_dir
from reasonrl.prompts import check_prompt
from reasonrl.protocols import UNNAMED_TEST, add_all_paired_comparisons, final_tasks, route_summaries
from reasonrl.rollouts.engine import RolloutEngine
from reasonrl.routes import ROUTES, TRAINED_ROUTES, evaluation_prompt, prompt_param, start_model


def parse_models(specs: list[str]) -> dict[str, Path]:
    """``name=directory`` pairs, in order; each directory must hold a model with the first one's tokenizer."""
    models: dict[str, Path] = {}
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not sep or not name or not directory or name in models:
            raise ConfigError(f"--model {spec!r}: expected a new NAME=DIRECTORY")
        models[name] = Path(directory)
        validate_model_dir(models[name])
    # Token ids must mean the same in every model: the engine keeps the first model's tokenizer. (The files
    # themselves may differ: transformers rewrites a tokenizer's pre-tokenizer settings when it saves it.)
    vocabularies = {name: AutoTokenizer.from_pretrained(directory).get_vocab() for name, directory in models.items()}
    first = next(iter(models))
    for name, directory in models.items():
        if vocabularies[name] != vocabularies[first]:
            raise ConfigError(f"--model {name}={directory}: its vocabulary differs from {models[first]}'s")
    return models


def training_prompts(models: dict[str, Path], params: Params) -> dict[str, str]:
    """The prompt each model trained with (base: the one SFT starts it on)."""
    prompts = {}
    for name in models:
        if name not in ROUTES:
            raise ConfigError(f"--model {name}=...: NAME must be one of {', '.join(ROUTES)}, a route's model")
        # read from params.yaml (validated by the params loader), never templated into the command: no shell sees it
        prompts[name] = evaluation_prompt(params, name)
    return prompts


def load_test_sets(directory: Path, names: list[str], param: str) -> dict[str, list[GSM8KExample]]:
    """Each set of ``param`` (``eval.test_sets`` or ``eval.benchmarks``) as the download stage wrote it."""
    paths = {name: directory / f"{name}.jsonl" for name in names}
    for name, path in paths.items():
        if not path.is_file():
            raise DataFormatError(f"{path}: missing, though {param} names {name}; run the download stage")
    return {name: load_gsm8k(path) for name, path in paths.items()}


def print_results(results: dict[str, EvalResult], split: str) -> None:
    for name, result in results.items():
        metrics, interval = result.metrics, result.metrics["accuracy_interval"]
        agreement = metrics.get("grader_agreement")
        print(
            f"{name} ({metrics['prompt']} prompt): {split} accuracy {metrics['accuracy']:.3f} "
            f"[{interval['low']:.3f}, {interval['high']:.3f}] ({interval['method']}, n={metrics['n']} answers to "
            f"{metrics['questions']} questions), format rate {metrics['format_rate']:.3f}"
            + ("" if agreement is None else f", math-verify agrees with the grader on {agreement:.3f}")
        )


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--data", required=True, help="directory with test.jsonl")
    parser.add_argument(
        "--test-sets", required=True, help="directory with one <name>.jsonl per eval.test_sets and eval.benchmarks"
    )
    parser.add_argument("--model", action="append", required=True, help="NAME=DIRECTORY, once per model")
    parser.add_argument("--metrics", required=True, help="metrics JSON to write (one summary per model)")
    parser.add_argument(
        "--generations", required=True, help="directory for one <name>.jsonl per model (per set and protocol below it)"
    )
    parser.add_argument(
        "--crosscheck", required=True, help="JSON to write: each model's answers math-verify grades differently"
    )
    parser.add_argument("--cost", required=True, help="cost JSON to write (reasonrl.cost)")
    args = parser.parse_args()
    started = time.perf_counter()
    params = load_params(args.params)
    models = parse_models(args.model)
    prompts = training_prompts(models, params)
    first = next(iter(models.values()))
    tokenizer = AutoTokenizer.from_pretrained(first)  # the engine's: it renders every model's prompts
    for name, prompt in prompts.items():
        check_prompt(prompt, prompt_param(name), tokenizer, first)
    test = load_gsm8k(Path(args.data) / "test.jsonl")
    test_sets = load_test_sets(Path(args.test_sets), [s.name for s in params.eval.test_sets], "eval.test_sets")
    benchmarks = load_test_sets(Path(args.test_sets), params.eval.benchmarks, "eval.benchmarks")
    tasks = final_tasks(params, test, test_sets, benchmarks)
    check_room(tasks, prompts, tokenizer, params.rollout.max_model_len)

    # One engine for all models: each is loaded into it in place, and every evaluation is seeded alike.
    ledger = CostLedger()
    with ledger.timed("engine_start"):
        engine = RolloutEngine(first, params.rollout)
    with ledger.timed("evaluation"):  # the models' loading into the engine included
        results = evaluate_checkpoints(engine, models, tasks, prompts, seed=params.rollout.seed)
    for by_route in results.values():
        for result in by_route.values():
            ledger.add_tokens("evaluation", "generated", result.tokens)
    # Each route against the model it started from: same questions, samples and seed, so answers pair up.
    add_all_paired_comparisons(results, {route: start_model(params, route) for route in TRAINED_ROUTES})
    # A second, independent grader on every test answer: its disagreements with ours go to the report.
    disagreements = add_grader_crosschecks(results[UNNAMED_TEST], tasks[UNNAMED_TEST].rewards)
    with atomic_directory(args.generations) as staging:
        for slot, by_route in results.items():
            directory = staging / slot.directory
            directory.mkdir(parents=True, exist_ok=True)
            for name, result in by_route.items():
                atomic_write_jsonl(directory / f"{name}.jsonl", result.records)
    atomic_write_json(args.crosscheck, disagreements)
    atomic_write_json(args.metrics, route_summaries(results, params))
    write_cost(args.cost, ledger, started, params)
    for slot, by_route in results.items():
        print_results(by_route, slot.label())


if __name__ == "__main__":
    run_stage(main)

"""Stage final_eval: every route's model on the whole test split, identical sampling and seed, each with the prompt
(and reward function) it was trained with: ``sft.prompt``, ``ei.prompt`` and ``grpo.prompt``; the base model with
``sft.prompt``, the prompt SFT starts it on."""

from pathlib import Path

from transformers import AutoTokenizer

from reasonrl.atomic import atomic_directory, atomic_write_json, atomic_write_jsonl
from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import ConfigError, Params, load_params
from reasonrl.crosscheck import add_grader_crosschecks
from reasonrl.data import load_gsm8k
from reasonrl.evaluation import add_paired_comparisons, evaluate_checkpoints
from reasonrl.models import validate_model_dir
from reasonrl.prompts import check_prompt
from reasonrl.rollout import RolloutEngine


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


PROMPT_SECTIONS = {"base": "sft", "sft": "sft", "ei": "ei", "grpo": "grpo"}
"""The params section whose ``prompt`` each model is graded with, by the model's name: read from params.yaml
(validated by the params loader), never templated into the command, where a shell would run it."""


def training_prompts(models: dict[str, Path], params: Params) -> dict[str, str]:
    """The prompt each model trained with (base: the one SFT starts it on)."""
    prompts = {}
    for name in models:
        if name not in PROMPT_SECTIONS:
            raise ConfigError(f"--model {name}=...: NAME must be one of {', '.join(PROMPT_SECTIONS)}, a route's model")
        prompts[name] = getattr(params, PROMPT_SECTIONS[name]).prompt
    return prompts


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--data", required=True, help="directory with test.jsonl")
    parser.add_argument("--model", action="append", required=True, help="NAME=DIRECTORY, once per model")
    parser.add_argument("--metrics", required=True, help="metrics JSON to write (one summary per model)")
    parser.add_argument("--generations", required=True, help="directory for one <name>.jsonl per model")
    parser.add_argument(
        "--crosscheck", required=True, help="JSON to write: each model's answers math-verify grades differently"
    )
    args = parser.parse_args()
    params = load_params(args.params)
    models = parse_models(args.model)
    prompts = training_prompts(models, params)
    first = next(iter(models.values()))
    tokenizer = AutoTokenizer.from_pretrained(first)  # the engine's: it renders every model's prompts
    for name, prompt in prompts.items():
        check_prompt(prompt, f"{PROMPT_SECTIONS[name]}.prompt", tokenizer, first)
    test = load_gsm8k(Path(args.data) / "test.jsonl")

    # One engine for all models: each is loaded into it in place, so all share the engine's sampling stream.
    engine = RolloutEngine(first, params.rollout)
    results = evaluate_checkpoints(engine, models, test, prompts, params.eval, seed=params.rollout.seed)
    # Each route against the model it started from: same questions, samples and seed, so answers pair up.
    add_paired_comparisons(results, {"sft": "base", "ei": params.ei.init_model, "grpo": params.grpo.init_model})
    # A second, independent grader on every answer: its disagreements with ours go to the report.
    disagreements = add_grader_crosschecks(results)
    with atomic_directory(args.generations) as staging:
        for name, result in results.items():
            atomic_write_jsonl(staging / f"{name}.jsonl", result.records)
    atomic_write_json(args.crosscheck, disagreements)
    atomic_write_json(args.metrics, {name: result.metrics for name, result in results.items()})
    for name, result in results.items():
        metrics, interval = result.metrics, result.metrics["accuracy_interval"]
        print(
            f"{name} ({metrics['prompt']} prompt): test accuracy {metrics['accuracy']:.3f} "
            f"[{interval['low']:.3f}, {interval['high']:.3f}] ({interval['method']}, n={metrics['n']} answers to "
            f"{metrics['questions']} questions), format rate {metrics['format_rate']:.3f}, math-verify agrees with the "
            f"grader on {metrics['grader_agreement']:.3f}"
        )


if __name__ == "__main__":
    run_stage(main)

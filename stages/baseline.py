"""Stage baseline: zero-shot test accuracy of the base model, once per prompt of ``baseline.prompts``."""

import time
from pathlib import Path

from reasonrl.atomic import atomic_directory, atomic_write_json, atomic_write_jsonl
from reasonrl.cli import run_stage, stage_parser
from reasonrl.config import load_params
from reasonrl.cost import CostLedger, write_cost
from reasonrl.data import load_gsm8k
from reasonrl.evaluation import evaluate
from reasonrl.models import load_tokenizer
from reasonrl.prompts import check_prompt
from reasonrl.rollouts.engine import RolloutEngine


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--model", required=True, help="base model directory")
    parser.add_argument("--data", required=True, help="directory with test.jsonl")
    parser.add_argument("--metrics", required=True, help="metrics JSON to write")
    parser.add_argument("--generations", required=True, help="directory for one <prompt>.jsonl per prompt")
    parser.add_argument("--cost", required=True, help="cost JSON to write (reasonrl.cost)")
    args = parser.parse_args()
    started = time.perf_counter()
    params = load_params(args.params)
    test = load_gsm8k(Path(args.data) / "test.jsonl")

    tokenizer = load_tokenizer(args.model)
    for name in params.baseline.prompts:
        check_prompt(name, "baseline.prompts", tokenizer, args.model)
    ledger = CostLedger()
    with ledger.timed("engine_start"):
        engine = RolloutEngine(args.model, params.rollout)
    with ledger.timed("evaluation"):
        results = {
            name: evaluate(engine, test, name, params.eval, progress=name, rewards=params.rewards.specs)
            for name in params.baseline.prompts
        }
    for result in results.values():
        ledger.add_tokens("evaluation", "generated", result.tokens)
    with atomic_directory(args.generations) as staging:
        for name, result in results.items():
            atomic_write_jsonl(staging / f"{name}.jsonl", result.records)
    atomic_write_json(args.metrics, {name: result.metrics for name, result in results.items()})
    write_cost(args.cost, ledger, started, params)
    for name, result in results.items():
        print(f"{name}: accuracy {result.metrics['accuracy']:.3f}, format rate {result.metrics['format_rate']:.3f}")


if __name__ == "__main__":
    run_stage(main)

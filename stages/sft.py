"""Stage sft: fine-tune the base model on SFT pairs; keep the checkpoint with the best validation accuracy.
Resumable."""

import time
from pathlib import Path

from reasonrl.cli import open_live, run_stage, stage_parser
from reasonrl.config import ConfigError, load_params
from reasonrl.data import load_gsm8k, read_jsonl
from reasonrl.model_card import SFT_PAIRS, VALIDATION_SPLIT, DataFile
from reasonrl.sft import Pair, run_sft
from reasonrl.training.checkpoints import kept_directory
from reasonrl.training.stage import SavedModel, run_training_stage


def load_pairs(path: Path, num_examples: int | None) -> list[Pair]:
    pairs = [Pair(record["prompt"], record["response"]) for record in read_jsonl(path)]
    if not pairs:
        raise ConfigError(
            f"sft.dataset: {path} holds no SFT pairs (reports/filter_cots/stats.json counts why each was dropped); "
            "train data without reasoning (answer_format: number) leaves filtered empty: use sft.dataset: full"
        )
    if num_examples is not None and num_examples > len(pairs):
        raise ConfigError(f"sft.num_examples: asks for {num_examples} pairs but {path} has {len(pairs)}")
    return pairs[:num_examples]


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--model", required=True, help="base model directory")
    parser.add_argument("--pairs", required=True, help="directory with full.jsonl and filtered.jsonl")
    parser.add_argument("--data", required=True, help="directory with val.jsonl")
    parser.add_argument("--out", required=True, help="output model directory (best checkpoint)")
    parser.add_argument("--checkpoints", required=True, help="resumable checkpoints (kept between runs)")
    parser.add_argument("--kept", required=True, help="policies kept every sft.keep_every steps (kept between runs)")
    parser.add_argument("--metrics", required=True, help="summary metrics JSON to write")
    parser.add_argument("--cost", required=True, help="cost JSON to write (reasonrl.cost)")
    parser.add_argument("--live", required=True, help="DVCLive directory for the curves")
    args = parser.parse_args()
    started = time.perf_counter()
    params = load_params(args.params)
    config = params.sft
    pairs_file, val_file = Path(args.pairs) / f"{config.dataset}.jsonl", Path(args.data) / "val.jsonl"
    pairs = load_pairs(pairs_file, config.num_examples)
    val = load_gsm8k(val_file)

    def run(engine, policy, tokenizer, keep, ledger):
        return run_sft(
            policy,
            tokenizer,
            pairs,
            config,
            engine,
            val,
            params.eval,
            open_live=lambda resume: open_live(args.live, resume, monitor_system=params.rollout.on_gpu),
            live_dir=Path(args.live),
            checkpoint_dir=Path(args.checkpoints),
            init_model_dir=args.model,
            keep=keep,
            rewards=params.rewards.specs,
            ledger=ledger,
        )

    best = run_training_stage(
        params,
        "sft",
        args.model,
        [DataFile(pairs_file, SFT_PAIRS[config.dataset]), DataFile(val_file, VALIDATION_SPLIT)],
        run,
        [SavedModel(Path(args.out), "the step with the best validation accuracy")],
        params_file=args.params,
        checkpoints=args.checkpoints,
        metrics=args.metrics,
        cost=args.cost,
        started=started,
        kept=kept_directory(args.kept) if config.cadence.keep_every else None,
        kept_unit="optimizer step",
        summary={"train_pairs": len(pairs)},
    )
    print(f"sft: best validation accuracy {best.accuracy:.3f} at step {best.step}; saved to {args.out}")


if __name__ == "__main__":
    run_stage(main)
